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
