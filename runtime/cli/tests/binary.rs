//! A smoke test of the `flow` binary; it also makes `cargo test --workspace`
//! build the binary that the end-to-end tests in `tests/tests/flow.rs` run.

use std::process::Command;

#[test]
fn flow_prints_its_version() {
    let output = Command::new(env!("CARGO_BIN_EXE_flow"))
        .arg("--version")
        .output()
        .expect("flow starts");
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("flow "));
}

/// Regression (an audit): `--as ""` reached the store, and was answered
/// "error:  may not decide this approval", naming nobody.
#[test]
fn a_blank_person_is_refused_as_an_argument() {
    for args in [
        vec!["approve", "run", "gate", "--as", ""],
        vec!["approvals", "--as", " "],
        vec!["notifications", "--as", ""],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_flow"))
            .args(&args)
            .output()
            .expect("flow starts");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("name a person"), "{args:?}: {stderr}");
    }
}
