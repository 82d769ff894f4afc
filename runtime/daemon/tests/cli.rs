//! The `flowd` binary's command line: exit codes and messages.

use flow_tests::{TempDir, run_in};

fn flowd(dir: &TempDir, args: &[&str]) -> flow_tests::Run {
    run_in(
        std::path::Path::new(env!("CARGO_BIN_EXE_flowd")),
        dir.path(),
        args,
    )
}

#[test]
fn check_config_says_ok_or_lists_every_problem() {
    let dir = TempDir::new("flowd-config");
    dir.write(
        "flowd.toml",
        "link_secret = \"0123456789abcdef0123456789abcdef\"\n[[accounts]]\nid = \"acme\"\napi_keys = [\"acme-key-0123456789\"]\n",
    );
    let ok = flowd(&dir, &["check-config"]);
    assert_eq!(ok.code, 0, "{}", ok.all());
    assert_eq!(
        ok.stdout.trim(),
        "flowd.toml: ok (1 accounts, listening on 127.0.0.1:8080, store flowd.db)"
    );

    dir.write("bad.toml", "listen = \"nowhere\"\n");
    let bad = flowd(&dir, &["check-config", "--config", "bad.toml"]);
    assert_eq!(bad.code, 2, "{}", bad.all());
    assert!(
        bad.stderr
            .contains("bad.toml:1:10: `nowhere` is not a listen address")
            && bad.stderr.contains("bad.toml: no link_secret"),
        "{}",
        bad.stderr
    );

    let missing = flowd(&dir, &["check-config", "--config", "none.toml"]);
    assert_eq!(missing.code, 2);
    assert!(
        missing.stderr.contains("cannot read none.toml"),
        "{}",
        missing.stderr
    );

    let unknown = flowd(&dir, &["launch"]);
    assert_eq!(unknown.code, 2);
    assert!(
        unknown.stderr.contains("unknown command `launch`"),
        "{}",
        unknown.stderr
    );
}
