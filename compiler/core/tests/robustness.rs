//! Parse + check never panic or hang, whatever the bytes: random input,
//! truncations and byte-level mutations of the examples.

use proptest::prelude::*;

fn example_sources() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut sources: Vec<String> = std::fs::read_dir(dir)
        .expect("examples/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "flow"))
        .map(|p| std::fs::read_to_string(p).expect("readable example"))
        .collect();
    sources.sort();
    sources
}

/// Checks bytes the way a driver would, and lowers when there is no error;
/// whatever lowers is a plan that reads back and validates. The examples'
/// files are there to import, so that a mutated example is checked past its
/// imports.
fn check_bytes(bytes: &[u8]) {
    struct One<'b>(&'b [u8]);
    impl flow_compiler::SourceLoader for One<'_> {
        fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
            if path == "fuzz.flow" {
                return Ok(self.0.to_vec());
            }
            if path.split('/').any(|part| part == ".." || part.is_empty()) {
                return Err(flow_compiler::LoadFailure::unreadable("not found"));
            }
            let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
            std::fs::read(examples.join(path))
                .map_err(|_| flow_compiler::LoadFailure::unreadable("not found"))
        }
    }
    let checked = flow_compiler::check("fuzz.flow", &One(bytes)).expect("the root loads");
    if !checked.has_errors() {
        let plan = flow_compiler::lower(&checked).expect("no errors, so it lowers");
        assert!(flow_plan::Plan::from_json(&plan.to_json()).is_ok());
        if let Err(problems) = plan.validate() {
            panic!("the compiler wrote a plan that does not validate: {problems}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check_bytes(&bytes);
    }

    #[test]
    fn random_text_from_the_language_alphabet(text in "[a-z_{}()\\[\\].?:,=<>!&|\"\\\\ \n0-9]{0,300}") {
        check_bytes(text.as_bytes());
    }

    #[test]
    fn truncated_examples(which in 0usize..16, cut in 0.0f64..1.0) {
        let sources = example_sources();
        let source = &sources[which % sources.len()];
        let at = (source.len() as f64 * cut) as usize;
        check_bytes(&source.as_bytes()[..at]);
    }

    #[test]
    fn mutated_examples(which in 0usize..16, edits in proptest::collection::vec((0.0f64..1.0, any::<u8>(), 0u8..3), 1..8)) {
        let sources = example_sources();
        let mut bytes = sources[which % sources.len()].as_bytes().to_vec();
        for (position, byte, kind) in edits {
            let at = ((bytes.len() as f64) * position) as usize;
            match kind {
                0 if at < bytes.len() => { bytes[at] = byte; }
                1 => bytes.insert(at.min(bytes.len()), byte),
                _ if at < bytes.len() => { bytes.remove(at); }
                _ => {}
            }
        }
        check_bytes(&bytes);
    }
}

#[test]
fn pathological_nesting_is_refused_not_overflowed() {
    // 128 is the deepest accepted nesting: it must parse and check on a test
    // thread's 2 MiB stack, in a debug build.
    for depth in [127, 128, 1_000, 100_000] {
        let parens = format!(
            "workflow w {{ output {{ x: {}1{} }} }}",
            "(".repeat(depth),
            ")".repeat(depth)
        );
        check_bytes(parens.as_bytes());
        let nots = format!("workflow w {{ output {{ x: {}true }} }}", "!".repeat(depth));
        check_bytes(nots.as_bytes());
        let blocks = format!(
            "workflow w {{ {}{} }}",
            "if true { ".repeat(depth),
            "}".repeat(depth)
        );
        check_bytes(blocks.as_bytes());
        // Regressions found in review: each of these overflowed the stack.
        let chain = format!("workflow w {{ if true{} {{ }} }}", " && true".repeat(depth));
        check_bytes(chain.as_bytes());
        let coalesce = format!(
            "workflow w {{ output {{ x: null{} }} }}",
            " ?? null".repeat(depth)
        );
        check_bytes(coalesce.as_bytes());
        let spaced_lists = format!(
            "type T = {}string{}",
            "list <".repeat(depth),
            ">".repeat(depth)
        );
        check_bytes(spaced_lists.as_bytes());
        let braces_after_comment = format!("workflow w {{\n  x // {}\n}}", "{".repeat(depth));
        check_bytes(braces_after_comment.as_bytes());
        let braces_after_open_string = format!("workflow w {{\n  x \"{}\n}}", "{".repeat(depth));
        check_bytes(braces_after_open_string.as_bytes());
    }
}

/// Regression: a region salvaged as a workflow whose end, less its open
/// brackets, falls inside a character that is not ASCII panicked where the
/// parser keeps what comes before the error (a truncated test file found it).
#[test]
fn a_salvaged_workflow_ending_in_a_wide_character_does_not_panic() {
    // A line starting with `workflow` starts the region the parser
    // salvages; a bracket is left open, and the text ends in `Ü`.
    let text =
        "  workflow w\n  input {\n    a: [\n      {\n    ]\n  }\n  mock recipe r = { title: \"Ü";
    check_bytes(text.as_bytes());
}
