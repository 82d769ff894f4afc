//! End-to-end tests of the `flowc` binary: exit codes, the three output
//! formats, and every subcommand, on the examples and on small files written
//! to temporary directories.

use std::path::Path;
use std::time::Duration;

use flow_tests::{Run, TempDir, flowc_path, root, run_bounded, run_in, run_with_stdout_closed};

fn flowc_in(dir: &Path, args: &[&str]) -> Run {
    run_in(&flowc_path(), dir, args)
}

fn flowc(args: &[&str]) -> Run {
    flowc_in(&root(), args)
}

/// A copy of `examples/support_triage.flow` and its `recipes/` folder, with
/// `from` replaced by `to` in the workflow.
fn mutated_support_triage(from: &str, to: &str) -> TempDir {
    let dir = TempDir::new("triage");
    let source = std::fs::read_to_string(root().join("examples/support_triage.flow"))
        .expect("the example exists");
    assert!(
        source.contains(from),
        "the example no longer contains {from}"
    );
    dir.write("support_triage.flow", source.replacen(from, to, 1));
    for entry in std::fs::read_dir(root().join("examples/recipes")).expect("recipes/ exists") {
        let entry = entry.expect("recipes/ can be listed");
        let name = format!("recipes/{}", entry.file_name().to_string_lossy());
        dir.write(
            &name,
            std::fs::read(entry.path()).expect("a recipe file is readable"),
        );
    }
    dir
}

// ---------------------------------------------------------------- check

#[test]
fn the_examples_are_clean() {
    let run = flowc(&["check", "examples/"]);
    assert_eq!(run.code, 0, "{}", run.all());
    // The examples have no flow.lock: their browser steps' tools are
    // unchecked, which one note says for the folder.
    assert!(
        run.stderr
            .contains("note: no flow.lock in `examples` (2 files with browser steps)"),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("note: no flow.lock").count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .trim_end()
            .ends_with("0 errors, 0 warnings in 10 files"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_misspelt_step_field_is_named_and_corrected() {
    let dir = mutated_support_triage("{{step.classify.summary}}", "{{step.classify.sumary}}");
    let run = flowc_in(dir.path(), &["check", "."]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(run.stderr.contains("E104"), "{}", run.stderr);
    assert!(
        run.stderr.contains("has no field `sumary`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("did you mean `summary`?"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_misspelt_input_field_is_named_and_corrected() {
    let dir = mutated_support_triage(
        "{{workflow_input.ticket_id}}",
        "{{workflow_input.ticket_idd}}",
    );
    let run = flowc_in(dir.path(), &["check", "support_triage.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(
        run.stderr.contains("has no field `ticket_idd`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("did you mean `ticket_id`?"),
        "{}",
        run.stderr
    );
}

#[test]
fn json_output_parses_and_counts() {
    let dir = mutated_support_triage("{{step.classify.summary}}", "{{step.classify.sumary}}");
    let run = flowc_in(dir.path(), &["check", "--format", "json", "."]);
    assert_eq!(run.code, 1, "{}", run.all());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    assert_eq!(json["files"], 3, "{json}");
    assert_eq!(json["errors"], 1, "{json}");
    assert_eq!(json["warnings"], 0, "{json}");
    let diagnostic = &json["diagnostics"][0];
    assert_eq!(diagnostic["code"], "E104");
    assert_eq!(diagnostic["name"], "unknown-field");
    assert_eq!(diagnostic["severity"], "error");
    assert_eq!(diagnostic["file"], "support_triage.flow");
    assert_eq!(diagnostic["line"], 33);
    assert_eq!(diagnostic["column"], 25);
    assert_eq!(diagnostic["end_line"], 33);
    assert_eq!(diagnostic["end_column"], 31);
    assert_eq!(diagnostic["label"], "unknown field");
    assert!(
        diagnostic["hints"][0]
            .as_str()
            .is_some_and(|hint| hint.contains("`summary`")),
        "{diagnostic}"
    );
}

#[test]
fn clean_json_output_has_no_diagnostics() {
    let run = flowc(&["check", "--format", "json", "examples"]);
    assert_eq!(run.code, 0, "{}", run.all());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    assert_eq!(json["files"], 10);
    assert_eq!(json["errors"], 0);
    assert_eq!(json["diagnostics"], serde_json::json!([]));
}

#[test]
fn github_output_is_one_workflow_command_per_diagnostic() {
    let dir = mutated_support_triage("{{step.classify.summary}}", "{{step.classify.sumary}}");
    let run = flowc_in(dir.path(), &["check", "--format", "github", "."]);
    assert_eq!(run.code, 1, "{}", run.all());
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stdout);
    assert!(
        lines[0].starts_with(
            "::error file=support_triage.flow,line=33,col=25,endLine=33,endColumn=31,title=E104 unknown-field::the output of step `classify` has no field `sumary`"
        ),
        "{}",
        lines[0]
    );
    // Hints follow on escaped new lines, so the annotation stays one command.
    assert!(
        lines[0].contains("%0Ahelp: did you mean `summary`?"),
        "{}",
        lines[0]
    );
}

#[test]
fn warnings_fail_only_when_denied() {
    let dir = TempDir::new("warning");
    dir.write(
        "w.flow",
        "workflow w {\n  input { id: string }\n  step note = handoff \"team\" { message: \"hi\" }\n}\n",
    );
    let allowed = flowc_in(dir.path(), &["check", "w.flow"]);
    assert_eq!(allowed.code, 0, "{}", allowed.all());
    assert!(allowed.stderr.contains("W302"), "{}", allowed.stderr);
    assert!(
        allowed.stderr.contains("0 errors, 1 warning in 1 file"),
        "{}",
        allowed.stderr
    );
    let denied = flowc_in(dir.path(), &["check", "--deny-warnings", "w.flow"]);
    assert_eq!(denied.code, 1, "{}", denied.all());
    let github = flowc_in(dir.path(), &["check", "--format", "github", "w.flow"]);
    assert!(
        github.stdout.starts_with("::warning file=w.flow,"),
        "{}",
        github.stdout
    );
}

#[test]
fn a_file_imported_by_several_roots_is_reported_once() {
    let dir = TempDir::new("dedup");
    dir.write("lib.flow", "type Broken = Missing\n");
    dir.write("a.flow", "import \"lib.flow\"\n");
    dir.write("b.flow", "import \"./lib.flow\"\n");
    let run = flowc_in(dir.path(), &["check", "--format", "json", "."]);
    assert_eq!(run.code, 1, "{}", run.all());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    assert_eq!(json["files"], 3, "{json}");
    assert_eq!(json["errors"], 1, "{json}");
    assert_eq!(json["diagnostics"][0]["code"], "E111", "{json}");
    assert_eq!(json["diagnostics"][0]["file"], "lib.flow", "{json}");
}

#[test]
fn a_missing_path_is_an_io_error() {
    let run = flowc(&["check", "examples/nope.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(
        run.stderr
            .contains("error: cannot read examples/nope.flow: no such file or directory"),
        "{}",
        run.stderr
    );
    // The paths that do exist are still checked.
    let run = flowc_in(
        &root(),
        &[
            "check",
            "examples/nope.flow",
            "examples/support_triage.flow",
        ],
    );
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(run.stderr.contains("in 2 files"), "{}", run.stderr);
}

/// Regression: a folder with no `.flow` file checked clean in silence, so
/// a CI step pointed at the wrong folder passed without a word.
#[test]
fn a_folder_without_sources_is_said_to_be_one() {
    let dir = TempDir::new("empty");
    dir.write("README.md", "nothing to check\n");
    dir.write("src/w.flow", "workflow w { output { x: 1 } }\n");
    std::fs::create_dir_all(dir.path().join("docs")).expect("a folder");
    for format in ["human", "json"] {
        let run = flowc_in(dir.path(), &["check", "--format", format, "src", "docs"]);
        assert_eq!(run.code, 0, "{}", run.all());
        assert!(
            run.stderr.contains("warning: no .flow files in `docs`"),
            "{format}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("in `src`"), "{}", run.stderr);
    }
    let json = flowc_in(dir.path(), &["check", "--format", "json", "docs"]);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON on stdout");
    assert_eq!(report["files"], 0, "{report}");
    // In GitHub's format the warning is an annotation, on stdout with the rest.
    let github = flowc_in(dir.path(), &["check", "--format", "github", "docs"]);
    assert_eq!(github.code, 0, "{}", github.all());
    assert!(
        github
            .stdout
            .contains("::warning::no .flow files in `docs`"),
        "{}",
        github.all()
    );
    // Denied, it fails as any warning does.
    let denied = flowc_in(dir.path(), &["check", "--deny-warnings", "docs"]);
    assert_eq!(denied.code, 1, "{}", denied.all());
    let formatted = flowc_in(dir.path(), &["fmt", "--check", "docs"]);
    assert!(
        formatted
            .stderr
            .contains("warning: no .flow files in `docs`"),
        "{}",
        formatted.all()
    );
}

/// A `.flow` entry of a folder that is not a file is said, not skipped.
/// Regression: a link to a file that was gone, or a pipe, left the
/// folder's check passing without a word (`files: 1, unreadable: []`).
#[test]
fn a_folders_flow_entry_that_is_no_file_is_said() {
    let dir = TempDir::new("no-file");
    dir.write("ok.flow", "workflow w { output { x: 1 } }\n");
    std::os::unix::fs::symlink("gone.flow", dir.path().join("broken.flow")).expect("a link");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe.flow"))
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let run = flowc_in(dir.path(), &["check", "--format", "json", "."]);
    assert_eq!(run.code, 2, "{}", run.all());
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON on stdout");
    assert_eq!(report["files"], 1, "{report}");
    let mut unreadable: Vec<String> = report["unreadable"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|entry| {
            format!(
                "{}: {}",
                entry["path"].as_str().unwrap_or(""),
                entry["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    unreadable.sort();
    assert_eq!(
        unreadable,
        [
            "broken.flow: a symbolic link to a file that does not exist",
            "pipe.flow: not a regular file (a pipe, a socket or a device)"
        ]
    );
}

#[test]
fn no_path_is_a_usage_error() {
    let run = flowc(&["check"]);
    assert_eq!(run.code, 2, "{}", run.all());
    let run = flowc(&["check", "--format", "xml", "examples"]);
    assert_eq!(run.code, 2, "{}", run.all());
}

#[test]
fn a_file_that_is_not_utf8_names_the_byte_offset_but_shows_none_of_it() {
    let dir = TempDir::new("utf8");
    dir.write("latin1.flow", b"// caf\xe9\ntype A = string\n");
    let run = flowc_in(dir.path(), &["check", "--format", "json", "latin1.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    let diagnostic = &json["diagnostics"][0];
    assert_eq!(diagnostic["code"], "E004", "{json}");
    assert_eq!(
        diagnostic["message"],
        "`latin1.flow` is not valid UTF-8: invalid byte at offset 6 (line 1, column 7); the file is not checked"
    );
    // At the byte, so that an annotation or an editor marks its line.
    assert_eq!(
        (&diagnostic["line"], &diagnostic["column"]),
        (&1.into(), &7.into())
    );
    // A file that is not UTF-8 may not be a source at all: nothing of it is
    // echoed, in any format.
    for format in ["human", "json", "github"] {
        let run = flowc_in(dir.path(), &["check", "--format", format, "latin1.flow"]);
        assert!(
            run.all().contains("invalid byte at offset 6"),
            "{}",
            run.all()
        );
        assert!(!run.all().contains("caf"), "{format}: {}", run.all());
        assert!(!run.all().contains("type A"), "{format}: {}", run.all());
    }
}

#[test]
fn an_import_cycle_shows_the_chain() {
    let dir = TempDir::new("cycle");
    dir.write("a.flow", "import \"b.flow\"\ntype A = string\n");
    dir.write("b.flow", "import \"a.flow\"\ntype B = string\n");
    let run = flowc_in(dir.path(), &["check", "a.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(run.stderr.contains("E114"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("import cycle: a.flow -> b.flow -> a.flow"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_missing_import_shows_the_chain() {
    let dir = TempDir::new("missing-import");
    dir.write("a.flow", "import \"b.flow\"\n");
    dir.write("b.flow", "import \"gone.flow\"\n");
    let run = flowc_in(dir.path(), &["check", "--format", "json", "a.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    let diagnostic = &json["diagnostics"][0];
    assert_eq!(diagnostic["code"], "E113", "{json}");
    assert_eq!(diagnostic["file"], "b.flow", "{json}");
    let hints = diagnostic["hints"].to_string();
    assert!(hints.contains("a.flow -> b.flow -> gone.flow"), "{hints}");
}

/// The human rendering of a file with several diagnostics: labels, secondary
/// labels in the same file, a note for a label in another file, hints, a
/// warning, and the summary.
#[test]
fn human_output_snapshot() {
    let run = flowc(&["check", "tests/fixtures/cli/several.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(
        !run.stderr.contains('\u{1b}'),
        "no colours when not a terminal"
    );
    insta::assert_snapshot!(run.stderr);
}

/// Regression: a diagnostic on a line of 800 KB (a record type of 50,000
/// fields written on one line) printed the whole line, twice: 3.5 MB for
/// one error. A long line is shown cut around the label, with `…` where
/// text is left out and the file's own line numbers.
#[test]
fn a_diagnostic_on_a_long_line_shows_an_excerpt_of_it() {
    let dir = TempDir::new("long-line");
    let prose = "x".repeat(50_000);
    dir.write(
        "long.flow",
        format!(
            "// A prompt on one line.\nrecipe r {{ model \"m\" input {{ a: string }} output {{ a: int }} prompt \"{prose} {{{{input.b}}}} {prose}\" }}\n// The end.\n"
        ),
    );
    let run = flowc_in(dir.path(), &["check", "long.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(run.stderr.len() < 2_000, "{} bytes", run.stderr.len());
    // The title and the snippet's header give the same place in the file.
    let title = run.stderr.lines().next().expect("a report");
    let at = &title[title.find("long.flow:2:").expect("the title names line 2")..];
    assert!(run.stderr.contains(&format!("╭─[{at}]")), "{}", run.stderr);
    assert!(run.stderr.contains("input.b"), "{}", run.stderr);
    assert!(run.stderr.contains(" 2 │ …xxx"), "{}", run.stderr);
    assert!(run.stderr.contains(" 3 │ // The end."), "{}", run.stderr);
}

// ------------------------------------------------ imports stay in the project
//
// A program checked in CI is untrusted input: its imports must not make
// flowc read, and print in a diagnostic's snippet, a file outside the
// project (the folder named, the file's folder, or `--root DIR`), nor a
// device, pipe or huge file. Each refusal is a diagnostic at the import.

/// How long a check that must refuse at once may take; a regression that
/// reads `/dev/zero` or waits on `/dev/stdin` fails here instead of hanging.
const PROMPTLY: Duration = Duration::from_secs(20);

fn flowc_bounded(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_bounded(&flowc_path(), dir, args, env, PROMPTLY)
}

/// The codes of `--format json`'s diagnostics, in order.
fn json_codes(run: &Run) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|_| panic!("stdout is JSON: {}", run.all()));
    json["diagnostics"]
        .as_array()
        .expect("a list of diagnostics")
        .iter()
        .map(|d| d["code"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A folder `project/` in a temporary directory, with a file beside it
/// (outside the project) that holds a secret and does not parse, so that
/// any snippet of it would show the secret.
fn project_beside_a_secret(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    dir.write("secret.flow", "TOP_SECRET_MARKER=hunter2\n");
    dir.write(
        ".git-credentials",
        "https://me:TOP_SECRET_MARKER@example.com\n",
    );
    std::fs::create_dir_all(dir.path().join("project")).expect("project/ is made");
    dir
}

#[test]
fn an_import_of_proc_self_environ_never_prints_the_environment() {
    let dir = TempDir::new("environ");
    dir.write("main.flow", "import \"/proc/self/environ\"\n");
    let secret = format!("flow-ci-secret-{}", std::process::id());
    let env = [("CI_SECRET", secret.as_str())];
    for format in ["human", "json", "github"] {
        let run = flowc_bounded(
            dir.path(),
            &["check", "--format", format, "main.flow"],
            &env,
        );
        assert_eq!(run.code, 1, "{}", run.all());
        assert!(run.all().contains("E119"), "{}", run.all());
        assert!(
            !run.all().contains(&secret),
            "{format} leaked: {}",
            run.all()
        );
    }
    let json = flowc_bounded(
        dir.path(),
        &["check", "--format", "json", "main.flow"],
        &env,
    );
    assert_eq!(json_codes(&json), ["E119"]);
    assert!(
        json.stdout.contains(
            "cannot import `/proc/self/environ`: the path leads outside the project folder `.`"
        ),
        "{}",
        json.stdout
    );
    assert!(
        json.stdout.contains("name it with `--root DIR`"),
        "{}",
        json.stdout
    );

    // With the whole disk as the project, the file is still no source.
    let wide = flowc_bounded(
        dir.path(),
        &["check", "--root", "/", "--format", "json", "main.flow"],
        &env,
    );
    assert_eq!(json_codes(&wide), ["E113"], "{}", wide.all());
    assert!(!wide.all().contains(&secret), "{}", wide.all());
}

#[test]
fn an_import_that_climbs_out_of_the_project_is_refused_unread() {
    let dir = project_beside_a_secret("climb");
    let project = dir.path().join("project");
    dir.write(
        "project/main.flow",
        "import \"../secret.flow\"\nimport \"../../../../../../etc/passwd\"\nimport \"sub/../../.git-credentials\"\n",
    );
    let run = flowc_bounded(&project, &["check", "--format", "json", "main.flow"], &[]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert_eq!(json_codes(&run), ["E119", "E119", "E119"], "{}", run.all());
    assert!(!run.all().contains("TOP_SECRET_MARKER"), "{}", run.all());
    assert!(!run.all().contains("root:x:0"), "{}", run.all());
    let human = flowc_bounded(&project, &["check", "main.flow"], &[]);
    assert!(
        !human.all().contains("TOP_SECRET_MARKER"),
        "{}",
        human.all()
    );
    assert!(
        human.stderr.contains("error[E119]: main.flow:"),
        "{}",
        human.stderr
    );

    // Named as the project, the parent folder's `.flow` file is imported
    // (and fails to parse); `/etc/passwd` is still outside, and the
    // credentials, now inside, are no `.flow` source.
    let wider = flowc_bounded(
        &project,
        &["check", "--root", "..", "--format", "json", "main.flow"],
        &[],
    );
    // (Reports are sorted by file: `../secret.flow` before `main.flow`.)
    assert_eq!(
        json_codes(&wider),
        ["E001", "E119", "E113"],
        "{}",
        wider.all()
    );
}

#[test]
fn a_symbolic_link_out_of_the_project_is_refused() {
    let dir = project_beside_a_secret("symlink");
    let project = dir.path().join("project");
    std::os::unix::fs::symlink("../secret.flow", project.join("link.flow")).expect("a link");
    std::os::unix::fs::symlink("../.git-credentials", project.join("creds.flow")).expect("a link");
    std::os::unix::fs::symlink("..", project.join("up")).expect("a link");
    dir.write(
        "project/main.flow",
        "import \"link.flow\"\nimport \"creds.flow\"\nimport \"up/secret.flow\"\n",
    );
    let run = flowc_bounded(&project, &["check", "--format", "json", "main.flow"], &[]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert_eq!(json_codes(&run), ["E119", "E119", "E119"], "{}", run.all());
    assert!(
        run.stdout
            .contains("a symbolic link leads outside the project folder `.`"),
        "{}",
        run.stdout
    );
    assert!(!run.all().contains("TOP_SECRET_MARKER"), "{}", run.all());

    // A link found by walking the folder is refused as a root too.
    let walked = flowc_bounded(&project, &["check", "."], &[]);
    assert_eq!(walked.code, 2, "{}", walked.all());
    assert!(
        walked.stderr.contains(
            "error: cannot read link.flow: a symbolic link leads outside the project folder `.`"
        ),
        "{}",
        walked.stderr
    );
    assert!(
        !walked.all().contains("TOP_SECRET_MARKER"),
        "{}",
        walked.all()
    );
    // And `fmt` neither reads nor writes through it.
    let formatted = flowc_bounded(&project, &["fmt", "."], &[]);
    assert_eq!(formatted.code, 2, "{}", formatted.all());
    assert_eq!(dir.read("secret.flow"), "TOP_SECRET_MARKER=hunter2\n");
}

#[test]
fn imports_of_dev_zero_dev_stdin_and_a_fifo_end_at_once() {
    let dir = TempDir::new("devices");
    dir.write(
        "main.flow",
        "import \"/dev/zero\"\nimport \"/dev/stdin\"\nimport \"pipe.flow\"\nimport \"zero.flow\"\n",
    );
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe.flow"))
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.flow")).expect("a link");
    let run = flowc_bounded(dir.path(), &["check", "--format", "json", "main.flow"], &[]);
    assert_eq!(run.code, 1, "{}", run.all());
    // Outside the project: /dev/zero, /dev/stdin and the link to /dev/zero;
    // inside, the pipe is no regular file (opened without blocking).
    assert_eq!(
        json_codes(&run),
        ["E119", "E119", "E113", "E119"],
        "{}",
        run.all()
    );
    assert!(
        run.stdout.contains("it is not a regular file"),
        "{}",
        run.stdout
    );

    // With the whole disk as the project the devices are reached, and refused.
    let wide = flowc_bounded(
        dir.path(),
        &["check", "--root", "/", "--format", "json", "main.flow"],
        &[],
    );
    assert_eq!(
        json_codes(&wide),
        ["E113", "E113", "E113", "E113"],
        "{}",
        wide.all()
    );
}

#[test]
fn an_import_above_the_size_cap_is_refused() {
    let dir = TempDir::new("large");
    dir.write("main.flow", "import \"big.flow\"\n");
    std::fs::File::create(dir.path().join("big.flow"))
        .and_then(|file| file.set_len(9 * 1024 * 1024))
        .expect("a sparse file");
    let run = flowc_bounded(dir.path(), &["check", "--format", "json", "main.flow"], &[]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert_eq!(json_codes(&run), ["E113"], "{}", run.all());
    assert!(
        run.stdout
            .contains("cannot import `big.flow`: it is larger than 8 MiB"),
        "{}",
        run.stdout
    );
    // Named on the command line, it is refused the same way.
    let named = flowc_bounded(dir.path(), &["check", "big.flow"], &[]);
    assert_eq!(named.code, 2, "{}", named.all());
    assert!(
        named.stderr.contains("larger than 8 MiB"),
        "{}",
        named.stderr
    );
}

#[test]
fn an_import_that_is_not_a_flow_file_or_not_utf8_is_not_echoed() {
    let dir = TempDir::new("not-source");
    dir.write(".env", "TOP_SECRET_MARKER=1\n");
    dir.write("binary.flow", b"TOP_SECRET_MARKER \xff\xfe\n");
    dir.write("main.flow", "import \".env\"\nimport \"binary.flow\"\n");
    let run = flowc_bounded(dir.path(), &["check", "--format", "json", "main.flow"], &[]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert_eq!(json_codes(&run), ["E004", "E113"], "{}", run.all());
    assert!(
        run.stdout.contains("it is not a `.flow` file"),
        "{}",
        run.stdout
    );
    let human = flowc_bounded(dir.path(), &["check", "main.flow"], &[]);
    assert!(
        !human.all().contains("TOP_SECRET_MARKER"),
        "{}",
        human.all()
    );
}

// ---------------------------------------------------------------- explain

#[test]
fn explain_prints_the_documentation() {
    for spelling in ["E101", "e101", "unknown-step"] {
        let run = flowc(&["explain", spelling]);
        assert_eq!(run.code, 0, "{}", run.all());
        assert!(
            run.stdout.starts_with("E101 unknown-step (error)\n"),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout.contains("did you mean `classify`?"),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn explain_rejects_an_unknown_code_with_the_list() {
    let run = flowc(&["explain", "E999"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(run.stderr.contains("unknown code `E999`"), "{}", run.stderr);
    assert!(run.stderr.contains("E101  unknown-step"), "{}", run.stderr);
}

#[test]
fn explain_lists_every_code() {
    let run = flowc(&["explain", "--list"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(run.stdout.lines().count() > 20, "{}", run.stdout);
    assert!(
        run.stdout.contains("W302  retried-side-effect"),
        "{}",
        run.stdout
    );
    assert_eq!(flowc_in(&root(), &["explain"]).code, 2);
}

// ---------------------------------------------------------------- graph

#[test]
fn graph_draws_a_flowchart() {
    let run = flowc(&["graph", "examples/incident_response.flow"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(run.stdout.starts_with("flowchart TD\n"), "{}", run.stdout);
    assert!(
        run.stdout.contains("{{\"go_ahead<br/>approval\"}}"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("subgraph n_branch_respond_comms"),
        "{}",
        run.stdout
    );
}

#[test]
fn graph_names_the_workflows_when_the_name_is_unknown() {
    let run = flowc(&[
        "graph",
        "examples/support_triage.flow",
        "--workflow",
        "nope",
    ]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(run.stderr.contains("support_triage"), "{}", run.stderr);
    let named = flowc_in(
        &root(),
        &[
            "graph",
            "examples/support_triage.flow",
            "--workflow",
            "support_triage",
        ],
    );
    assert_eq!(named.code, 0, "{}", named.all());
}

// ---------------------------------------------------------------- fmt

#[test]
fn fmt_check_lists_then_fmt_fixes() {
    let dir = TempDir::new("fmt");
    let messy = "workflow   w{\ninput{a:string}\n     step x=handoff \"t\"{message:\"{{workflow_input.a}}\"}   // keep me\n}\n";
    dir.write("messy.flow", messy);
    let check = flowc_in(dir.path(), &["fmt", "--check", "."]);
    assert_eq!(check.code, 1, "{}", check.all());
    assert_eq!(check.stdout, "messy.flow\n");
    assert_eq!(dir.read("messy.flow"), messy, "--check changes nothing");

    let fix = flowc_in(dir.path(), &["fmt", "."]);
    assert_eq!(fix.code, 0, "{}", fix.all());
    let formatted = dir.read("messy.flow");
    assert_ne!(formatted, messy);
    assert!(formatted.contains("// keep me"), "{formatted}");
    let again = flowc_in(dir.path(), &["fmt", "--check", "messy.flow"]);
    assert_eq!(again.code, 0, "{}", again.all());
    assert_eq!(again.stdout, "");
}

#[test]
fn fmt_names_the_place_it_cannot_tokenise() {
    let dir = TempDir::new("fmt-bad");
    dir.write("bad.flow", "type A = string\ntype B = \"unterminated\n");
    let run = flowc_in(dir.path(), &["fmt", "bad.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(
        run.stderr.contains("error: bad.flow:2:10: cannot format"),
        "{}",
        run.stderr
    );
    let missing = flowc_in(dir.path(), &["fmt", "gone.flow"]);
    assert_eq!(missing.code, 2, "{}", missing.all());
}

// ---------------------------------------------------------------- build

#[test]
fn build_writes_a_plan_with_its_hash() {
    let dir = TempDir::new("build");
    let out = dir.path().join("triage.json");
    let out_arg = out.to_str().expect("temporary paths are UTF-8");
    let run = flowc(&["build", "examples/support_triage.flow", "-o", out_arg]);
    assert_eq!(run.code, 0, "{}", run.all());
    let plan: serde_json::Value =
        serde_json::from_str(&dir.read("triage.json")).expect("the plan is JSON");
    let hash = plan["hash"].as_str().expect("the plan has a hash");
    assert!(hash.starts_with("sha256:"), "{hash}");
    assert_eq!(run.stderr.trim_end(), format!("wrote {out_arg} ({hash})"));
    assert_eq!(plan["workflows"][0]["name"], "support_triage");
}

#[test]
fn build_refuses_a_program_with_errors() {
    let dir = mutated_support_triage("{{step.classify.summary}}", "{{step.classify.sumary}}");
    let run = flowc_in(dir.path(), &["build", "support_triage.flow"]);
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(run.stderr.contains("sumary"), "{}", run.stderr);
    assert!(!dir.path().join("support_triage.plan.json").exists());
}

/// Regression: a file of no workflow (a test file, a recipe library) was
/// built to a plan of none, exit 0, which `flow run` then refused.
#[test]
fn build_refuses_a_file_of_no_workflow() {
    let dir = TempDir::new("flowc-build-none");
    dir.write(
        "lib.flow",
        "recipe r { model \"m\" input { q: string } output { a: string } prompt \"{{input.q}}\" }\n",
    );
    let run = flowc_in(dir.path(), &["build", "lib.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(
        run.stderr
            .contains("lib.flow declares no workflow, so it has no plan to build"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("lib.plan.json").exists());
}

#[test]
fn build_defaults_to_a_plan_beside_the_source() {
    // Replacing a string by itself gives an unchanged copy.
    let dir = mutated_support_triage("workflow support_triage", "workflow support_triage");
    let run = flowc_in(dir.path(), &["build", "support_triage.flow"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(dir.path().join("support_triage.plan.json").is_file());
}

/// Regression: with `-o -`, machine-format diagnostics went to stdout before
/// the plan, so stdout was not JSON.
#[test]
fn build_to_stdout_keeps_diagnostics_out_of_the_plan() {
    let dir = TempDir::new("stdout");
    dir.write(
        "warn.flow",
        "workflow w {\n  step note = kb_write \"notes\" { title: \"t\", content: \"c\" }\n}\n",
    );
    for format in ["json", "github", "human"] {
        let run = flowc_in(
            dir.path(),
            &["build", "warn.flow", "-o", "-", "--format", format],
        );
        assert_eq!(run.code, 0, "{}", run.all());
        let plan: serde_json::Value =
            serde_json::from_str(&run.stdout).expect("stdout is the plan alone");
        assert_eq!(plan["workflows"][0]["name"], "w");
        assert!(run.stderr.contains("W302"), "{format}: {}", run.stderr);
    }
}

/// Regression: JSON output said `"errors": 0` for a path it could not read.
#[test]
fn json_output_names_unreadable_paths() {
    let run = flowc(&["check", "--format", "json", "examples/nope.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    let output: serde_json::Value = serde_json::from_str(&run.stdout).expect("stdout is JSON");
    assert_eq!(output["unreadable"][0]["path"], "examples/nope.flow");
    assert!(
        output["unreadable"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no such file")),
        "{output}"
    );
}

// ---------------------------------------------------------------- init

/// `flowc init DIR` writes a project that passes `flowc check`, `flowc fmt
/// --check`, `flowc test --min-coverage 100` and `flow run` with the offline
/// provider as it stands.
#[test]
fn init_writes_a_project_that_checks_tests_and_runs() {
    let dir = TempDir::new("init");
    let run = flowc_in(dir.path(), &["init", "starter"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(
        run.stdout.contains("created a flow project in starter"),
        "{}",
        run.all()
    );
    let project = dir.path().join("starter");
    for file in [
        "hello.flow",
        "hello.input.json",
        "hello.test.flow",
        ".vscode/settings.json",
        ".vscode/extensions.json",
        "README.md",
        ".gitignore",
    ] {
        assert!(project.join(file).is_file(), "no {file}");
    }
    let extensions = std::fs::read_to_string(project.join(".vscode/extensions.json")).unwrap();
    let extensions: serde_json::Value = serde_json::from_str(&extensions).expect("JSON");
    assert_eq!(extensions["recommendations"][0], "flow.flow-language");

    let check = flowc_in(&project, &["check", "--deny-warnings", "."]);
    assert_eq!(check.code, 0, "{}", check.all());
    let fmt = flowc_in(&project, &["fmt", "--check", "."]);
    assert_eq!(fmt.code, 0, "{}", fmt.all());
    let test = flowc_in(&project, &["test", "--min-coverage", "100"]);
    assert_eq!(test.code, 0, "{}", test.all());
    assert!(
        test.stdout.contains("2 tests: 2 passed, 0 failed"),
        "{}",
        test.all()
    );
    assert!(test.stdout.contains("3/3 branches, 100%"), "{}", test.all());

    let run = std::process::Command::new(flow_tests::flow_path())
        .args([
            "run",
            "hello.flow",
            "--input",
            "hello.input.json",
            "--db",
            "runs.db",
        ])
        .current_dir(&project)
        .env_remove("FLOW_LLM_BASE_URL")
        .output()
        .expect("flow starts");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(" completed"), "{stdout}{stderr}");
    assert!(stderr.contains("offline provider"), "{stderr}");
    let ignored = std::fs::read_to_string(project.join(".gitignore")).unwrap();
    assert!(project.join("runs.db").exists() && ignored.contains("flow.db\n"));
}

/// `flowc init` refuses a folder that holds any of its files, naming them,
/// and writes none of the others.
#[test]
fn init_writes_no_file_over_another() {
    let dir = TempDir::new("init-refuses");
    dir.write("hello.flow", "// mine\n");
    dir.write("README.md", "# mine\n");
    let run = flowc_in(dir.path(), &["init"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(run.stderr.contains("./hello.flow"), "{}", run.stderr);
    assert!(run.stderr.contains("./README.md"), "{}", run.stderr);
    assert!(!run.stderr.contains("hello.test.flow"), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("hello.flow")).unwrap(),
        "// mine\n"
    );
    assert!(!dir.path().join("hello.test.flow").exists());
    assert!(!dir.path().join(".vscode").exists());
}

/// The next command `flowc init` prints reads back in a shell whatever the
/// folder is called (regression, an audit: `cd with space && ...`).
#[test]
fn init_prints_a_next_command_the_shell_reads_back() {
    let dir = TempDir::new("init-quoted");
    let run = flowc_in(dir.path(), &["init", "it's mine"]);
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(
        run.stdout
            .contains(r"next: cd 'it'\''s mine' && flowc check ."),
        "{}",
        run.stdout
    );
}

// ---------------------------------------------------------------- check --watch

/// `flowc check --watch` checks, then checks again when a `.flow` file is
/// changed or added, printing a separator that names the file before the
/// new diagnostics.
#[test]
fn check_watch_checks_again_after_a_change() {
    use std::io::BufRead as _;
    use std::sync::mpsc;

    let dir = TempDir::new("watch");
    let good = "workflow w {\n  input { x: string }\n  output { y: workflow_input.x }\n}\n";
    dir.write("w.flow", good);
    let mut child = std::process::Command::new(flowc_path())
        .args(["check", "--watch", "."])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flowc starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut transcript = String::new();
    let mut wait_for = |wanted: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match received.recv_timeout(left) {
                Ok(line) => {
                    transcript.push_str(&line);
                    transcript.push('\n');
                    if line.contains(wanted) {
                        return;
                    }
                }
                Err(_) => panic!("no line with {wanted:?} within 20 s; saw:\n{transcript}"),
            }
        }
    };
    wait_for("0 errors, 0 warnings in 1 file");
    dir.write(
        "w.flow",
        good.replace("workflow_input.x", "workflow_input.z"),
    );
    wait_for("flowc check --watch: w.flow changed; checking again");
    wait_for("error[E");
    wait_for("1 error");
    dir.write("v.flow", "workflow v {\n}\n");
    wait_for("flowc check --watch: v.flow changed; checking again");
    wait_for("in 2 files");
    let _ = child.kill();
    let _ = child.wait();
}

/// Regression: every `flowc` command that prints panicked ("failed
/// printing to stdout", exit 101) when its reader closed the pipe
/// (`flowc explain --list | head`); it ends as a process killed by SIGPIPE.
#[test]
fn a_closed_stdout_ends_flowc_quietly() {
    let support = root().join("examples/support_triage.flow");
    let support = support.to_str().unwrap();
    for args in [
        &["explain", "--list"][..],
        &["explain", "E103"],
        &["check", support, "--format", "json"],
        &["build", support, "-o", "-"],
        &["graph", support],
        &["test", "examples/", "--format", "json"],
    ] {
        let run = run_with_stdout_closed(&flowc_path(), &root(), args);
        assert!(!run.stderr.contains("panicked"), "{args:?}: {}", run.stderr);
        assert_eq!(run.code, 141, "{args:?}: {}", run.stderr);
    }
}

/// The README's first example is the newcomer's first sight of the
/// language: it checks clean beside the examples' recipes it imports
/// (regression: it called `classify_ticket` without its `plan`, E201).
#[test]
fn the_readme_example_checks() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```flow\n").expect("a flow block") + "```flow\n".len();
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let dir = TempDir::new("flowc-readme");
    let recipes = std::fs::read_to_string(root().join("examples/recipes/support.flow")).unwrap();
    dir.write("recipes/support.flow", recipes);
    dir.write("readme.flow", block);
    let checked = run_in(&flowc_path(), dir.path(), &["check", "readme.flow"]);
    assert_eq!(checked.code, 0, "{block}\n{}", checked.all());
}
