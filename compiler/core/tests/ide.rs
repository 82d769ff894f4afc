//! Fixture tests of the editor queries (`flow_compiler::ide`).
//!
//! Each `.flow` file under `tests/ide/` holds named cases, `--- query name ---`,
//! in the style of rust-analyzer's fixtures: `$0` marks the cursor, and a line
//! `// file: x.flow` starts another file of the case (the root is
//! `main.flow`; a `// file: flow.lock` is the lock beside it). The query is
//! one of `complete`, `hover`, `definition`, `references`,
//! `rename(new_name)`, `symbols`, `find(query)` (workspace symbols),
//! `tokens`, `fixes`, `hints`, `signature`. The result
//! of every case is rendered as text, and each fixture file's results are one
//! insta snapshot, so that a review sees every answer change.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use flow_compiler::diagnostic::{FileId, Span, line_col};
use flow_compiler::ide;
use flow_compiler::{Checked, SourceLoader};

struct Case {
    query: String,
    name: String,
    files: Vec<(String, String)>,
    /// The file and byte offset of `$0`.
    cursor: Option<(usize, u32)>,
}

struct Memory<'c>(&'c [(String, String)]);

impl SourceLoader for Memory<'_> {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        self.0
            .iter()
            .find(|(name, _)| name == path)
            .map(|(_, text)| text.as_bytes().to_vec())
            .ok_or_else(|| flow_compiler::LoadFailure::unreadable("no such file"))
    }
}

fn cases(text: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for line in text.lines() {
        if let Some(header) = line
            .strip_prefix("--- ")
            .and_then(|l| l.strip_suffix(" ---"))
        {
            let (query, name) = header.split_once(' ').unwrap_or((header, ""));
            cases.push(Case {
                query: query.to_string(),
                name: name.to_string(),
                files: vec![("main.flow".to_string(), String::new())],
                cursor: None,
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
        let index = case.files.len() - 1;
        let file = &mut case.files[index].1;
        if let Some(at) = line.find("$0") {
            case.cursor = Some((index, (file.len() + at) as u32));
            file.push_str(&line.replacen("$0", "", 1));
        } else {
            file.push_str(line);
        }
        file.push('\n');
    }
    cases
}

fn position(checked: &Checked, file: FileId, span: Span) -> String {
    let loaded = checked.file(file);
    let (line, column) = line_col(&loaded.text, span.start);
    let text = loaded
        .text
        .get(span.start as usize..span.end as usize)
        .unwrap_or("");
    format!("{}:{line}:{column} `{text}`", loaded.path)
}

/// Checks `files` (the root first) with the case's `flow.lock`, if it has one,
/// as `flow-lsp` checks with the lock beside a file.
fn check(case: &Case, files: &[(String, String)]) -> Checked {
    let lock = case
        .files
        .iter()
        .find(|(name, _)| name == flow_compiler::lock::LOCK_FILE)
        .map(|(_, text)| {
            flow_compiler::lock::ToolLock::from_json(text)
                .unwrap_or_else(|e| panic!("{}: flow.lock: {e}", case.name))
        });
    flow_compiler::check_with_tools("main.flow", &Memory(files), lock.as_ref())
        .expect("main.flow exists")
}

fn run(case: &Case) -> String {
    let checked = check(case, &case.files);
    let (file_index, offset) = case.cursor.unwrap_or((0, 0));
    let file = FileId(file_index as u32);
    let mut out = String::new();
    let query = case.query.as_str();
    match query {
        "complete" => {
            let mut recheck = |text: &str| {
                let mut files = case.files.clone();
                files[0].1 = text.to_string();
                Arc::new(check(case, &files))
            };
            let found = ide::completions(&checked, offset, &mut recheck);
            let _ = writeln!(
                out,
                "replaces {}",
                position(&checked, FileId(0), found.replace)
            );
            for item in &found.items {
                let insert = item
                    .insert
                    .as_deref()
                    .map(|i| format!(" inserts `{i}`"))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{:?} {}: {}{insert}",
                    item.kind, item.label, item.detail
                );
            }
        }
        "hover" => match ide::hover(&checked, file, offset) {
            Some(hover) => {
                let _ = writeln!(
                    out,
                    "on {}\n{}",
                    position(&checked, file, hover.span),
                    hover.markdown
                );
            }
            None => out.push_str("nothing\n"),
        },
        "definition" => match ide::definition(&checked, file, offset) {
            Some((target, span)) => {
                let _ = writeln!(out, "{}", position(&checked, target, span));
            }
            None => out.push_str("nothing\n"),
        },
        "references" => match ide::symbol_at(&checked, file, offset) {
            Some((symbol, _)) => {
                let _ = writeln!(out, "{symbol:?}");
                for (target, span) in ide::references(&checked, &symbol) {
                    let _ = writeln!(out, "  {}", position(&checked, target, span));
                }
            }
            None => out.push_str("nothing\n"),
        },
        _ if query.starts_with("rename(") => {
            let new_name = query.trim_start_matches("rename(").trim_end_matches(')');
            match ide::rename(&checked, file, offset, new_name) {
                Ok((_, edits)) => {
                    for (index, loaded) in checked.files.iter().enumerate() {
                        let mut spans: Vec<Span> = edits
                            .iter()
                            .filter(|(f, _)| f.0 as usize == index)
                            .map(|(_, s)| *s)
                            .collect();
                        if spans.is_empty() {
                            continue;
                        }
                        spans.sort_by_key(|s| std::cmp::Reverse(s.start));
                        let mut text = loaded.text.clone();
                        for span in spans {
                            text.replace_range(span.start as usize..span.end as usize, new_name);
                        }
                        let _ = write!(out, "// {}\n{text}", loaded.path);
                    }
                }
                Err(error) => {
                    let _ = writeln!(out, "refused: {error}");
                }
            }
        }
        "symbols" => {
            fn tree(
                out: &mut String,
                checked: &Checked,
                symbols: &[ide::DocumentSymbol],
                depth: usize,
            ) {
                for symbol in symbols {
                    let (line, _) = line_col(&checked.files[0].text, symbol.span.start);
                    let _ = writeln!(
                        out,
                        "{}{:?} {} ({}) line {line}",
                        "  ".repeat(depth),
                        symbol.kind,
                        symbol.name,
                        symbol.detail
                    );
                    tree(out, checked, &symbol.children, depth + 1);
                }
            }
            tree(
                &mut out,
                &checked,
                &ide::document_symbols(&checked, FileId(0)),
                0,
            );
        }
        "tokens" => {
            for token in ide::semantic_tokens(&checked, FileId(0)) {
                let definition = if token.definition {
                    " (definition)"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "{:?}{definition} {}",
                    token.kind,
                    position(&checked, FileId(0), token.span)
                );
            }
        }
        "fixes" => {
            let whole = Span::new(0, checked.files[0].text.len());
            let text = &checked.files[0].text;
            for fix in ide::quick_fixes(&checked, FileId(0), whole) {
                let first = fix.edits.first().map_or(Span::default(), |e| e.span);
                let _ = writeln!(
                    out,
                    "{} {} at {}",
                    fix.code,
                    fix.title,
                    position(&checked, FileId(0), first)
                );
                // The lines the fix changes, after it, and what the file
                // then still has to say: a fix must not leave a syntax error.
                let fixed = ide::apply(text, &fix);
                let last = fix.edits.iter().map(|e| e.span.end).max().unwrap_or(0) as usize;
                let from = text[..first.start as usize]
                    .rfind('\n')
                    .map_or(0, |i| i + 1);
                let to_before = text[last..].find('\n').map_or(text.len(), |i| last + i);
                let grown = fixed.len() + to_before - text.len();
                let _ = writeln!(
                    out,
                    "  after: {}",
                    fixed.get(from..grown).unwrap_or("?").trim()
                );
                let mut files = case.files.clone();
                files[0].1 = fixed;
                let rechecked = check(case, &files);
                let codes: Vec<&str> = rechecked
                    .diagnostics
                    .iter()
                    .map(|d| d.code.as_str())
                    .collect();
                let _ = writeln!(out, "  then: {codes:?}");
            }
        }
        "hints" => {
            let whole = Span::new(0, checked.files[0].text.len());
            for hint in ide::inlay_hints(&checked, whole) {
                let (line, column) = line_col(&checked.files[0].text, hint.offset);
                let _ = writeln!(out, "{line}:{column} {}", hint.label);
            }
        }
        "signature" => match ide::signature_help(&checked, offset) {
            Some(signature) => {
                let _ = writeln!(out, "{}", signature.label);
                for (index, (start, end)) in signature.parameters.iter().enumerate() {
                    let active = if signature.active == Some(index) {
                        " (active)"
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        "  {}{active}",
                        &signature.label[*start as usize..*end as usize]
                    );
                }
            }
            None => out.push_str("nothing\n"),
        },
        _ if query.starts_with("find(") => {
            let wanted = query.trim_start_matches("find(").trim_end_matches(')');
            for found in ide::matching_symbols(&checked.files[0].tree, wanted) {
                let _ = writeln!(
                    out,
                    "{:?} {} in {:?} at {}",
                    found.kind,
                    found.name,
                    found.container,
                    position(&checked, FileId(0), found.span)
                );
            }
        }
        other => panic!("unknown query `{other}` in case `{}`", case.name),
    }
    out
}

#[test]
fn queries_match_their_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ide");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/ide exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "flow"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("readable fixture");
        let mut rendered = String::new();
        for case in cases(&text) {
            assert!(
                case.cursor.is_some()
                    || matches!(
                        case.query.as_str(),
                        "symbols" | "tokens" | "fixes" | "hints"
                    )
                    || case.query.starts_with("find("),
                "case `{}` needs a `$0` cursor",
                case.name
            );
            let _ = writeln!(
                rendered,
                "--- {} {} ---\n{}",
                case.query,
                case.name,
                run(&case)
            );
        }
        let name = path
            .file_stem()
            .expect("a file name")
            .to_string_lossy()
            .to_string();
        insta::with_settings!({ snapshot_path => "ide/snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(name, rendered);
        });
    }
}
