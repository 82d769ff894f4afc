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
    fn random_text_from_the_language_alphabet(text in "[a-z_{}()\\[\\].?:,=<>!&|\"\\\\ \n0-9+*/-]{0,300}") {
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

/// Regression: a file starting with `-` made the recovery's look for a
/// number of another language (`1e-5`) read before the file's first byte
/// (found by schemathesis through flowd's deploy route: a 500).
#[test]
fn text_around_minus_signs_and_exponents_does_not_panic() {
    for text in [
        "-cT\u{f5}\u{ce}`\u{b2}B\u{c4}\u{8f}\u{3}2\u{d1}\u{18}s",
        "-",
        "-e",
        "e-",
        "1e-",
        "1e-5",
        "0x",
        "workflow w { output { a: -1e-5, b: 0x, c: 1E+ } }",
        "workflow w { timeout 0x1F }",
    ] {
        check_bytes(text.as_bytes());
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

/// A recipe whose output's field `x` is of type `ty`, and a workflow that
/// calls it.
fn uses_as_output(ty: &str) -> String {
    format!(
        "recipe r {{ model \"m\" input {{ a: string }} output {{ x: {ty} }} prompt \"p {{{{input.a}}}}\" }}\nworkflow w {{\n  input {{ q: string }}\n  step a = r {{ a: workflow_input.q }}\n}}\n"
    )
}

/// The errors of checking `source` as the root file, with `files` to import.
fn errors_of(
    source: &str,
    files: &dyn Fn(&str) -> Option<String>,
) -> Vec<flow_compiler::Diagnostic> {
    struct Loader<'a>(&'a str, &'a dyn Fn(&str) -> Option<String>);
    impl flow_compiler::SourceLoader for Loader<'_> {
        fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
            let text = if path == "main.flow" {
                Some(self.0.to_string())
            } else {
                (self.1)(path)
            };
            text.map(String::into_bytes)
                .ok_or_else(|| flow_compiler::LoadFailure::unreadable("not found"))
        }
    }
    let checked =
        flow_compiler::check("main.flow", &Loader(source, files)).expect("the root loads");
    checked
        .diagnostics
        .into_iter()
        .filter(|d| d.is_error())
        .collect()
}

/// Regression: nothing but the parser's bound on brackets limited how deep
/// a type nests through aliases, how often it shares an alias, or how long
/// a chain of imports is. 20,000 aliases each naming the one before, or a
/// thousand files each importing the next, overflowed the checker's stack
/// (an abort, not an error), and forty aliases each naming the one before
/// twice checked clean and had `flowc build` write out a schema of 2^40
/// values. A type past the plan's bounds on schemas is now an error (E212)
/// where it is declared or used, and imports are read without recursion.
#[test]
fn types_and_imports_past_any_plan_are_refused_not_overflowed() {
    let no_imports = |_: &str| None;

    let mut deep = String::from("type D0 = { a: string }\n");
    for i in 1..20_000 {
        deep.push_str(&format!("type D{i} = {{ a: D{} }}\n", i - 1));
    }
    deep.push_str(&uses_as_output("D19999"));
    let errors = errors_of(&deep, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].code.as_str(), "E212");
    assert!(
        errors[0].message.starts_with("type `D12"),
        "{}",
        errors[0].message
    );
    check_bytes(deep.as_bytes());

    let mut wide = String::from("type T0 = { a: string }\n");
    for i in 1..=40 {
        wide.push_str(&format!("type T{i} = {{ a: T{0}, b: T{0} }}\n", i - 1));
    }
    wide.push_str(&uses_as_output("T40"));
    let errors = errors_of(&wide, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].code.as_str(), "E212");
    assert!(errors[0].hints[0].starts_with("each alias a type names"));
    check_bytes(wide.as_bytes());

    // Past the bounds as written, without an alias: the hint says nothing
    // of aliases.
    let fields: Vec<String> = (0..60_000).map(|i| format!("f{i}: string")).collect();
    let written = uses_as_output(&format!("{{ {} }}", fields.join(", ")));
    let errors = errors_of(&written, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].hints,
        ["use `json` for a part that need not be checked"]
    );

    // Each alias within the bounds, the record that uses them past them.
    let mut many = String::from("type T0 = { a: string }\n");
    for i in 1..=10 {
        many.push_str(&format!("type T{i} = {{ a: T{0}, b: T{0} }}\n", i - 1));
    }
    let fields: Vec<String> = (0..100).map(|i| format!("f{i}: T10")).collect();
    many.push_str(&uses_as_output(&format!("{{ {} }}", fields.join(", "))));
    let errors = errors_of(&many, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].message.starts_with("the output of recipe `r`"),
        "{}",
        errors[0].message
    );
    check_bytes(many.as_bytes());

    let chain = |path: &str| {
        let n: usize = path
            .strip_prefix('f')?
            .strip_suffix(".flow")?
            .parse()
            .ok()?;
        let next = if n < 2_000 {
            format!("import \"f{}.flow\"\n", n + 1)
        } else {
            String::new()
        };
        Some(format!("{next}type T{n} = {{ a: string }}\n"))
    };
    let root = format!("import \"f0.flow\"\n{}", uses_as_output("T2000"));
    assert_eq!(errors_of(&root, &chain), Vec::new());
}

/// The checker's bounds on a type's schema are the plan's: at the deepest
/// and the largest a type may be, what checks clean lowers to a plan that
/// validates, and one level or one value more is refused where the type is
/// (E212, "too big for a plan"). Optional fields are not `required`, and
/// are counted so.
#[test]
fn a_type_at_the_bounds_of_schemas_checks_as_its_plan_validates() {
    let no_imports = |_: &str| None;
    // Whatever checks clean lowers to a plan that validates; the rest is
    // refused by the checker's own bound.
    let clean = |source: String| -> bool {
        check_bytes(source.as_bytes());
        let errors = errors_of(&source, &no_imports);
        assert!(
            errors
                .iter()
                .all(|e| e.message.contains("too big for a plan")),
            "{errors:#?}"
        );
        errors.is_empty()
    };
    let deep = |levels: usize| {
        let mut source = String::from("type D0 = { a: string }\n");
        for i in 1..levels {
            source.push_str(&format!("type D{i} = {{ a: D{} }}\n", i - 1));
        }
        source + &uses_as_output(&format!("D{}", levels - 1))
    };
    // The recipe's output `{ x: { f0, ... } }`: 1 + (1 + 2 * fields) + 1
    // values with required fields, 1 + (1 + 3 * fields) + 0 with optional.
    let wide = |fields: usize, ty: &str| {
        let fields: Vec<String> = (0..fields).map(|i| format!("f{i}: {ty}")).collect();
        uses_as_output(&format!("{{ {} }}", fields.join(", ")))
    };
    assert!(clean(deep(126)));
    assert!(!clean(deep(127)));
    assert!(clean(wide(49_998, "string")));
    assert!(!clean(wide(49_999, "string")));
    assert!(clean(wide(33_332, "string?")));
    assert!(!clean(wide(33_333, "string?")));
}

/// Regression: programs of many parts took minutes to check where a part
/// was compared with every other (a union's literals with the ones before
/// it, each workflow's lowering indexing the lines of the whole file, each
/// read of a wide input scanning its fields). A program past the plan's
/// counts is E212 at the first part past them.
#[test]
fn programs_of_many_parts_are_refused_at_the_part_past_the_limit() {
    let no_imports = |_: &str| None;
    let recipe = "recipe r { model \"m\" input { a: string } output { x: string } prompt \"p {{input.a}}\" }\n";
    let mut workflows = recipe.to_string();
    for i in 0..20_000 {
        workflows.push_str(&format!(
            "workflow w{i} {{\n  input {{ q: string }}\n  if workflow_input.q == \"a\" {{\n    step a = r {{ a: workflow_input.q }}\n  }}\n}}\n"
        ));
    }
    let errors = errors_of(&workflows, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].message,
        "20000 workflows; a plan holds at most 10000"
    );
    let span = errors[0].primary.span;
    assert_eq!(&workflows[span.start as usize..span.end as usize], "w10000");

    let literals: Vec<String> = (0..20_000).map(|i| format!("\"v{i}\"")).collect();
    let union = format!(
        "type E = {}\ntype F = {} | \"extra\"\n{}",
        literals.join(" | "),
        literals.join(" | "),
        "recipe r { model \"m\" input { a: F } output { x: E } prompt \"p {{input.a}}\" }\nworkflow w {\n  input { q: E }\n  step a = r { a: workflow_input.q }\n  step b = r { a: step.a.x }\n}\n"
    );
    let errors = errors_of(&union, &no_imports);
    assert!(
        !errors.is_empty() && errors.iter().all(|e| e.code.as_str() == "E212"),
        "{errors:#?}"
    );
    check_bytes(union.as_bytes());

    let fields: Vec<String> = (0..20_000).map(|i| format!("f{i}: string")).collect();
    let outputs: Vec<String> = (0..20_000)
        .map(|i| format!("o{i}: workflow_input.f{i}"))
        .collect();
    let wide = format!(
        "workflow w {{\n  input {{ {} }}\n  output {{ {} }}\n}}\n",
        fields.join(", "),
        outputs.join(", ")
    );
    assert_eq!(errors_of(&wide, &no_imports), Vec::new());
    check_bytes(wide.as_bytes());
}

/// Regression: each misspelt name was measured against every candidate,
/// so 5,000 misspelt recipe names among 5,000 recipes took 34 s to check
/// (release). A workflow's suggestions share a budget: the first are
/// suggested as before, the rest once it is spent only when cut short.
#[test]
fn thousands_of_misspelt_names_share_a_budget_for_suggestions() {
    let no_imports = |_: &str| None;
    let count = 3_000;
    let mut source = String::new();
    for i in 0..count {
        source.push_str(&format!(
            "recipe recipe_number_{i} {{ model \"m\" input {{ a: string }} output {{ x: string }} prompt \"p {{{{input.a}}}}\" }}\n"
        ));
    }
    source.push_str("workflow w {\n  input { q: string }\n");
    for i in 0..count {
        source.push_str(&format!(
            "  step s{i} = recipe_numbr_{i} {{ a: workflow_input.q }}\n"
        ));
    }
    source.push_str("}\n");
    let errors = errors_of(&source, &no_imports);
    assert_eq!(errors.len(), count);
    assert!(errors.iter().all(|e| e.code.as_str() == "E110"));
    assert_eq!(errors[0].fix.as_deref(), Some("recipe_number_0"));
}

/// Regression: past the budget for suggestions, each error still walked
/// every candidate to list the names in scope, and misspelt types, a
/// prompt's inputs and a call's arguments were outside any budget.
/// 5,000 misspelt types among 5,000 aliases took 171 s to check (release),
/// 10,000 misspelt step ids among 20,000 steps 9 s, and a call of 30,000
/// arguments of a recipe whose prompt reads its 30,000 inputs 4.7 s (each
/// argument and reference looked for by a scan). A program's declarations
/// share a budget as each workflow's steps do, listing a hint's names is
/// paid from it, and a spent budget walks no candidate.
#[test]
fn misspelt_types_and_wide_calls_take_time_in_proportion() {
    let no_imports = |_: &str| None;
    let count = 2_000;
    let mut source = String::new();
    for i in 0..count {
        source.push_str(&format!("type Customer_alias_{i:05} = {{ x: string }}\n"));
    }
    for i in 0..count {
        source.push_str(&format!("type Use{i} = {{ y: Customer_alais_{i:05} }}\n"));
    }
    let errors = errors_of(&source, &no_imports);
    assert_eq!(errors.len(), count);
    assert!(errors.iter().all(|e| e.code.as_str() == "E111"));
    // The first are suggested and listed as before; the last, nothing.
    assert_eq!(errors[0].fix.as_deref(), Some("Customer_alias_00000"));
    assert!(
        errors[0]
            .hints
            .iter()
            .any(|h| h.starts_with("the types in scope are"))
    );
    assert!(errors[count - 1].hints.is_empty());

    let inputs: Vec<String> = (0..count).map(|i| format!("in_{i}: string")).collect();
    let prompt: String = (0..count)
        .map(|i| format!("{{{{input.in_{i}}}}} "))
        .collect();
    let args: Vec<String> = (0..count)
        .map(|i| format!("in_{i}: workflow_input.q"))
        .collect();
    let source = format!(
        "recipe r {{ model \"m\" input {{ {} }} output {{ x: string }} prompt \"{prompt}\" }}\nworkflow w {{\n  input {{ q: string }}\n  step s = r {{ {} }}\n}}\n",
        inputs.join(", "),
        args.join(", ")
    );
    assert_eq!(errors_of(&source, &no_imports), []);
}

/// Regression: each type was held to the plan's bounds on its own, so a
/// part named by thousands of types was walked once for each: 20,000
/// aliases each `{ x: Big }`, of a 30,000-field `Big`, took 2.4 s to check
/// (release), an 8 MiB source of that shape about a minute. The sizes
/// measured are kept for the whole check.
#[test]
fn a_part_named_by_many_types_is_measured_once() {
    let no_imports = |_: &str| None;
    let fields: Vec<String> = (0..5_000).map(|i| format!("f_{i}: string")).collect();
    let mut source = format!("type Big = {{ {} }}\n", fields.join(", "));
    for i in 0..5_000 {
        source.push_str(&format!("type A{i} = {{ x: Big, y: list<Big>? }}\n"));
    }
    source.push_str("workflow w {\n  input { a: A4999 }\n}\n");
    assert_eq!(errors_of(&source, &no_imports), []);
}

/// An enum of `count` variants named `{prefix}_{i}`, as a union's text.
fn variants(prefix: &str, count: usize) -> String {
    let literals: Vec<String> = (0..count).map(|i| format!("\"{prefix}_{i}\"")).collect();
    literals.join(" | ")
}

/// Regression: a union copied the variants of each enum it named, so
/// `type U = A | B | …` of a few bytes copied up to a million of them:
/// 2,000 unions of 100 aliases of 1,000 variants (2.4 MB) took over a
/// minute to check. A union past a plan's enum is E212 there, and the
/// variants a program's unions copy together are bounded.
#[test]
fn unions_of_enums_are_bounded_by_what_they_copy() {
    let no_imports = |_: &str| None;
    let mut source = String::new();
    for a in 0..20 {
        source.push_str(&format!(
            "type A{a} = {}\n",
            variants(&format!("v{a}"), 1_000)
        ));
    }
    let all: Vec<String> = (0..20).map(|a| format!("A{a}")).collect();
    // Each copies 20,000 variants, past a plan's 10,000 for one enum.
    let unions = 80;
    for u in 0..unions {
        source.push_str(&format!("type U{u} = {}\n", all.join(" | ")));
    }
    // What each copies: each variant's text and its `String`.
    let copied: usize = (0..20)
        .flat_map(|a| (0..1_000).map(move |i| format!("v{a}_{i}").len() + 24))
        .sum();
    let paid = 32 * 1024 * 1024 / copied;
    let errors = errors_of(&source, &no_imports);
    assert_eq!(errors.len(), unions, "{errors:#?}");
    assert!(errors.iter().all(|e| e.code.as_str() == "E212"));
    assert_eq!(
        errors[0].message,
        "this union has more than 10000 variants; an enum of a plan has at most that"
    );
    // The first copy what the budget pays for; the rest are refused at once.
    let refused = |start: &str| {
        errors
            .iter()
            .filter(|e| e.message.starts_with(start))
            .count()
    };
    assert_eq!(refused("this union has more than 10000 variants"), paid);
    assert_eq!(
        refused(&format!(
            "the program's unions copy more than 32 MiB of variants together: this one copies {copied} bytes"
        )),
        unions - paid
    );
    // A variant is a label of at most a kilobyte, as in a plan.
    let long = format!("type E = \"{}\" | \"b\"\n", "x".repeat(2_000));
    let errors = errors_of(&long, &no_imports);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].message,
        "a variant of 2000 bytes; an enum's variants have at most 1024"
    );

    // A union of what fits is the enum of its variants, once each.
    let source = format!(
        "type A = {}\ntype B = A | \"extra\" | \"v_0\"\nworkflow w {{\n  input {{ b: B }}\n  if workflow_input.b == \"extra\" {{\n    step h = handoff \"t\" {{ subject: \"s\", message: \"m\" }}\n  }}\n}}\n",
        variants("v", 9_999)
    );
    assert_eq!(errors_of(&source, &no_imports), []);
}

/// Regression: each literal compared with an enum scanned its variants,
/// each comparison of two enums scanned one's for each of the other's,
/// each value given where another type was expected compared the two
/// types part by part, and each message about an enum listed every
/// variant. 25,000 wrong literals compared with an enum of 9,999 variants
/// (1.8 MB) ran past a minute towards 2 GB of messages; 40,000 calls
/// giving an enum of 9,999 variants where a wider one is expected took
/// 23 s; 30,000 giving a record of 20,000 fields where another record of
/// those fields is expected, 5 s. A wide enum or record is found in
/// through an index, whether one type fits another is worked out once for
/// each pair of wide types, and messages list a dozen variants.
#[test]
fn wide_enums_and_records_take_time_in_proportion() {
    let no_imports = |_: &str| None;
    let count = 2_000;
    let mut source = format!(
        "type E1 = {}\ntype E2 = E1 | \"z\"\ntype F = {}\n",
        variants("variant", 9_999),
        variants("other", 5_000)
    );
    source.push_str(
        "recipe r { model \"m\" input { a: E2 } output { x: string } prompt \"p {{input.a}}\" }\n",
    );
    source.push_str("workflow w {\n  input { a: E1, f: F }\n");
    for i in 0..count {
        source.push_str(&format!(
            "  step s{i} = r {{ a: workflow_input.a }}\n  if workflow_input.a == \"nope{i}\" || workflow_input.a == workflow_input.f {{\n    step h{i} = handoff \"t\" {{ subject: \"s\", message: \"m\" }}\n  }}\n"
        ));
    }
    source.push_str("}\n");
    let errors = errors_of(&source, &no_imports);
    let not_variants: Vec<_> = errors
        .iter()
        .filter(|e| e.code.as_str() == "E204")
        .collect();
    assert_eq!(not_variants.len(), count, "{:#?}", &errors[..3]);
    assert_eq!(
        not_variants[0].message,
        "\"nope0\" is not a variant: the compared value is one of \"variant_0\", \"variant_1\", \"variant_2\", \"variant_3\", \"variant_4\", \"variant_5\", \"variant_6\", \"variant_7\", \"variant_8\", \"variant_9\", \"variant_10\", \"variant_11\" and 9987 more"
    );
    // Two enums that share no variant are never equal.
    assert_eq!(errors.len(), 2 * count, "{:#?}", errors.last());

    let fields: Vec<String> = (0..5_000).map(|i| format!("field_{i}: string")).collect();
    let fields = fields.join(", ");
    let mut source = format!("type A = {{ {fields} }}\ntype B = {{ {fields} }}\n");
    source.push_str(
        "recipe r { model \"m\" input { a: B } output { x: string } prompt \"p {{input.a}}\" }\n",
    );
    source.push_str("workflow w {\n  input { a: A }\n");
    for i in 0..count {
        source.push_str(&format!("  step s{i} = r {{ a: workflow_input.a }}\n"));
    }
    source.push_str("}\n");
    assert_eq!(errors_of(&source, &no_imports), []);
}

/// Regression: a message showed a type in full and quoted literals whole,
/// and a quick fix filled in every missing input: a call missing a record
/// of 30,000 fields had a message and a fix of half a megabyte each, and
/// thousands of such calls took gigabytes. A type is shown cut at a few
/// hundred characters, any text of a diagnostic at 2,000, and a fix is
/// offered only for a few dozen fields.
#[test]
fn diagnostics_of_wide_types_and_long_literals_are_bounded() {
    let fields: Vec<String> = (0..30_000).map(|i| format!("field_{i}: string")).collect();
    let long = "x".repeat(100_000);
    let source = format!(
        "recipe r {{ model \"m\" input {{ a: {{ {} }} }} output {{ x: string }} prompt \"p {{{{input.a}}}}\" }}\nworkflow w {{\n  input {{ q: \"a\" | \"b\" }}\n  step s = r {{}}\n  step t = r {{ a: workflow_input.q }}\n  if workflow_input.q == \"{long}\" {{\n    step h = handoff \"t\" {{ subject: \"s\", message: \"m\" }}\n  }}\n}}\n",
        fields.join(", ")
    );
    let errors = errors_of(&source, &|_: &str| None);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    for error in &errors {
        let texts = std::iter::once(&error.message)
            .chain(&error.hints)
            .chain(std::iter::once(&error.primary.message));
        for text in texts {
            assert!(text.chars().count() <= 2_000, "{}", text.len());
        }
    }
    let missing = errors
        .iter()
        .find(|e| e.code.as_str() == "E201")
        .expect("a missing input");
    assert!(missing.message.ends_with("… }`"), "{}", missing.message);
    assert!(missing.fixes.is_empty());
    let mismatch = errors
        .iter()
        .find(|e| e.code.as_str() == "E203")
        .expect("a mismatch");
    assert!(
        mismatch
            .message
            .contains("field_0: string, field_1: string"),
        "{}",
        mismatch.message
    );
    assert!(mismatch.message.contains("… }"), "{}", mismatch.message);
}

/// Regression: each call of a recipe indexed its inputs anew and walked
/// them all for the missing ones, a record literal compared each field's
/// name with those before it, a parallel block each branch's, and each
/// call of an MCP tool scanned the lock's tools and built its parameters'
/// types again: 5,000 calls of a recipe of 20,000 optional inputs, a
/// record of 50,000 fields or a block of 20,000 branches each did work in
/// the square of their size. A recipe's inputs keep their index and count
/// of required ones, and names are found through sets.
#[test]
fn calls_records_and_branches_take_time_in_proportion() {
    let no_imports = |_: &str| None;
    let inputs: Vec<String> = (0..20_000).map(|i| format!("in_{i}: string?")).collect();
    let mut source = format!(
        "recipe r {{ model \"m\" input {{ {}, a: json? }} output {{ x: string }} prompt \"p\" }}\nworkflow w {{\n  input {{ q: string }}\n",
        inputs.join(", ")
    );
    for i in 0..5_000 {
        source.push_str(&format!("  step s{i} = r {{}}\n"));
    }
    let fields: Vec<String> = (0..50_000).map(|i| format!("f{i}: \"x\"")).collect();
    source.push_str(&format!(
        "  step wide = r {{ a: {{ {} }} }}\n",
        fields.join(", ")
    ));
    let branches: Vec<String> = (0..20_000)
        .map(|i| format!("    branch b{i} {{ step t{i} = r {{}} }}\n"))
        .collect();
    source.push_str(&format!("  parallel p {{\n{}  }}\n}}\n", branches.concat()));
    assert_eq!(errors_of(&source, &no_imports), []);
}
