//! `cargo bench -p flow-lsp --bench lsp`: the language server's latency and
//! memory, measured on the real `flow-lsp` binary over stdio (JSON framing,
//! position conversion and all), on a generated 5,000-line workflow.
//!
//! * diagnostics after an edit: from sending a one-character `didChange` to
//!   receiving that version's `publishDiagnostics`, with the debounce set to
//!   0 (the debounce is a deliberate wait, 40 ms by default, not work);
//! * completion after `{{step.`: request to response, on the clean file (an
//!   existing template) and on a file with a half-typed `"{{step.` at the
//!   cursor (a syntax error, so the server checks a repaired copy, and keeps
//!   it for the next request there);
//! * typing there: a one-character edit after the half-typed `"{{step.`, then
//!   a completion request, from the edit to the list, on a server with the
//!   default debounce and keystrokes 100 ms apart;
//! * the server's resident memory (VmRSS from /proc) after opening the four
//!   examples and the large file, and its peak (VmHWM) at the end.
//!
//! A breakdown in process (check alone, completion alone) says what dominates.
//! `--quick` takes few samples, to show that the benchmark works.
//! The figures go into docs/benchmarks.md (`## flow-lsp`).

#[path = "../tests/client/mod.rs"]
mod client;

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use client::{Client, TempDir};
use serde_json::{Value, json};

const RECIPE: &str = r#"recipe summarize {
  model "default"
  input { text: string, n: int }
  output { summary: string, score: int, tags: list<string>, kind: "short" | "long" }
  prompt """
    Summarize in at most {{input.n}} words:
    {{input.text}}
  """
}

"#;

/// A workflow of at least `lines` lines in the shapes of real ones: chains of
/// step references in templates and expressions, conditions, loops, parallel
/// blocks, multi-line steps with options.
fn workflow(lines: usize) -> String {
    let mut out = String::from(RECIPE);
    out.push_str(
        "workflow big {\n  input { text: string, items: list<{ name: string, url: string }> }\n\n",
    );
    let mut last = String::from("workflow_input.text");
    let mut i = 0;
    while out.lines().count() < lines {
        match i % 6 {
            1 => {
                let _ = writeln!(
                    out,
                    "  if step.s{p}.score >= 3 && step.s{p}.kind == \"long\" {{\n    step s{i} = summarize {{ text: \"{{{{step.s{p}.summary}}}}\", n: 10 }}\n  }}",
                    p = i - 1
                );
            }
            3 => {
                let _ = writeln!(
                    out,
                    "  for workflow_input.items as l{i} concurrency 4 max 50 {{\n    step s{i} = summarize {{ text: \"{{{{loop_item.name}}}} at {{{{loop_item.url}}}}\", n: loop_index }}\n  }}"
                );
            }
            5 => {
                let _ = writeln!(
                    out,
                    "  parallel p{i} {{\n    branch a {{ step s{i} = summarize {{ text: {last}, n: 5 }} }}\n    branch b {{ step t{i} = summarize {{ text: \"{{{{workflow_input.text}}}}\", n: 7 }} }}\n  }}"
                );
                last = format!("step.s{i}.summary");
            }
            _ => {
                let _ = writeln!(
                    out,
                    "  step s{i} = summarize {{\n    text: \"Step {i}: {{{{{last}}}}}\"\n    n: {}\n  }} retry 3 backoff 2s..30s timeout 60s",
                    i % 50
                );
                last = format!("step.s{i}.summary");
            }
        }
        i += 1;
    }
    let _ = writeln!(out, "  output {{ last: {last} }}\n}}");
    out
}

/// The zero-based line and character (ASCII text) of byte `at` of `text`.
fn position(text: &str, at: usize) -> Value {
    let line = text[..at].matches('\n').count();
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    json!({ "line": line, "character": at - start })
}

struct Figures {
    samples: Vec<Duration>,
}

impl Figures {
    fn new() -> Figures {
        Figures {
            samples: Vec::new(),
        }
    }

    fn percentile(&self, p: usize) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
    }

    fn row(&self, case: &str, goal: &str) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {case} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {goal} |",
            self.samples.len(),
            ms(self.percentile(50)),
            ms(self.percentile(99)),
            ms(*self.samples.iter().max().expect("samples"))
        );
    }
}

/// A field of /proc/PID/status, in MB.
fn memory(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc is there");
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("the field is there");
    kb / 1024.0
}

fn completion(client: &mut Client, uri: &str, at: Value) -> (Duration, usize) {
    let start = Instant::now();
    let answer = client.request(
        "textDocument/completion",
        json!({ "textDocument": { "uri": uri }, "position": at }),
    );
    let took = start.elapsed();
    let items = answer["result"]["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no completion list: {answer}"))
        .len();
    (took, items)
}

/// In process: one check of `text` and one completion query, the work the
/// server does per message, without the protocol.
fn breakdown(text: &str, at: usize, runs: usize) -> (Duration, Duration) {
    let check = || flow_compiler::check_source("big.flow", text);
    let mut check_best = Duration::MAX;
    let mut complete_best = Duration::MAX;
    for _ in 0..runs {
        let start = Instant::now();
        let checked = check();
        check_best = check_best.min(start.elapsed());
        let start = Instant::now();
        let found = flow_compiler::ide::completions(&checked, at as u32, &mut |repaired| {
            std::sync::Arc::new(flow_compiler::check_source("big.flow", repaired))
        });
        complete_best = complete_best.min(start.elapsed());
        assert!(!found.items.is_empty());
    }
    (check_best, complete_best)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (edits, requests) = if quick { (10, 10) } else { (300, 500) };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");

    let dir = TempDir::new("bench");
    let text = workflow(5_000);
    let big = dir.write("big.flow", &text);
    // The same file with a half-typed template at the end of a step's text,
    // where an author would be typing: `text: "{{step.`.
    let anchor = text
        .find("  step s600 = summarize {\n")
        .expect("the generator made it");
    let field = anchor + text[anchor..].find("text: ").expect("a text field") + "text: ".len();
    let line_end = field + text[field..].find('\n').expect("a line end");
    let broken = format!("{}\"{{{{step.{}", &text[..field], &text[line_end..]);
    let broken_at = field + "\"{{step.".len();
    let broken_path = dir.write("broken.flow", &broken);
    // A clean cursor: after `{{step.` inside an existing template.
    let clean_at = text[anchor..].find("{{step.").expect("a template") + anchor + "{{step.".len();
    println!(
        "generated: {} lines, {:.2} MB; cursor at line {}",
        text.lines().count(),
        text.len() as f64 / 1e6,
        position(&text, clean_at)["line"]
    );

    let mut client = Client::start_with(&dir.0, json!({ "debounceMs": 0 }));
    let pid = client.pid();
    let mut opened = Vec::new();
    for entry in std::fs::read_dir(&examples).expect("examples/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "flow") {
            let body = std::fs::read_to_string(&path).expect("readable");
            opened.push(client.open(&path.canonicalize().expect("a path"), &body));
        }
    }
    let uri = client.open(&big, &text);
    let broken_uri = client.open(&broken_path, &broken);
    opened.push(uri.clone());
    for opened in &opened {
        let published = client.diagnostics_for(opened, |p| p["version"] == 1);
        assert_eq!(published["diagnostics"], json!([]), "{opened}: {published}");
    }
    let published = client.diagnostics_for(&broken_uri, |p| p["version"] == 1);
    assert!(
        published["diagnostics"]
            .as_array()
            .is_some_and(|d| !d.is_empty())
    );
    let rss_open = memory(pid, "VmRSS:");

    // Diagnostics after an edit: type a character into a string in the
    // middle of the file, then delete it, each a new version.
    let edit_at = position(&text, clean_at - "{{step.".len());
    let mut diagnostics = Figures::new();
    for version in 2..2 + edits {
        let change = if version % 2 == 0 {
            json!({ "range": { "start": edit_at, "end": edit_at }, "text": "x" })
        } else {
            let mut end = edit_at.clone();
            end["character"] = json!(end["character"].as_u64().expect("a number") + 1);
            json!({ "range": { "start": edit_at, "end": end }, "text": "" })
        };
        client.notifications.clear();
        let start = Instant::now();
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [change] }),
        );
        client.diagnostics_for(&uri, |p| p["version"] == version);
        diagnostics.samples.push(start.elapsed());
    }

    let mut clean = Figures::new();
    let mut clean_items = 0;
    for _ in 0..requests {
        let (took, items) = completion(&mut client, &uri, position(&text, clean_at));
        clean.samples.push(took);
        clean_items = items;
    }
    let mut typing = Figures::new();
    let mut typing_items = 0;
    for _ in 0..requests {
        let (took, items) = completion(&mut client, &broken_uri, position(&broken, broken_at));
        typing.samples.push(took);
        typing_items = items;
        client.notifications.clear();
    }
    let rss_end = memory(pid, "VmRSS:");
    let peak = memory(pid, "VmHWM:");
    client.shutdown();

    // Typing: a character typed after the half-typed `"{{step.`, then deleted,
    // each edit followed at once by a completion request, as an editor sends
    // them, and timed from the edit to the list. A server of its own with
    // the default debounce (40 ms), and keystrokes 100 ms apart (a fast
    // typist), so that the debounced checks of the broken file run between
    // keystrokes as they do in an editor.
    let mut client = Client::start_with(&dir.0, json!({}));
    let broken_uri = client.open(&broken_path, &broken);
    client.diagnostics_for(&broken_uri, |p| p["version"] == 1);
    let at = position(&broken, broken_at);
    let mut after = at.clone();
    after["character"] = json!(at["character"].as_u64().expect("a number") + 1);
    let mut typing_edits = Figures::new();
    let mut typing_edit_items = 0;
    for version in 2..2 + edits {
        let (change, cursor) = if version % 2 == 0 {
            (
                json!({ "range": { "start": at, "end": at }, "text": "s" }),
                &after,
            )
        } else {
            (
                json!({ "range": { "start": at, "end": after }, "text": "" }),
                &at,
            )
        };
        let start = Instant::now();
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": broken_uri, "version": version }, "contentChanges": [change] }),
        );
        let (_, items) = completion(&mut client, &broken_uri, cursor.clone());
        typing_edits.samples.push(start.elapsed());
        typing_edit_items = items;
        client.drain(Duration::from_millis(100).saturating_sub(start.elapsed()));
        client.notifications.clear();
    }
    client.shutdown();

    println!("\n| case | samples | p50 | p99 | max | goal |");
    println!("|---|---|---|---|---|---|");
    diagnostics.row("diagnostics after an edit", "p99 ≤ 30 ms");
    clean.row(
        &format!("completion after `{{{{step.`, clean file ({clean_items} items)"),
        "p50 ≤ 5 ms, p99 ≤ 16 ms",
    );
    typing.row(
        &format!("completion after a half-typed `\"{{{{step.` ({typing_items} items)"),
        "p50 ≤ 5 ms, p99 ≤ 16 ms",
    );
    typing_edits.row(
        &format!("typing there: an edit, then completion ({typing_edit_items} items)"),
        "p50 ≤ 5 ms, p99 ≤ 16 ms",
    );
    println!(
        "\nmemory: {rss_open:.1} MB resident after opening the 4 examples, the 5,000-line file and its broken copy; {rss_end:.1} MB at the end, peak {peak:.1} MB (goal ≤ 50 MB)"
    );

    let runs = if quick { 2 } else { 20 };
    let (check, complete) = breakdown(&text, clean_at, runs);
    let (broken_check, broken_complete) = breakdown(&broken, broken_at, runs);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nin process, best of {runs}: check {:.2} ms, completion {:.2} ms (clean); check {:.2} ms, completion with its re-check {:.2} ms (half-typed)",
        ms(check),
        ms(complete),
        ms(broken_check),
        ms(broken_complete)
    );
}
