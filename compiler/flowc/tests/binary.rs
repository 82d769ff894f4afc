//! A smoke test of the `flowc` binary.
//!
//! Its real purpose is to make `cargo test --workspace` build the binary:
//! Cargo builds a package's binaries only for that package's own integration
//! tests, and the end-to-end tests in `tests/tests/flowc.rs` (another package)
//! run `target/<profile>/flowc`.

use std::process::Command;

#[test]
fn flowc_prints_its_version() {
    let output = Command::new(env!("CARGO_BIN_EXE_flowc"))
        .arg("--version")
        .output()
        .expect("flowc starts");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("flowc "), "{stdout}");
}
