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

/// `flowd serve` answers every request with a JSON problem until it has a
/// route for it, refuses requests without a valid API key, and stops cleanly
/// on SIGTERM.
#[tokio::test]
async fn serve_authenticates_answers_problems_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = TempDir::new("flowd-serve");
    dir.write(
        "flowd.toml",
        "listen = \"127.0.0.1:0\"\nlink_secret = \"0123456789abcdef0123456789abcdef\"\n[[accounts]]\nid = \"acme\"\napi_keys = [\"acme-key-0123456789\"]\n",
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flowd"))
        .arg("serve")
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flowd starts");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut address = None;
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some(found) = line.trim().strip_prefix("flowd: listening on ") {
            address = Some(found.to_string());
            break;
        }
        line.clear();
    }
    let address = address.expect("flowd says where it listens");
    let client = reqwest::Client::new();
    let url = format!("http://{address}/v1/nothing");

    let anonymous = client.get(&url).send().await.expect("flowd answers");
    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        anonymous.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = anonymous.json().await.unwrap();
    assert_eq!(body["code"], "unauthenticated");

    let wrong = client
        .get(&url)
        .bearer_auth("not-a-key-of-anyone")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);

    let unknown = client
        .get(&url)
        .bearer_auth("acme-key-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
    assert_eq!(body["status"], 404);

    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = child.wait().expect("flowd exits");
    assert_eq!(status.code(), Some(0), "a clean stop on SIGTERM");
}
