//! `flowc lock` against a real MCP server (server-everything over stdio,
//! installed by `tests/setup.sh`), then `flowc check` reading the
//! lock: unknown tools and missing, unknown or ill-typed arguments of browser
//! steps are reported offline; without a lock a note says they are unchecked.

use std::path::Path;

use flow_tests::mcp_servers::mcp_servers_dir;
use flow_tests::{Run, TempDir, flowc_path, run_in};

fn flowc(dir: &Path, args: &[&str]) -> Run {
    run_in(&flowc_path(), dir, args)
}

/// A workflow with browser steps calling server-everything's `echo`.
fn source(steps: &str) -> String {
    let server = mcp_servers_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    format!(
        "mcp everything {{ command \"node\" args [{:?}, \"stdio\"] }}\n\nworkflow echoes {{\n{steps}}}\n",
        server.to_string_lossy()
    )
}

#[test]
fn flowc_lock_records_the_tools_and_check_holds_browser_steps_to_them() {
    flow_tests::require!(McpServers);
    let dir = TempDir::new("flowc-lock");
    dir.write(
        "echo.flow",
        source("  step said = everything.echo { message: \"hello\" } retry 1\n"),
    );

    // No lock: clean, with a note that the tool calls are unchecked.
    let unchecked = flowc(dir.path(), &["check", "echo.flow"]);
    assert_eq!(unchecked.code, 0, "{}", unchecked.all());
    assert!(
        unchecked
            .stderr
            .contains("note: no flow.lock in `.` (1 file with browser steps): their tools and arguments are unchecked"),
        "{}",
        unchecked.stderr
    );

    let locked = flowc(dir.path(), &["lock", "."]);
    assert_eq!(locked.code, 0, "{}", locked.all());
    assert!(
        locked.stderr.contains("wrote ./flow.lock (1 server(s))"),
        "{}",
        locked.stderr
    );
    let lock_text =
        std::fs::read_to_string(dir.path().join("flow.lock")).expect("flow.lock written");
    let lock: serde_json::Value = serde_json::from_str(&lock_text).expect("JSON");
    assert_eq!(lock["version"], 1);
    assert_eq!(lock["servers"][0]["name"], "everything");
    let echo = lock["servers"][0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|tool| tool["name"] == "echo")
        .expect("echo is locked");
    assert_eq!(
        echo["input_schema"]["required"],
        serde_json::json!(["message"])
    );
    // Taken again, the lock is the same file.
    assert_eq!(flowc(dir.path(), &["lock", "echo.flow"]).code, 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("flow.lock")).expect("flow.lock"),
        lock_text
    );

    let clean = flowc(dir.path(), &["check", "echo.flow"]);
    assert_eq!(clean.code, 0, "{}", clean.all());
    assert!(!clean.stderr.contains("unchecked"), "{}", clean.stderr);

    dir.write(
        "echo.flow",
        source(
            "  step a = everything.ecoh { message: \"hello\" } retry 1\n  \
             step b = everything.echo { mesage: \"hello\" } retry 1\n  \
             step c = everything.echo { message: 42 } retry 1\n",
        ),
    );
    let checked = flowc(dir.path(), &["check", "--format", "json", "echo.flow"]);
    assert_eq!(checked.code, 1, "{}", checked.all());
    let report: serde_json::Value = serde_json::from_str(&checked.stdout).expect("JSON report");
    let diagnostics = report["diagnostics"]
        .as_array()
        .unwrap_or_else(|| panic!("diagnostics in {report}"))
        .clone();
    let codes: Vec<&str> = diagnostics
        .iter()
        .filter_map(|d| d["code"].as_str())
        .collect();
    assert_eq!(codes, ["E118", "E202", "E203"], "{report}");
    let text = checked.stdout;
    assert!(
        text.contains("MCP server `everything` has no tool `ecoh`"),
        "{text}"
    );
    assert!(text.contains("did you mean `echo`?"), "{text}");
    assert!(
        text.contains("tool `everything.echo` has no input `mesage`"),
        "{text}"
    );
    assert!(text.contains("did you mean `message`?"), "{text}");

    // Regression (issue 12): `flowc build` read no lock, so what `check`
    // refused built with exit 0; every driver now compiles one way.
    let built = flowc(dir.path(), &["build", "echo.flow", "-o", "echo.plan.json"]);
    assert_eq!(built.code, 1, "{}", built.all());
    assert!(built.all().contains("E118"), "{}", built.all());
    assert!(!dir.path().join("echo.plan.json").exists());

    // A lock that cannot be used is an error everywhere, not a reason to
    // check without it.
    dir.write("flow.lock", "{ \"version\": 1, ");
    let unusable = flowc(dir.path(), &["check", "echo.flow"]);
    assert_eq!(unusable.code, 1, "{}", unusable.all());
    assert!(unusable.all().contains("E120"), "{}", unusable.all());
}

#[test]
fn flowc_lock_names_a_server_that_does_not_answer_and_writes_nothing() {
    let dir = TempDir::new("flowc-lock-fails");
    dir.write(
        "broken.flow",
        "mcp ghost { command \"/nonexistent/mcp-server\" }\n\nworkflow w {\n  step a = ghost.anything {} retry 1\n}\n",
    );
    let run = flowc(dir.path(), &["lock", "--timeout", "5", "broken.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(
        run.stderr.contains(
            "MCP server `ghost` (/nonexistent/mcp-server): the server could not be started"
        ) && run.stderr.contains("No such file"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("flow.lock not written"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("flow.lock").exists());
}

/// `flowc lock` runs the commands of every file it reaches, imports
/// included; `--dry-run` lists them (and the URLs it would reach) without
/// starting any: the command here would create a file, which must not exist
/// afterwards. Environment values and URL passwords are not printed.
#[test]
fn flowc_lock_dry_run_lists_the_commands_and_starts_nothing() {
    let dir = TempDir::new("flowc-lock-dry-run");
    let marker = dir.path().join("started");
    dir.write(
        "servers.flow",
        format!(
            "mcp toucher {{ command \"/bin/sh\" args [\"-c\", \"touch {}\"] env {{ API_TOKEN: \"s3cret-value\" }} }}\nmcp web {{ url \"https://me:pa55word@example.invalid/mcp\" }}\n",
            marker.display()
        ),
    );
    dir.write("main.flow", "import \"servers.flow\"\n");
    let run = flowc(dir.path(), &["lock", "--dry-run", "main.flow"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(
        run.stdout.contains(&format!(
            "flow.lock: would start MCP server `toucher`: /bin/sh -c 'touch {}' (environment: API_TOKEN)",
            marker.display()
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("flow.lock: would reach MCP server `web` at https://***@example.invalid/mcp"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("nothing started, nothing written"),
        "{}",
        run.stderr
    );
    assert!(!run.all().contains("s3cret-value"), "{}", run.all());
    assert!(!run.all().contains("pa55word"), "{}", run.all());
    // Give a server that was started anyway the time to run.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!marker.exists(), "--dry-run started a server");
    assert!(!dir.path().join("flow.lock").exists());
}

/// Without `--dry-run`, each command is printed before it starts: here the
/// command is no MCP server (it creates a file and exits), so the lock
/// fails, but the line naming it came first and the file exists.
#[test]
fn flowc_lock_prints_each_command_before_starting_it() {
    let dir = TempDir::new("flowc-lock-prints");
    let marker = dir.path().join("started");
    dir.write(
        "main.flow",
        format!(
            "mcp toucher {{ command \"/bin/sh\" args [\"-c\", \"touch {}\"] env {{ API_TOKEN: \"s3cret-value\" }} }}\n",
            marker.display()
        ),
    );
    let run = flowc(dir.path(), &["lock", "--timeout", "5", "main.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    let announced = format!(
        "flowc: start MCP server `toucher`: /bin/sh -c 'touch {}' (environment: API_TOKEN)",
        marker.display()
    );
    let at = run
        .stderr
        .find(&announced)
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let failed = run.stderr.find("error: ").expect("the lock fails");
    assert!(at < failed, "{}", run.stderr);
    assert!(!run.all().contains("s3cret-value"), "{}", run.all());
    assert!(marker.exists(), "the command was started");
}

#[test]
fn flowc_lock_help_says_it_starts_programs() {
    let dir = TempDir::new("flowc-lock-help");
    let run = flowc(dir.path(), &["lock", "--help"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(run.stdout.contains("This runs programs"), "{}", run.stdout);
    assert!(run.stdout.contains("--dry-run"), "{}", run.stdout);
    let short = flowc(dir.path(), &["lock", "-h"]);
    assert!(
        short.stdout.contains("Start every MCP server"),
        "{}",
        short.stdout
    );
}
