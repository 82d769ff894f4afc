//! End-to-end tests of the `flow-lsp` binary, driven over stdio with JSON-RPC.

mod client;

use std::time::Duration;

use client::{Client, TempDir, position};
use serde_json::{Value, json};

const RECIPES: &str = r#"recipe classify {
  model "default"
  input { subject: string }
  output { category: "billing" | "bug", urgency: int }
  prompt "{{input.subject}}"
}
"#;

fn workflow(body: &str) -> String {
    format!(
        "import \"recipes.flow\"\n\nworkflow triage {{\n  input {{ subject: string }}\n{body}}}\n"
    )
}

fn codes(params: &Value) -> Vec<String> {
    params["diagnostics"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|d| d["code"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn diagnostics_match_flowc_and_follow_edits() {
    let dir = TempDir::new("diagnostics");
    dir.write("recipes.flow", RECIPES);
    let text = workflow(
        "  step first = classify { subject: workflow_input.subject }\n  step second = classify { subject: \"{{step.frist.category}}\" }\n",
    );
    let path = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&path, &text);
    let published = client.diagnostics_for(&uri, |p| p["version"] == 1);
    assert_eq!(codes(&published), ["E101"]);
    let diagnostic = &published["diagnostics"][0];
    let message = diagnostic["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unknown step `frist`") && message.contains("did you mean `first`?"),
        "{message}"
    );
    assert_eq!(diagnostic["range"]["start"], position(&text, "frist", 0));
    assert_eq!(diagnostic["source"], "flow");

    // The quick fix replaces the name.
    let actions = client.request(
        "textDocument/codeAction",
        json!({ "textDocument": { "uri": uri }, "range": diagnostic["range"], "context": { "diagnostics": [] } }),
    );
    let edit = &actions["result"][0]["edit"]["changes"][&uri][0];
    assert_eq!(edit["newText"], "first", "{actions}");

    // Two quick edits: only the newer version's diagnostics are published.
    let fixed = text.replace("frist", "first");
    for (version, body) in [(2, text.replace("frist", "fir")), (3, fixed)] {
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [{ "text": body }] }),
        );
    }
    let published = client.diagnostics_for(&uri, |p| p["version"] == 3);
    assert!(codes(&published).is_empty(), "{published}");
    assert!(
        !client
            .notifications
            .iter()
            .any(|n| n["params"]["version"] == 2),
        "a stale version was published"
    );
    client.shutdown();
}

#[test]
fn an_edit_to_an_import_rechecks_its_importers() {
    let dir = TempDir::new("dependants");
    let recipes = dir.write("recipes.flow", RECIPES);
    let text = workflow("  step first = classify { subject: workflow_input.subject }\n");
    let main = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let main_uri = client.open(&main, &text);
    let recipes_uri = client.open(&recipes, RECIPES);
    client.diagnostics_for(&main_uri, |p| {
        p["version"] == 1 && p["diagnostics"] == json!([])
    });
    // Renaming the recipe in the (unsaved) imported buffer breaks the importer.
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": { "uri": recipes_uri, "version": 2 },
            "contentChanges": [{
                "range": { "start": { "line": 0, "character": 7 }, "end": { "line": 0, "character": 15 } },
                "text": "sort"
            }]
        }),
    );
    let published = client.diagnostics_for(&main_uri, |p| {
        !p["diagnostics"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(codes(&published), ["E110"], "{published}");
    client.shutdown();
}

/// A client with `main.flow` open, whose import of `recipes.flow` is not
/// there yet (E113 published), and the document's URI.
fn importing_what_is_not_there(name: &str) -> (TempDir, Client, String) {
    let dir = TempDir::new(name);
    let text = workflow("  step first = classify { subject: workflow_input.subject }\n");
    let main = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let main_uri = client.open(&main, &text);
    let published = client.diagnostics_for(&main_uri, |p| {
        !p["diagnostics"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(
        codes(&published).contains(&"E113".to_string()),
        "{published}"
    );
    (dir, client, main_uri)
}

/// Regression: an import that did not exist yet stayed reported (and its
/// names unknown) after the file appeared on disk, until the importer was
/// edited. A watched file's change checks the open documents again.
#[test]
fn a_file_made_on_disk_is_read_by_what_imports_it() {
    let (dir, mut client, main_uri) = importing_what_is_not_there("watched");
    let recipes = dir.write("recipes.flow", RECIPES);
    client.notify(
        "workspace/didChangeWatchedFiles",
        json!({ "changes": [{ "uri": client::uri(&recipes), "type": 1 }] }),
    );
    client.diagnostics_for(&main_uri, |p| p["diagnostics"] == json!([]));
    client.shutdown();
}

/// A client that watches files for the server is asked to watch the
/// sources and `flow.lock`, and a lock changed on disk is read. Regression
/// (an audit): only `**/*.flow` was watched, and `flowc lock` left E120,
/// W304 and the tools' checks as they were until the next keystroke.
#[test]
fn a_changed_flow_lock_is_watched_and_read() {
    let dir = TempDir::new("watched-lock");
    let text = workflow("  step first = classify { subject: workflow_input.subject }\n");
    dir.write("recipes.flow", RECIPES);
    let main = dir.write("main.flow", &text);
    let mut client = Client::start_watching(&dir.0);
    let registered = client.server_request("client/registerCapability");
    let globs: Vec<&str> = registered["params"]["registrations"][0]["registerOptions"]["watchers"]
        .as_array()
        .expect("watchers")
        .iter()
        .filter_map(|watcher| watcher["globPattern"].as_str())
        .collect();
    assert_eq!(globs, ["**/*.flow", "**/flow.lock"], "{registered}");
    let main_uri = client.open(&main, &text);
    client.diagnostics_for(&main_uri, |p| p["diagnostics"] == json!([]));
    let lock = dir.write("flow.lock", "not a lock");
    client.notify(
        "workspace/didChangeWatchedFiles",
        json!({ "changes": [{ "uri": client::uri(&lock), "type": 1 }] }),
    );
    let published = client.diagnostics_for(&main_uri, |p| {
        !p["diagnostics"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(codes(&published), ["E120"], "{published}");
    client.shutdown();
}

/// Regression (an audit): an import that did not exist, opened as a new
/// buffer (made in the editor, not saved), was not read by what imports it:
/// the importer kept its E113 until it was edited.
#[test]
fn a_missing_import_opened_as_a_buffer_is_read_by_what_imports_it() {
    let (dir, mut client, main_uri) = importing_what_is_not_there("opened-import");
    client.open(&dir.0.join("recipes.flow"), RECIPES);
    client.diagnostics_for(&main_uri, |p| p["diagnostics"] == json!([]));
    client.shutdown();
}

/// The editor confines imports as `flowc check` does, to the workspace
/// folder: a file beside it, `/proc/self/environ` and a symbolic link out
/// are refused (E119), and nothing of them reaches the client.
#[test]
fn an_import_outside_the_workspace_is_refused_and_never_shown() {
    let dir = TempDir::new("confined");
    let project = dir.0.join("project");
    std::fs::create_dir_all(&project).expect("project/ is made");
    dir.write("secret.flow", "TOP_SECRET_MARKER=hunter2\n");
    std::os::unix::fs::symlink("../secret.flow", project.join("link.flow")).expect("a link");
    let text = "import \"../secret.flow\"\nimport \"/proc/self/environ\"\nimport \"link.flow\"\n";
    let main = project.join("main.flow");
    std::fs::write(&main, text).expect("writable");
    let mut client = Client::start(&project);
    let uri = client.open(&main, text);
    let published = client.diagnostics_for(&uri, |p| p["version"] == 1);
    assert_eq!(codes(&published), ["E119", "E119", "E119"], "{published}");
    let shown = published.to_string();
    assert!(!shown.contains("TOP_SECRET_MARKER"), "{shown}");
    assert!(shown.contains("workspace folder"), "{shown}");
    assert_eq!(
        published["diagnostics"][0]["range"]["start"],
        position(text, "\"../secret.flow\"", 0)
    );
    client.drain(Duration::from_millis(200));
    assert!(
        !client
            .notifications
            .iter()
            .any(|n| n.to_string().contains("TOP_SECRET_MARKER")),
        "the secret reached the client"
    );
    client.shutdown();
}

#[test]
fn completion_hover_definition_and_rename() {
    let dir = TempDir::new("queries");
    dir.write("recipes.flow", RECIPES);
    let text = workflow(
        "  step first = classify { subject: workflow_input.subject }\n  if step.first.urgency > 2 {\n    step maybe = classify { subject: \"x\" }\n  }\n  step second = classify { subject: \"{{step.first.category}}\" }\n  step third = classify { subject: \"{{step.\n}\n",
    );
    let path = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&path, &text);

    // After `{{step.`, in a half-typed line: the steps that have surely run.
    let answer = client.request(
        "textDocument/completion",
        json!({ "textDocument": { "uri": uri }, "position": position(&text, "{{step.\n", 7) }),
    );
    let labels: Vec<&str> = answer["result"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["label"].as_str())
        .collect();
    assert_eq!(labels, ["first", "second"], "{answer}");

    // The user finishes the reference; the other queries run on that text.
    let text = text.replace("{{step.\n}\n", "{{step.first.summary}}\" }\n");
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 2 }, "contentChanges": [{ "text": text }] }),
    );

    let answer = client.request(
        "textDocument/hover",
        json!({ "textDocument": { "uri": uri }, "position": position(&text, "category}}", 2) }),
    );
    let hover = answer["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(hover.contains("\"billing\" | \"bug\""), "{answer}");

    let answer = client.request(
        "textDocument/definition",
        json!({ "textDocument": { "uri": uri }, "position": position(&text, "classify", 1) }),
    );
    assert_eq!(
        answer["result"]["uri"],
        client::uri(&dir.0.join("recipes.flow")),
        "{answer}"
    );

    // Renaming to a name in use is refused; a free name changes every reference.
    let rename = |client: &mut Client, name: &str| {
        client.request(
            "textDocument/rename",
            json!({ "textDocument": { "uri": uri }, "position": position(&text, "step first", 6), "newName": name }),
        )
    };
    let refused = rename(&mut client, "second");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("already in use"),
        "{refused}"
    );
    let renamed = rename(&mut client, "sorted");
    assert_eq!(
        renamed["result"]["changes"][&uri].as_array().map(Vec::len),
        Some(4),
        "{renamed}"
    );
    client.shutdown();
}

fn labels(answer: &Value) -> Vec<String> {
    answer["result"]["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {answer}"))
        .iter()
        .filter_map(|item| item["label"].as_str().map(str::to_string))
        .collect()
}

/// Keystrokes in a half-typed reference are answered from one repaired copy
/// of the file, kept between them; an edit to an import drops it.
#[test]
fn completion_while_typing_a_reference_follows_the_imports() {
    let dir = TempDir::new("typing");
    let recipes = dir.write("recipes.flow", RECIPES);
    let text = workflow(
        "  step first = classify { subject: workflow_input.subject }
  step second = classify { subject: \"{{step.\n}\n",
    );
    let main = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&main, &text);
    let recipes_uri = client.open(&recipes, RECIPES);
    let mut at = position(&text, "{{step.\n", 7);
    let complete = |client: &mut Client, at: &Value| {
        labels(&client.request(
            "textDocument/completion",
            json!({ "textDocument": { "uri": uri }, "position": at }),
        ))
    };
    assert_eq!(complete(&mut client, &at), ["first"]);
    // `first.` typed one character at a time, each answered at once.
    for (version, typed) in "first.".chars().enumerate() {
        client.notify(
            "textDocument/didChange",
            json!({
                "textDocument": { "uri": uri, "version": version + 2 },
                "contentChanges": [{ "range": { "start": at, "end": at }, "text": typed.to_string() }]
            }),
        );
        at["character"] = json!(at["character"].as_u64().expect("a number") + 1);
    }
    assert_eq!(complete(&mut client, &at), ["category", "urgency"]);
    // The recipe gains an output field in its unsaved buffer.
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": { "uri": recipes_uri, "version": 2 },
            "contentChanges": [{ "text": RECIPES.replace("urgency: int", "urgency: int, team: string") }]
        }),
    );
    assert_eq!(complete(&mut client, &at), ["category", "team", "urgency"]);
    client.shutdown();
}

#[test]
fn symbols_tokens_formatting_and_unknown_methods() {
    let dir = TempDir::new("misc");
    dir.write("recipes.flow", RECIPES);
    let text = workflow("  step first = classify {subject: workflow_input.subject}\n");
    let path = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&path, &text);
    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert_eq!(symbols["result"][1]["name"], "triage", "{symbols}");
    assert_eq!(
        symbols["result"][1]["children"][0]["name"], "first",
        "{symbols}"
    );

    let tokens = client.request(
        "textDocument/semanticTokens/full",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert!(
        tokens["result"]["data"]
            .as_array()
            .is_some_and(|d| d.len() % 5 == 0 && !d.is_empty()),
        "{tokens}"
    );

    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 2, "insertSpaces": true } }),
    );
    let formatted = edits["result"][0]["newText"].as_str().unwrap_or_default();
    assert!(
        formatted.contains("classify { subject: workflow_input.subject }"),
        "{edits}"
    );

    let unknown = client.request("flow/noSuchMethod", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    // A method written empty is one nobody serves, not a missing one.
    let unknown = client.request("", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    // A request whose method starts with `$/` is answered too; only such
    // notifications may be ignored.
    client.notify("$/noSuchNotification", json!({}));
    let unknown = client.request("$/noSuchMethod", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    client.drain(Duration::from_millis(50));
    client.shutdown();
}

/// A malformed message is answered with a JSON-RPC error (its id when it
/// has one) and skipped, and the server goes on serving: tower-lsp-server's
/// transport alone ended at the first one, with exit status 0.
#[test]
fn malformed_messages_are_answered_and_the_server_goes_on() {
    let dir = TempDir::new("malformed");
    let mut client = Client::start(&dir.0);
    let framed = |body: &[u8]| {
        let mut framed = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
        framed.extend_from_slice(body);
        framed
    };
    let not_json = -32700;
    let not_a_message = -32600;
    for (bytes, id, code) in [
        (
            framed(br#"{"jsonrpc": "2.0", "id": 1"#),
            json!(null),
            not_json,
        ),
        (framed(b"42"), json!(null), not_a_message),
        (
            framed(br#"{"id": "no version", "method": "shutdown"}"#),
            json!("no version"),
            not_a_message,
        ),
        (
            framed(br#"[{"jsonrpc": "2.0", "id": "batch", "method": "shutdown"}]"#),
            json!(null),
            not_a_message,
        ),
        (
            framed(b"{\"jsonrpc\": \"2.0\", \"method\": \"\xff\"}"),
            json!(null),
            not_json,
        ),
        // Headers without a length: its body is skipped up to the next message.
        (b"Content-Type: x\r\n\r\n{}".to_vec(), json!(null), not_json),
    ] {
        client.send_raw(&bytes);
        let answer = client.response(&id);
        assert_eq!(answer["error"]["code"], code, "{answer}");
        let symbols = client.request("workspace/symbol", json!({ "query": "" }));
        assert!(symbols.get("result").is_some(), "{symbols}");
    }
    // Header names are case-insensitive.
    let body = br#"{"jsonrpc": "2.0", "id": "lowercase", "method": "workspace/symbol", "params": { "query": "" }}"#;
    let mut message = format!("content-length: {}\r\n\r\n", body.len()).into_bytes();
    message.extend_from_slice(body);
    client.send_raw(&message);
    let answer = client.response(&json!("lowercase"));
    assert!(answer.get("result").is_some(), "{answer}");
    client.shutdown();
}

/// The protocol asks for exit status 1 when `exit` comes without a
/// `shutdown` first (and 0 after one, which `Client::shutdown` checks).
#[test]
fn exit_without_shutdown_exits_with_status_1() {
    let dir = TempDir::new("exit");
    let mut client = Client::start(&dir.0);
    client.notify("exit", Value::Null);
    assert_eq!(client.exited().code(), Some(1));
}

#[test]
fn references_reach_every_file_of_the_workspace() {
    let dir = TempDir::new("references");
    let recipes = dir.write("recipes.flow", RECIPES);
    let one = workflow("  step a = classify { subject: \"1\" }\n");
    dir.write("one.flow", &one);
    dir.write(
        "two.flow",
        &workflow("  step b = classify { subject: \"2\" }\n"),
    );
    let mut client = Client::start(&dir.0);
    let recipes_uri = client.open(&recipes, RECIPES);
    let answer = client.request(
        "textDocument/references",
        json!({
            "textDocument": { "uri": recipes_uri },
            "position": { "line": 0, "character": 9 },
            "context": { "includeDeclaration": true }
        }),
    );
    let mut files: Vec<String> = answer["result"]
        .as_array()
        .expect("locations")
        .iter()
        .map(|l| {
            l["uri"]
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    files.sort();
    assert_eq!(files, ["one.flow", "recipes.flow", "two.flow"], "{answer}");
    client.shutdown();
}

/// References and renames reach the tests that name a step, mock a recipe
/// or run a workflow (`mock step.X`, `expect attempts step.X`, `mock
/// recipe X`, `workflow X`) in a `.test.flow` file that is not open, and
/// from that file back to the workflow's: a rename that missed them left a
/// workspace that did not check.
#[test]
fn references_and_rename_reach_the_test_files() {
    let dir = TempDir::new("test-files");
    let recipes = dir.write("recipes.flow", RECIPES);
    let text = workflow(
        "  step first = classify { subject: workflow_input.subject }\n  step second = classify { subject: \"{{step.first.category}}\" }\n",
    );
    let main = dir.write("main.flow", &text);
    let tests = "import \"main.flow\"\n\ntest \"t\" {\n  workflow triage\n  input { subject: \"s\" }\n  mock step.first fails 429 then { category: \"bug\", urgency: 1 }\n  mock recipe classify = { category: \"billing\", urgency: 2 }\n  expect attempts step.first == 2\n}\n";
    let tests_uri = client::uri(&dir.write("main.test.flow", tests));
    let mut client = Client::start(&dir.0);
    let main_uri = client.open(&main, &text);
    let recipes_uri = client.open(&recipes, RECIPES);
    let edited = |answer: &Value, uri: &str| {
        let mut starts: Vec<Value> = answer["result"]["changes"][uri]
            .as_array()
            .unwrap_or_else(|| panic!("no edits in {uri}: {answer}"))
            .iter()
            .map(|edit| edit["range"]["start"].clone())
            .collect();
        starts.sort_by_key(|start| (start["line"].as_u64(), start["character"].as_u64()));
        starts
    };

    let renamed = client.request(
        "textDocument/rename",
        json!({ "textDocument": { "uri": main_uri }, "position": position(&text, "step first", 6), "newName": "sorted" }),
    );
    assert_eq!(
        edited(&renamed, &tests_uri),
        [
            position(tests, "step.first", 5),
            position(tests, "attempts step.first", 14)
        ],
        "{renamed}"
    );
    assert_eq!(edited(&renamed, &main_uri).len(), 2, "{renamed}");

    let renamed = client.request(
        "textDocument/rename",
        json!({ "textDocument": { "uri": recipes_uri }, "position": position(RECIPES, "classify", 0), "newName": "sort" }),
    );
    assert_eq!(
        edited(&renamed, &tests_uri),
        [position(tests, "recipe classify", 7)],
        "{renamed}"
    );
    assert_eq!(edited(&renamed, &main_uri).len(), 2, "{renamed}");

    // A workflow's name, which the tests that run it name.
    let renamed = client.request(
        "textDocument/rename",
        json!({ "textDocument": { "uri": main_uri }, "position": position(&text, "workflow triage", 9), "newName": "route" }),
    );
    assert_eq!(
        edited(&renamed, &tests_uri),
        [position(tests, "workflow triage", 9)],
        "{renamed}"
    );
    assert_eq!(
        edited(&renamed, &main_uri),
        [position(&text, "workflow triage", 9)],
        "{renamed}"
    );

    // From the test file, once it is open, the references reach the workflow.
    let tests_uri = client.open(&dir.0.join("main.test.flow"), tests);
    let answer = client.request(
        "textDocument/references",
        json!({
            "textDocument": { "uri": tests_uri },
            "position": position(tests, "step.first", 6),
            "context": { "includeDeclaration": true }
        }),
    );
    let in_main = answer["result"]
        .as_array()
        .expect("locations")
        .iter()
        .filter(|location| location["uri"] == main_uri)
        .count();
    assert_eq!(in_main, 2, "{answer}");
    client.shutdown();
}

/// An error in an imported file is shown under that file's URI while a file
/// importing it is open, and cleared when the importer closes.
#[test]
fn an_imported_files_errors_are_published_under_its_own_uri() {
    let dir = TempDir::new("imported-diagnostics");
    let broken = RECIPES.replace("urgency: int", "urgency: integr");
    let recipes = dir.write("recipes.flow", &broken);
    let text = workflow("  step first = classify { subject: workflow_input.subject }\n");
    let main = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let main_uri = client.open(&main, &text);
    let recipes_uri = client::uri(&recipes);
    let published = client.diagnostics_for(&recipes_uri, |p| {
        !p["diagnostics"].as_array().is_some_and(Vec::is_empty)
    });
    let diagnostic = &published["diagnostics"][0];
    assert_eq!(diagnostic["range"]["start"], position(&broken, "integr", 0));
    assert!(
        diagnostic["message"]
            .as_str()
            .is_some_and(|m| m.contains("integr")),
        "{published}"
    );
    // The importer's own diagnostics do not repeat it.
    let own = client.diagnostics_for(&main_uri, |p| p["version"] == 1);
    assert!(
        !own.to_string().contains("integr"),
        "the importer repeats its import's error: {own}"
    );

    client.notify(
        "textDocument/didClose",
        json!({ "textDocument": { "uri": main_uri } }),
    );
    client.diagnostics_for(&recipes_uri, |p| p["diagnostics"] == json!([]));
    client.shutdown();
}

/// A mistyped import is answered with the file that exists, as by `flowc`.
#[test]
fn a_mistyped_import_gets_the_file_it_meant() {
    let dir = TempDir::new("import-meant");
    dir.write("recipes.flow", RECIPES);
    let text = workflow("  step first = classify { subject: workflow_input.subject }\n")
        .replace("recipes.flow", "recipe.flow");
    let main = dir.write("main.flow", &text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&main, &text);
    let published = client.diagnostics_for(&uri, |p| p["version"] == 1);
    assert_eq!(codes(&published), ["E113"], "{published}");
    let message = published["diagnostics"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("recipes.flow"), "{message}");
    client.shutdown();
}

/// `--help` and `--version` answer at once rather than waiting for a client.
#[test]
fn help_and_version_answer() {
    for (flag, expected) in [
        ("--version", env!("CARGO_PKG_VERSION")),
        ("--help", "Language Server Protocol"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_flow-lsp"))
            .arg(flag)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("flow-lsp runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{flag}: {output:?}");
        assert!(stdout.contains(expected), "{flag}: {stdout}");
    }
}

/// Inlay hints, signature help, workspace symbols, and a field's docs and
/// declaration from a reference to it.
#[test]
fn hints_signatures_workspace_symbols_and_fields() {
    let dir = TempDir::new("hints");
    dir.write("recipes.flow", RECIPES);
    let text = "import \"recipes.flow\"\n\nworkflow triage {\n  input {\n    /// What the customer wrote first.\n    subject: string\n  }\n  step first = classify { subject: workflow_input.subject }\n  step second = classify { }\n}\n";
    let path = dir.write("main.flow", text);
    let mut client = Client::start(&dir.0);
    let uri = client.open(&path, text);
    client.diagnostics_for(&uri, |p| p["version"] == 1);
    let document = json!({ "uri": uri });

    let hints = client.request(
        "textDocument/inlayHint",
        json!({ "textDocument": document, "range": { "start": { "line": 0, "character": 0 }, "end": { "line": 10, "character": 0 } } }),
    );
    assert_eq!(
        hints["result"][0]["position"],
        position(text, "step first", 10)
    );
    let label = hints["result"][0]["label"].as_str().unwrap_or_default();
    assert!(label.contains("category"), "{hints}");

    let help = client.request(
        "textDocument/signatureHelp",
        json!({ "textDocument": document, "position": position(text, "classify { }", 11) }),
    );
    let signature = &help["result"]["signatures"][0];
    assert!(
        signature["label"]
            .as_str()
            .is_some_and(|l| l.starts_with("recipe classify { subject: string }")),
        "{help}"
    );
    assert_eq!(help["result"]["activeParameter"], 0, "{help}");

    let symbols = client.request("workspace/symbol", json!({ "query": "clas" }));
    let names: Vec<&str> = symbols["result"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["classify"], "{symbols}");

    let at = position(text, "workflow_input.subject", "workflow_input.".len() + 2);
    let hover = client.request(
        "textDocument/hover",
        json!({ "textDocument": document, "position": at }),
    );
    let value = hover["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(value.contains("What the customer wrote first."), "{hover}");
    let definition = client.request(
        "textDocument/definition",
        json!({ "textDocument": document, "position": at }),
    );
    assert_eq!(
        definition["result"]["range"]["start"],
        position(text, "subject: string", 0),
        "{definition}"
    );
    client.shutdown();
}
