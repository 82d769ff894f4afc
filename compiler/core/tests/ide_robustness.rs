//! The editor's document-change path never panics or hangs: random edits of
//! the kind typing makes (template and string delimiters, brackets, half
//! references, deletions, arbitrary characters) applied one after another to
//! the examples, each followed by what `flow-lsp` runs after an edit (the
//! check that gives diagnostics) and on requests (completion, hover,
//! definition, references, outline, semantic tokens) at random offsets.
//!
//! Each case runs on its own thread with a deadline, so that a hang fails the
//! test with the edits that caused it instead of stalling the suite.

use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::time::Duration;

use flow_compiler::codes::Code;
use flow_compiler::diagnostic::FileId;
use flow_compiler::{Checked, SourceLoader, ide};
use proptest::prelude::*;

/// What an author types: the pieces of templates, references and blocks that
/// leave a document half-written.
const FRAGMENTS: &[&str] = &[
    "{{",
    "}}",
    "step.",
    "\"",
    "\"\"\"",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ".",
    "?.",
    "??",
    "\n",
    "step x = ",
    "workflow_input.",
    "loop_item.",
    "loop.",
    "if ",
    "for ",
    " as ",
    "//",
    "/*",
    "*/",
    "\\",
    ": ",
    ",",
    "é",
    "🦀",
];

#[derive(Debug, Clone)]
enum Edit {
    Insert { at: f64, text: String },
    Delete { at: f64, len: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (0.0f64..=1.0, proptest::sample::select(FRAGMENTS))
            .prop_map(|(at, text)| Edit::Insert { at, text: text.to_string() }),
        2 => (0.0f64..=1.0, 1usize..40).prop_map(|(at, len)| Edit::Delete { at, len }),
        1 => (0.0f64..=1.0, proptest::collection::vec(any::<char>(), 1..6))
            .prop_map(|(at, chars)| Edit::Insert { at, text: chars.into_iter().collect() }),
    ]
}

/// The largest char boundary of `text` at or before `fraction` of its length.
fn boundary(text: &str, fraction: f64) -> usize {
    let mut at = ((text.len() as f64) * fraction) as usize;
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &mut String, edit: &Edit) {
    match edit {
        Edit::Insert { at, text: inserted } => {
            let at = boundary(text, *at);
            text.insert_str(at, inserted);
        }
        Edit::Delete { at, len } => {
            let start = boundary(text, *at);
            let mut end = (start + len).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(start..end, "");
        }
    }
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("examples/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "flow"))
        .collect();
    paths.sort();
    paths
}

/// The open buffer for the root, the disk for its imports: what the server's
/// loader does.
struct Buffer<'a> {
    root: &'a str,
    text: &'a str,
}

impl SourceLoader for Buffer<'_> {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        if path == self.root {
            Ok(self.text.as_bytes().to_vec())
        } else {
            std::fs::read(path).map_err(|e| flow_compiler::LoadFailure::unreadable(e.to_string()))
        }
    }
}

fn check(root: &str, text: &str) -> Checked {
    flow_compiler::check(root, &Buffer { root, text }).expect("the root is the buffer")
}

/// Everything the server asks of the compiler at `offset`.
fn query(root: &str, checked: &Checked, offset: u32) {
    let found = ide::completions(checked, offset, &mut |repaired| {
        std::sync::Arc::new(check(root, repaired))
    });
    let text = &checked.file(FileId(0)).text;
    assert!(
        found.replace.start <= found.replace.end && found.replace.end as usize <= text.len(),
        "completion replaces {:?} in a text of {} bytes",
        found.replace,
        text.len()
    );
    // The server answers completion in a half-typed reference or string
    // without checking the text first: it must be certainly broken there.
    if ide::half_typed(text, offset) {
        assert!(
            checked
                .diagnostics
                .iter()
                .any(|d| d.primary.file == FileId(0)
                    && matches!(d.code, Code::Syntax | Code::Template | Code::TooDeep)),
            "half-typed at {offset} but no syntax error in {text:?}"
        );
    }
    if let Some(hover) = ide::hover(checked, FileId(0), offset) {
        assert!(!hover.markdown.is_empty());
    }
    let _ = ide::definition(checked, FileId(0), offset);
    if let Some(signature) = ide::signature_help(checked, offset) {
        for (start, end) in &signature.parameters {
            assert!(
                signature
                    .label
                    .get(*start as usize..*end as usize)
                    .is_some()
            );
        }
    }
    if let Some((symbol, _)) = ide::symbol_at(checked, FileId(0), offset) {
        let _ = ide::references(checked, &symbol);
    }
}

fn session(which: usize, edits: Vec<Edit>, cursors: Vec<f64>) {
    let paths = examples();
    let path = &paths[which % paths.len()];
    let root = path.to_str().expect("a UTF-8 path").to_string();
    let mut text = std::fs::read_to_string(path).expect("readable example");
    for edit in &edits {
        apply(&mut text, edit);
        // Diagnostics, as published after the edit.
        let checked = check(&root, &text);
        for diagnostic in &checked.diagnostics {
            if diagnostic.primary.file == FileId(0) {
                assert!(diagnostic.primary.span.end as usize <= text.len());
            }
        }
        let _ = ide::document_symbols(&checked, FileId(0));
        // Tokens are sorted, apart and within the text; every fix applies.
        let mut end = 0;
        for token in ide::semantic_tokens(&checked, FileId(0)) {
            assert!(token.span.start >= end && token.span.end as usize <= text.len());
            end = token.span.end;
        }
        let whole = flow_compiler::Span::new(0, text.len());
        for fix in ide::quick_fixes(&checked, FileId(0), whole) {
            let _ = ide::apply(&text, &fix);
        }
        let _ = ide::inlay_hints(&checked, whole);
        let _ = ide::matching_symbols(&checked.files[0].tree, "a");
        for &cursor in &cursors {
            // Any byte offset up to the end, char boundary or not: the server
            // converts editor positions, and a query must not trust them.
            query(&root, &checked, ((text.len() as f64) * cursor) as u32);
        }
    }
}

/// Runs `session` with a deadline; debug builds check an example in a few
/// milliseconds, so 20 s is a hang, not a slow machine.
fn bounded(which: usize, edits: Vec<Edit>, cursors: Vec<f64>) {
    let (done, finished) = channel();
    let described = format!("{edits:?} at {cursors:?}");
    let worker = std::thread::spawn(move || {
        session(which, edits, cursors);
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => worker.join().expect("the session finished"),
        // The sender was dropped without sending: the session panicked.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("example {which} hung after the edits {described}")
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn typing_into_the_examples(
        which in 0usize..8,
        edits in proptest::collection::vec(edit(), 1..10),
        cursors in proptest::collection::vec(0.0f64..=1.0, 1..4),
    ) {
        bounded(which, edits, cursors);
    }
}

/// The loader serves the examples' imports from disk: unedited, every example
/// checks clean, so the fuzzed sessions start from fully resolved programs.
#[test]
fn the_unedited_examples_check_clean() {
    for path in examples() {
        let root = path.to_str().expect("a UTF-8 path");
        let text = std::fs::read_to_string(&path).expect("readable example");
        let checked = check(root, &text);
        assert!(
            checked.diagnostics.is_empty(),
            "{root}: {:?}",
            checked.diagnostics
        );
        assert!(checked.files.len() > 1 || !text.contains("import "));
    }
}

/// Regression: completion in 4,000 open `{` overflowed the stack of
/// `flow-lsp`'s worker threads (2 MiB, as here) and aborted the server;
/// `flowc check` of the same text reports the nesting limit. Every query
/// at the end of text nested past the limit, in each kind of bracket and
/// inside a workflow, answers on such a thread.
#[test]
fn queries_in_text_nested_past_the_limit_do_not_overflow_the_stack() {
    let mut texts = Vec::new();
    for depth in [3_000, 4_000, 20_000] {
        for open in ["{", "[", "(", "{{", "{ a: ", "[{"] {
            texts.push(open.repeat(depth));
            texts.push(format!(
                "workflow w {{\n  step a = r {}",
                open.repeat(depth)
            ));
            texts.push(format!(
                "workflow w {{\n  step a = r {{ a: \"{}",
                open.repeat(depth)
            ));
        }
        texts.push(format!("workflow w {{\n{}", "if true {\n".repeat(depth)));
        texts.push(format!("workflow w {{\n{}", "for x as l {\n".repeat(depth)));
    }
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            for text in texts {
                let checked = check("deep.flow", &text);
                let whole = flow_compiler::Span::new(0, text.len());
                let _ = ide::document_symbols(&checked, FileId(0));
                let _ = ide::semantic_tokens(&checked, FileId(0));
                let _ = ide::inlay_hints(&checked, whole);
                for fix in ide::quick_fixes(&checked, FileId(0), whole) {
                    let _ = ide::apply(&text, &fix);
                }
                for offset in [text.len(), text.len() / 2] {
                    query("deep.flow", &checked, offset as u32);
                }
            }
        })
        .expect("a thread");
    worker.join().expect("no query overflowed the stack");
}
