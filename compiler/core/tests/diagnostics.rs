//! Data-driven checker tests.
//!
//! Every `.flow` file under `tests/diagnostics/` holds named cases separated by
//! `--- name ---` lines. A case may span several files: a line `// file: x.flow`
//! starts another file that the case's root (`main.flow`) can import.
//! Expected diagnostics are written under the line they point at:
//!
//! ```text
//!   step a = r { x: step.clasify.summary }
//!   //                   ^^^^^^^ E101 unknown step
//! ```
//!
//! A case with a `// file: flow.lock` checks against that lock (JSON, as
//! `flowc lock` writes it), as `flowc check` does with the lock beside a file.
//!
//! The carets give the exact columns of the primary label; the code must match;
//! the text after the code, when present, must appear in the message. A case
//! without annotations must check clean. The rendered diagnostics of each
//! fixture file are also kept as an insta snapshot, so that changes to
//! messages, labels and hints show up in review.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use flow_compiler::codes::Code;
use flow_compiler::diagnostic::line_col;
use flow_compiler::{Checked, LoadFailure, SourceLoader};

struct Case {
    name: String,
    /// Virtual files, the root `main.flow` first.
    files: Vec<(String, String)>,
}

struct Memory<'c>(&'c [(String, String)]);

/// A case's files, as a project whose folder is the case's: like the
/// drivers' disk loader (crate `flow-loader`), it refuses a path that leads
/// outside that folder, absolute or climbing out with `..`, before looking.
impl SourceLoader for Memory<'_> {
    fn load(&self, path: &str) -> Result<Vec<u8>, LoadFailure> {
        let normal = flow_compiler::check::normalize(path);
        if normal.starts_with('/') || normal == ".." || normal.starts_with("../") {
            return Err(LoadFailure::OutsideProject {
                reason: "the path leads outside the project folder `.`".to_string(),
                hint: "imports stay inside the project folder".to_string(),
            });
        }
        self.0
            .iter()
            .find(|(name, _)| *name == normal)
            .map(|(_, text)| text.as_bytes().to_vec())
            .ok_or_else(|| LoadFailure::unreadable("no such file"))
    }

    fn lock(&self, path: &str) -> Result<Option<Vec<u8>>, LoadFailure> {
        Ok(self
            .0
            .iter()
            .find(|(name, _)| name == path)
            .map(|(_, text)| text.as_bytes().to_vec()))
    }

    /// The case's `.flow` files and folders directly in `folder`.
    fn list(&self, folder: &str) -> Vec<String> {
        let prefix = match flow_compiler::check::normalize(folder).as_str() {
            "." | "" => String::new(),
            folder => format!("{folder}/"),
        };
        let mut names: Vec<String> = self
            .0
            .iter()
            .filter_map(|(path, _)| path.strip_prefix(&prefix))
            .filter_map(|rest| match rest.split_once('/') {
                Some((dir, _)) => Some(format!("{dir}/")),
                None => rest.ends_with(".flow").then(|| rest.to_string()),
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

fn cases(text: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line
            .strip_prefix("--- ")
            .and_then(|l| l.strip_suffix(" ---"))
        {
            cases.push(Case {
                name: name.to_string(),
                files: vec![("main.flow".to_string(), String::new())],
            });
            continue;
        }
        let Some(case) = cases.last_mut() else {
            continue;
        };
        if let Some(path) = line.strip_prefix("// file: ") {
            case.files.push((path.trim().to_string(), String::new()));
            continue;
        }
        let file = &mut case.files.last_mut().expect("a case has a file").1;
        file.push_str(line);
        file.push('\n');
    }
    cases
}

/// (file, line, start column, end column, code) with 1-based lines and 0-based byte columns.
type Key = (String, usize, usize, usize, String);

fn expected(files: &[(String, String)]) -> BTreeMap<Key, Option<String>> {
    let mut expected = BTreeMap::new();
    for (path, text) in files {
        let mut target = 0;
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let annotation = trimmed
                .strip_prefix("//")
                .map(str::trim_start)
                .filter(|rest| rest.starts_with('^'));
            let Some(rest) = annotation else {
                target = index + 1;
                continue;
            };
            let start = line.find('^').expect("an annotation has carets");
            let end = start + rest.chars().take_while(|c| *c == '^').count();
            let after = rest.trim_start_matches('^').trim();
            let (code, message) = after.split_once(' ').unwrap_or((after, ""));
            let message = (!message.trim().is_empty()).then(|| message.trim().to_string());
            expected.insert(
                (path.clone(), target, start, end, code.to_string()),
                message,
            );
        }
    }
    expected
}

fn actual(checked: &Checked) -> BTreeMap<Key, String> {
    checked
        .diagnostics
        .iter()
        .map(|d| {
            let file = checked.file(d.primary.file);
            let (line, _) = line_col(&file.text, d.primary.span.start);
            let line_start = file.text[..d.primary.span.start as usize]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let start = d.primary.span.start as usize - line_start;
            let line_end = file.text[line_start..]
                .find('\n')
                .map_or(file.text.len(), |i| line_start + i);
            let end = (d.primary.span.end as usize)
                .min(line_end)
                .max(d.primary.span.start as usize + 1)
                - line_start;
            (
                (
                    file.path.clone(),
                    line,
                    start,
                    end,
                    d.code.as_str().to_string(),
                ),
                d.message.clone(),
            )
        })
        .collect()
}

/// A plain rendering for snapshots: position, code, message, labels, hints.
fn render(checked: &Checked) -> String {
    let mut out = String::new();
    for d in &checked.diagnostics {
        let file = checked.file(d.primary.file);
        let (line, column) = line_col(&file.text, d.primary.span.start);
        let _ = writeln!(
            out,
            "{}:{line}:{column}: {} {}: {}",
            file.path,
            d.severity_word(),
            d.code.as_str(),
            d.message
        );
        if !d.primary.message.is_empty() {
            let _ = writeln!(out, "    label: {}", d.primary.message);
        }
        for label in &d.secondary {
            let other = checked.file(label.file);
            let (line, column) = line_col(&other.text, label.span.start);
            let _ = writeln!(
                out,
                "    note: {}:{line}:{column}: {}",
                other.path, label.message
            );
        }
        for hint in &d.hints {
            let _ = writeln!(out, "    help: {hint}");
        }
    }
    out
}

trait SeverityWord {
    fn severity_word(&self) -> &'static str;
}

impl SeverityWord for flow_compiler::Diagnostic {
    fn severity_word(&self) -> &'static str {
        if self.is_error() { "error" } else { "warning" }
    }
}

fn fixture_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/diagnostics exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "flow"))
        .collect();
    files.sort();
    files
}

#[test]
fn fixtures_report_exactly_the_annotated_diagnostics() {
    let mut failures = Vec::new();
    let mut seen_codes = BTreeSet::new();
    let mut snapshots = Vec::new();
    for path in fixture_files() {
        let text = std::fs::read_to_string(&path).expect("readable fixture");
        let mut rendered = String::new();
        for case in cases(&text) {
            // The drivers' one entry point, the case's flow.lock included.
            let checked =
                flow_compiler::check("main.flow", &Memory(&case.files)).expect("main.flow exists");
            let expected = expected(&case.files);
            let actual = actual(&checked);
            for (key, message) in &expected {
                seen_codes.insert(key.4.clone());
                match actual.get(key) {
                    None => failures.push(format!(
                        "{} / {}: missing {:?}",
                        path.display(),
                        case.name,
                        key
                    )),
                    Some(actual_message) => {
                        if let Some(message) = message
                            && !actual_message.contains(message.as_str())
                        {
                            failures.push(format!(
                                "{} / {}: {:?}: message {actual_message:?} does not contain {message:?}",
                                path.display(),
                                case.name,
                                key
                            ));
                        }
                    }
                }
            }
            for (key, message) in &actual {
                if !expected.contains_key(key) {
                    failures.push(format!(
                        "{} / {}: unexpected {:?} {message}",
                        path.display(),
                        case.name,
                        key
                    ));
                }
            }
            let _ = writeln!(rendered, "--- {} ---\n{}", case.name, render(&checked));
        }
        let name = path
            .file_stem()
            .expect("a file name")
            .to_string_lossy()
            .to_string();
        snapshots.push((name, rendered));
    }
    assert!(
        failures.is_empty(),
        "{} fixture mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Snapshots come second: a wrong diagnostic is reported as a fixture
    // mismatch first, which says more than a snapshot diff.
    for (name, rendered) in snapshots {
        insta::with_settings!({ snapshot_path => "diagnostics/snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(name, rendered);
        });
    }
    // E004 needs bytes that a text fixture cannot hold; `invalid_utf8_is_located` covers it.
    seen_codes.insert("E004".to_string());
    let missing: Vec<&str> = Code::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !seen_codes.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a failing fixture case: {missing:?}"
    );
}

/// Guards `check_and_lower`, which reads a program's budgets from the plan
/// it lowers once rather than from a lowering of their own: on every case,
/// the same diagnostics and budgets as `check`, and the same plan as
/// `lower`, exactly when the case has no errors.
#[test]
fn check_and_lower_reports_what_check_does() {
    let mut failures = Vec::new();
    for path in fixture_files() {
        let text = std::fs::read_to_string(&path).expect("readable fixture");
        for case in cases(&text) {
            let place = format!("{} / {}", path.display(), case.name);
            let checked =
                flow_compiler::check("main.flow", &Memory(&case.files)).expect("main.flow exists");
            let (lowered, plan) = flow_compiler::check_and_lower("main.flow", &Memory(&case.files))
                .expect("main.flow exists");
            if render(&lowered) != render(&checked) {
                failures.push(format!("{place}: other diagnostics"));
            }
            if lowered.analysis.budgets != checked.analysis.budgets {
                failures.push(format!("{place}: other budgets"));
            }
            let expected = flow_compiler::lower(&checked).map(|plan| plan.hash);
            if plan.map(|plan| plan.hash) != expected {
                failures.push(format!("{place}: another plan"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_code_is_documented() {
    for code in Code::ALL {
        let info = code.info();
        assert!(
            info.explanation.trim().len() > 40,
            "{} needs an explanation",
            info.code
        );
        assert_eq!(Code::parse(info.code), Some(*code));
        assert_eq!(Code::parse(info.name), Some(*code));
    }
}

/// A file that is not UTF-8 is likely not a flow source, so none of its
/// bytes may be echoed: the diagnostic points at the bad byte and tells
/// where it is in its message, and the file's text keeps only the shape of
/// its lines, blank, so no snippet can show it.
#[test]
fn invalid_utf8_is_located_but_not_echoed() {
    struct Bytes;
    impl SourceLoader for Bytes {
        fn load(&self, _: &str) -> Result<Vec<u8>, LoadFailure> {
            Ok(b"workflow w {\n  step a = \xff\xfe }\n".to_vec())
        }
    }
    let checked = flow_compiler::check("bad.flow", &Bytes).expect("loads");
    assert_eq!(checked.diagnostics.len(), 1, "{:?}", checked.diagnostics);
    let first = &checked.diagnostics[0];
    assert_eq!(first.code, Code::NotUtf8);
    assert_eq!(first.primary.span.start, 24);
    assert!(
        first.message.contains("`bad.flow`")
            && first.message.contains("offset 24 (line 2, column 12)"),
        "{}",
        first.message
    );
    let text = &checked.files[0].text;
    assert_eq!(text.len(), 25);
    assert!(text.chars().all(|c| c == ' ' || c == '\n'), "{text:?}");
    let (line, column) = flow_compiler::diagnostic::line_col(text, first.primary.span.start);
    assert_eq!((line, column), (2, 12));
    assert!(!first.message.contains("step a"), "{}", first.message);
}

/// Every quick fix the checker offers, in every fixture case, mends what it
/// is offered for: applied, the file has one diagnostic of that code fewer
/// and no more syntax errors than before. So a hint's rewrite is valid
/// syntax, and a fix never trades one error for another of its kind.
#[test]
fn every_quick_fix_mends_its_diagnostic() {
    use flow_compiler::diagnostic::{FileId, Span};
    let count = |checked: &Checked, code: &str| {
        checked
            .diagnostics
            .iter()
            .filter(|d| d.primary.file == FileId(0) && d.code.as_str() == code)
            .count()
    };
    let mut failures = Vec::new();
    let mut tried = 0;
    for path in fixture_files() {
        let text = std::fs::read_to_string(&path).expect("readable fixture");
        for case in cases(&text) {
            let checked =
                flow_compiler::check("main.flow", &Memory(&case.files)).expect("main.flow exists");
            let whole = Span::new(0, case.files[0].1.len());
            for fix in flow_compiler::ide::quick_fixes(&checked, FileId(0), whole) {
                tried += 1;
                let mut files = case.files.clone();
                files[0].1 = flow_compiler::ide::apply(&files[0].1, &fix);
                let fixed =
                    flow_compiler::check("main.flow", &Memory(&files)).expect("main.flow exists");
                let syntax = |c: &Checked| count(c, "E001") + count(c, "E002") + count(c, "E003");
                if count(&fixed, fix.code) >= count(&checked, fix.code)
                    || syntax(&fixed) > syntax(&checked)
                {
                    failures.push(format!(
                        "{} / {}: `{}` ({}) leaves:\n{}",
                        path.display(),
                        case.name,
                        fix.title,
                        fix.code,
                        render(&fixed)
                    ));
                }
            }
        }
    }
    assert!(tried > 50, "only {tried} fixes were tried");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
