//! The `flowd` binary's command line: exit codes and messages.

mod common;

use common::{ACME, CONFIG, Flowd, GLOBEX, TWO_STEPS};
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

/// flowd's log: `FLOWD_LOG_FORMAT=json` makes every line a JSON object, and a
/// misspelt `FLOWD_LOG` is refused before anything starts rather than
/// silencing the log.
#[test]
fn flowd_logs_json_lines_and_refuses_an_unknown_level() {
    use std::io::{BufRead, BufReader};
    let dir = TempDir::new("flowd-log");
    dir.write("flowd.toml", CONFIG);
    let flowd_path = std::path::Path::new(env!("CARGO_BIN_EXE_flowd"));
    let bad = flow_tests::run_bounded(
        flowd_path,
        dir.path(),
        &["serve"],
        &[("FLOWD_LOG", "loud")],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(bad.code, 2, "{}", bad.all());
    assert!(
        bad.stderr
            .contains("FLOWD_LOG `loud`: `loud` is not a level"),
        "{}",
        bad.stderr
    );

    let mut child = std::process::Command::new(flowd_path)
        .arg("serve")
        .current_dir(dir.path())
        .env("FLOWD_LOG_FORMAT", "json")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flowd starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("flowd exited before listening: {seen:?}"))
            .expect("a line");
        let event: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"));
        assert!(
            event["time"].is_string() && event["level"].is_string(),
            "{event}"
        );
        let listening = event["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("listening on 127.0.0.1:"));
        seen.push(event);
        if listening {
            break;
        }
    }
    assert!(
        seen.iter().any(|event| event["level"] == "WARN"
            && event["message"]
                .as_str()
                .is_some_and(|m| m.contains("no [provider] configured"))),
        "{seen:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Regression (issue 12): a deployed source could not import (every example
/// with imports answered 422 `cannot import recipes/support.flow`). A set of
/// files deploys as `flowc check` checks it: imports from the set, the
/// `flow.lock` beside the root held to, and nothing outside the set read.
#[tokio::test]
async fn a_workflow_with_imports_deploys_as_a_set_of_files() {
    let dir = TempDir::new("flowd-files");
    let flowd = Flowd::start_with(
        &dir,
        &format!("{CONFIG}[accounts.departments]\nsupport = [\"sam@acme.io\"]\n"),
    );
    let examples = flow_tests::root().join("examples");
    let read = |path: &str| std::fs::read_to_string(examples.join(path)).expect("an example");

    let (status, body) = flowd
        .try_deploy(
            ACME,
            serde_json::json!({
                "files": {
                    "support_triage.flow": read("support_triage.flow"),
                    "recipes/support.flow": read("recipes/support.flow"),
                },
                "root": "support_triage.flow",
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["deployments"][0]["workflow"], "support_triage",
        "{body}"
    );

    // Without the imported file: the checker's words, with the file named.
    let (status, body) = flowd
        .try_deploy(
            ACME,
            serde_json::json!({
                "files": { "support_triage.flow": read("support_triage.flow") },
            }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "does_not_check", "{body}");
    let diagnostics = body["diagnostics"].to_string();
    assert!(
        diagnostics.contains("E113") && diagnostics.contains("not among the deployed files"),
        "{body}"
    );
    assert!(diagnostics.contains("support_triage.flow"), "{body}");

    // A lock beside the root that cannot be used is the error flowc reports.
    let (status, body) = flowd
        .try_deploy(
            ACME,
            serde_json::json!({
                "files": {
                    "support_triage.flow": read("support_triage.flow"),
                    "recipes/support.flow": read("recipes/support.flow"),
                    "flow.lock": "{ \"version\": 1, ",
                },
                "root": "support_triage.flow",
            }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["diagnostics"].to_string().contains("E120"), "{body}");

    // Paths stay within the set; several sources need a root.
    for (files, needle) in [
        (
            serde_json::json!({ "../x.flow": "" }),
            "stay within the set",
        ),
        (
            serde_json::json!({ "/etc/passwd.flow": "" }),
            "stay within the set",
        ),
        (
            serde_json::json!({ "notes.txt": "" }),
            "sources and `flow.lock` files only",
        ),
        (
            serde_json::json!({ "a.flow": "", "b.flow": "" }),
            "name the one to deploy with `root`",
        ),
    ] {
        let (status, body) = flowd
            .try_deploy(ACME, serde_json::json!({ "files": files }))
            .await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| d.contains(needle)),
            "{body}"
        );
    }

    // A single source keeps the name its client gave, whatever it is: the
    // rules for a set's paths are not the `source` form's.
    let (status, body) = flowd
        .try_deploy(
            ACME,
            serde_json::json!({
                "source": "workflow named {\n  output { ok: true }\n}\n",
                "path": "/srv/flows/named",
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// `flowd serve` refuses requests without a valid API key, answers unknown
/// routes with a JSON problem, and stops cleanly on SIGTERM.
#[tokio::test]
async fn serve_authenticates_answers_problems_and_stops_on_sigterm() {
    use reqwest::Method;
    let dir = TempDir::new("flowd-serve");
    let flowd = Flowd::start(&dir);
    // Regression (issue 13): nothing said that /metrics was open to anyone,
    // nor which model provider answers.
    assert!(
        flowd.startup.contains("/metrics answers anyone")
            && flowd.startup.contains("offline provider"),
        "{}",
        flowd.startup
    );
    let (status, body) = flowd.send(Method::GET, "/v1/nothing", None, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    let (status, _) = flowd
        .send(
            Method::GET,
            "/v1/nothing",
            Some("not-a-key-of-anyone"),
            None,
        )
        .await;
    assert_eq!(status, 401);
    let (status, body) = flowd
        .send(Method::GET, "/v1/nothing", Some(ACME), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    assert_eq!(body["status"], 404);
    // Regression: of two keys the first decided whom the request was (a
    // proxy adding its own header chose the account).
    let answer = flowd
        .client
        .get(format!("{}/v1/runs", flowd.url))
        .header("authorization", format!("Bearer {ACME}"))
        .header("authorization", format!("Bearer {GLOBEX}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["code"], "several_credentials", "{body}");
    // Regression (issue 13): `bearer` in lower case was refused, though an
    // authentication scheme's name is case-insensitive (RFC 9110).
    for scheme in ["bearer", "BEARER", "Bearer "] {
        let answer = flowd
            .client
            .get(format!("{}/v1/runs", flowd.url))
            .header("authorization", format!("{scheme} {ACME}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "scheme `{scheme}`");
    }
    let answer = flowd
        .client
        .get(format!("{}/v1/runs", flowd.url))
        .header("authorization", format!("Basic {ACME}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401, "another scheme is not a bearer token");
    assert_eq!(flowd.stop(), Some(0), "a clean stop on SIGTERM");
}

/// Regression (issue 13): errors that axum answers itself were plain text
/// or empty: a method a route lacks, a form of another type or too large on
/// an approval link, a path that does not decode. They are problems now.
#[tokio::test]
async fn every_error_is_a_problem_even_those_of_the_framework() {
    let dir = TempDir::new("flowd-problems");
    let flowd = Flowd::start(&dir);
    let url = |path: &str| format!("{}{path}", flowd.url);
    // A client of its own per request: flowd closes the connection of a
    // body it refused unread, which a pooled connection would trip on.
    let fresh = reqwest::Client::new;
    let answers = [
        (
            fresh().put(url("/v1/runs")).bearer_auth(ACME).send(),
            405,
            "method_not_allowed",
        ),
        (
            fresh()
                .post(url("/approvals/some-token"))
                .header("content-type", "text/plain")
                .body("approve")
                .send(),
            415,
            "unsupported_media_type",
        ),
        (
            fresh()
                .post(url("/approvals/some-token"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("comment={}", "x".repeat(3 << 20)))
                .send(),
            413,
            "body_too_large",
        ),
        (
            fresh().get(url("/v1/runs/%ff")).bearer_auth(ACME).send(),
            400,
            "bad_request",
        ),
        (
            fresh()
                .get(url("/v1/runs/run%00x"))
                .bearer_auth(ACME)
                .send(),
            400,
            "bad_request",
        ),
    ];
    for (sent, status, code) in answers {
        let answer = sent.await.unwrap();
        assert_eq!(answer.status(), status);
        let kind = answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(kind, "application/problem+json", "{status}");
        if status == 405 {
            assert!(answer.headers().contains_key("allow"));
        }
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["status"], status, "{body}");
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// Deploy a source, start a run, watch it complete; bad bodies, bad input
/// and another account's keys get problems, and nothing runs for them.
#[tokio::test]
async fn deploy_start_and_read_a_run_scoped_to_its_account() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-api");
    let flowd = Flowd::start(&dir);

    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": TWO_STEPS, "path": "digest.flow" }))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["deployments"][0]["workflow"], "digest");
    assert_eq!(body["deployments"][0]["version"], 1);

    let broken = TWO_STEPS.replace("step.first.summary", "step.first.sumary");
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": broken, "path": "digest.flow" }))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("does_not_check")),
        "{body}"
    );
    assert_eq!(body["diagnostics"][0]["line"], 10, "{body}");

    // Regression (an audit): recipes alone were stored as a plan that no
    // deployment names, counted by no quota and never deleted.
    let (status, body) = flowd
        .try_deploy(
            ACME,
            json!({ "source": "recipe r { model \"m\" input { q: string } output { a: string } prompt \"{{input.q}}\" }" }),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("no_workflow")),
        "{body}"
    );

    // A department must be one of the account's (this account has none).
    let owned = TWO_STEPS.replace(
        "input { text: string }\n  step",
        "input { text: string }\n  department \"support\"\n  step",
    );
    assert_ne!(owned, TWO_STEPS);
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": owned, "path": "digest.flow" }))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("unknown_department")),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("department `support`"),
        "{body}"
    );

    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "digest", "input": { "text": 7 } })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_input")),
        "{body}"
    );
    assert_eq!(body["mismatches"][0]["path"], "/text", "{body}");

    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(GLOBEX),
            Some(json!({ "workflow": "digest", "input": { "text": "x" } })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_workflow")),
        "another account's workflow: {body}"
    );

    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "text": "a long text" } }),
        )
        .await;
    let path = format!("/v1/runs/{run_id}");
    let record = flowd.settled(&run_id, ACME).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert!(record["output"]["summary"].is_string(), "{record}");
    assert_eq!(record["workflow"], "digest");

    // Prometheus scrapes without a key; the run and its steps are counted.
    let metrics = flowd.metrics().await;
    for line in [
        "flow_workflow_executions_total{account=\"acme\",workflow=\"digest\",status=\"completed\"} 1",
        "flow_workflow_duration_seconds_count{account=\"acme\",workflow=\"digest\",status=\"completed\"} 1",
        "flow_step_duration_seconds_count{account=\"acme\",kind=\"recipe\",status=\"completed\"} 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }

    let (_, listed) = flowd.send(Method::GET, "/v1/runs", Some(ACME), None).await;
    assert_eq!(
        listed["runs"].as_array().map(Vec::len),
        Some(1),
        "the refused starts stored nothing: {listed}"
    );
    let (status, body) = flowd.send(Method::GET, &path, Some(GLOBEX), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_run")),
        "{body}"
    );

    // Bodies that are not what the route takes.
    for (path, content_type, body, status) in [
        ("/v1/runs", "application/json", b"{ not json".to_vec(), 400),
        (
            "/v1/runs",
            "application/json",
            br#"{"workflow": 7}"#.to_vec(),
            422,
        ),
        ("/v1/runs", "text/plain", b"{}".to_vec(), 415),
        (
            "/v1/workflows",
            "application/json",
            vec![b' '; 3 * 1024 * 1024],
            413,
        ),
    ] {
        let response = flowd
            .client
            .post(format!("{}{path}", flowd.url))
            .bearer_auth(ACME)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{path} {content_type}");
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression (issue 13): every API key was the account's, so whoever held
/// one could decide as anyone. A user's key (`[[accounts.users]]`) acts as
/// that user only; the account's keys, for services, must name the person.
#[tokio::test]
async fn a_users_key_decides_as_that_user_and_nobody_else() {
    use reqwest::Method;
    use serde_json::json;
    const ANA: &str = "ana-key-0123456789";
    let dir = TempDir::new("flowd-user-keys");
    let flowd = Flowd::start_with(
        &dir,
        &format!("{CONFIG}[[accounts.users]]\nemail = \"ana@acme.io\"\napi_keys = [\"{ANA}\"]\n"),
    );
    flowd
        .deploy(
            ACME,
            r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  output { by: step.ok.approver }
}
"#,
        )
        .await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "refund" })).await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );

    // Ana's key reads her gates without naming her, and no one else's.
    let (status, body) = flowd
        .send(Method::GET, "/v1/approvals", Some(ANA), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approvals"][0]["run_id"], run_id.as_str(), "{body}");
    for path in [
        "/v1/approvals?approver=eve@acme.io",
        "/v1/notifications?reader=eve@acme.io",
    ] {
        let (status, body) = flowd.send(Method::GET, path, Some(ANA), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("not_this_person")),
            "{path}: {body}"
        );
    }
    let (status, body) = flowd
        .send(Method::GET, "/v1/notifications", Some(ANA), None)
        .await;
    assert_eq!(status, 200, "{body}");

    let gate = format!("/v1/runs/{run_id}/approvals/ok");
    let (status, body) = flowd
        .send(
            Method::POST,
            &gate,
            Some(ANA),
            Some(json!({ "approver": "eve@acme.io", "approved": true })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("not_this_person")),
        "{body}"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &gate,
            Some(ACME),
            Some(json!({ "approved": true })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("no_person")),
        "a service's key names the person: {body}"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &gate,
            Some(ANA),
            Some(json!({ "approved": true })),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let done = flowd.settled(&run_id, ACME).await;
    assert_eq!(done["output"], json!({ "by": "ana@acme.io" }), "{done}");
    assert_eq!(flowd.stop(), Some(0));
}

/// A gate naming an approver group: it parks, a member decides over HTTP
/// (once), and the run completes; outsiders and other accounts are refused.
#[tokio::test]
async fn an_approval_is_decided_over_http_by_a_group_member() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-approve");
    let flowd = Flowd::start(&dir);
    let gated = r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  output { approved: step.ok.approved, by: step.ok.approver }
}
"#;
    flowd.deploy(ACME, gated).await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "refund" })).await;
    let parked = flowd.settled(&run_id, ACME).await;
    assert_eq!(parked["status"], "pending_approval", "{parked}");
    assert_eq!(parked["pending_approvals"][0]["path"], "ok");
    let metrics = flowd.metrics().await;
    assert!(
        metrics.contains(r#"flow_approvals_pending{account="acme",workflow="refund"} 1"#),
        "{metrics}"
    );

    let gate = format!("/v1/runs/{run_id}/approvals/ok");
    let by = |approver: &str| json!({ "approver": approver, "approved": true, "comment": "fine" });
    let (status, body) = flowd
        .send(Method::POST, &gate, Some(ACME), Some(by("eve@acme.io")))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("not_an_approver")),
        "{body}"
    );
    // Regression (issue 13): the group's name decided as if a person; and
    // (an audit) so did the name in other letters, which a gate's
    // approvers match without case.
    let (status, body) = flowd
        .send(Method::POST, &gate, Some(ACME), Some(by(" ")))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("no_person")),
        "a blank name is no one: {body}"
    );
    for group in ["LEADS", "leads"] {
        let (status, body) = flowd
            .send(Method::POST, &gate, Some(ACME), Some(by(group)))
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("not_an_approver")),
            "{group}: {body}"
        );
    }
    let (_, body) = flowd
        .send(Method::POST, &gate, Some(ACME), Some(by("leads")))
        .await;
    assert!(
        body["detail"].as_str().unwrap().contains("ana@acme.io"),
        "the hint names the group's members: {body}"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{run_id}/approvals/nope"),
            Some(ACME),
            Some(by("ana@acme.io")),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_step")),
        "{body}"
    );
    // Another account's key reaches nothing of the run.
    for (method, path) in [
        (Method::GET, format!("/v1/runs/{run_id}/trace")),
        (Method::GET, format!("/v1/runs/{run_id}/test")),
        (Method::POST, format!("/v1/runs/{run_id}/cancel")),
        (Method::GET, format!("/v1/runs?before={run_id}")),
    ] {
        let (status, body) = flowd.send(method, &path, Some(GLOBEX), None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = flowd
        .send(Method::POST, &gate, Some(GLOBEX), Some(by("ana@acme.io")))
        .await;
    assert_eq!(status, 404, "another account's run");
    // A member's address in another case is the member (groups ignore case).
    let (status, body) = flowd
        .send(Method::POST, &gate, Some(ACME), Some(by("Ana@Acme.io")))
        .await;
    assert_eq!(status, 202, "{body}");
    let done = flowd.settled(&run_id, ACME).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["output"],
        json!({ "approved": true, "by": "ana@acme.io" })
    );
    // The run as a test: the decision and the output, as `flow test-from`
    // writes them.
    let (status, body) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/test"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let test = body["test"].as_str().unwrap();
    for line in [
        "decide step.ok approve by \"ana@acme.io\"",
        "expect status completed",
        "expect output.by == \"ana@acme.io\"",
    ] {
        assert!(test.contains(line), "{line} in {test}");
    }
    assert!(
        !flowd
            .metrics()
            .await
            .contains(r#"flow_approvals_pending{account="acme",workflow="refund"}"#),
        "nothing waits any more"
    );
    let (status, body) = flowd
        .send(Method::POST, &gate, Some(ACME), Some(by("ana@acme.io")))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("decision_refused")),
        "decided once: {body}"
    );

    // The run is listed for its account only, and its trace shows the gate.
    let (_, body) = flowd
        .send(Method::GET, "/v1/runs?status=completed", Some(ACME), None)
        .await;
    assert_eq!(body["runs"][0]["run_id"], run_id.as_str(), "{body}");
    let (_, body) = flowd
        .send(Method::GET, "/v1/runs", Some(GLOBEX), None)
        .await;
    assert_eq!(body["runs"], json!([]), "{body}");
    let (status, body) = flowd
        .send(Method::GET, "/v1/runs?status=bogus", Some(ACME), None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_query")),
        "{body}"
    );
    let (status, body) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["steps"][0]["path"], "ok", "{body}");
    assert_eq!(
        body["steps"][0]["output"]["approver"], "ana@acme.io",
        "{body}"
    );
    let (status, _) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(GLOBEX),
            None,
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(flowd.stop(), Some(0));
}

/// flowd killed with SIGKILL while runs are in flight, then started again,
/// resumes them all at once with one line of log, finishes them, and no
/// completed step is called twice at the LLM. Started in between without
/// its `[provider]`, it leaves them as they are: they began with the
/// model, and the offline provider's made-up answers would have completed
/// them (regression).
#[tokio::test]
async fn a_killed_flowd_finishes_every_run_without_repeating_completed_steps() {
    use reqwest::Method;
    use serde_json::json;
    use std::time::Duration;

    let server = common::chain_model(Duration::from_millis(100)).await;
    let config = format!("{CONFIG}{}", common::fake_model(&server.url));
    let mut source = String::from(
        "recipe answer { model \"default\" input { q: string } output { text: string, score: int } prompt \"{{input.q}}\" }\nworkflow chain {\n  input { tag: string }\n",
    );
    const STEPS: usize = 6;
    const RUNS: usize = 4;
    for i in 0..STEPS {
        source.push_str(&format!(
            "  step s{i} = answer {{ q: \"{{{{workflow_input.tag}}}} step {i}\" }}\n"
        ));
    }
    source.push_str("  output { last: step.s5.text }\n}\n");

    let dir = TempDir::new("flowd-crash");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, &source).await;
    let mut ids = Vec::new();
    for r in 0..RUNS {
        let (status, body) = flowd
            .send(
                Method::POST,
                "/v1/runs",
                Some(ACME),
                Some(json!({ "workflow": "chain", "input": { "tag": format!("run{r}") } })),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        ids.push(body["run_id"].as_str().unwrap().to_string());
    }
    server.until_requests(RUNS * 2).await;
    drop(flowd); // SIGKILL: no graceful stop, runs mid-step.
    assert!(
        server.requests() < RUNS * STEPS,
        "the runs were still in flight when flowd was killed"
    );

    let offline = Flowd::start_with(&dir, CONFIG);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for id in &ids {
        let (status, body) = offline
            .send(Method::GET, &format!("/v1/runs/{id}"), Some(ACME), None)
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "running", "{body}");
    }
    drop(offline);

    let flowd = Flowd::start_with(&dir, &config);
    // Resumed at start, before flowd listens (not by the orphan sweep
    // seconds later), and said in one line however many runs there are.
    let resumed: Vec<&str> = flowd
        .startup
        .lines()
        .filter(|line| line.contains("resumed") || ids.iter().any(|id| line.contains(id)))
        .collect();
    assert_eq!(resumed.len(), 1, "{}", flowd.startup);
    assert!(
        resumed[0].ends_with(&format!("resumed {RUNS} unfinished run(s)")),
        "{}",
        flowd.startup
    );
    for id in &ids {
        let record = flowd.settled(id, ACME).await;
        assert_eq!(record["status"], "completed", "{record}");
    }
    let prompts = server.prompts();
    for r in 0..RUNS {
        let mut repeated = 0;
        for i in 0..STEPS {
            let prompt = format!("run{r} step {i}");
            let calls = prompts.iter().filter(|p| **p == prompt).count();
            assert!(
                (1..=2).contains(&calls),
                "{prompt} was called {calls} times"
            );
            repeated += calls - 1;
        }
        assert!(
            repeated <= 1,
            "run{r}: only the step in flight may run again"
        );
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// A parked run cancelled over HTTP stays cancelled: its gate can no longer
/// be decided, and a second cancel says it has ended.
#[tokio::test]
async fn a_cancelled_run_cannot_be_resumed() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-cancel");
    let flowd = Flowd::start(&dir);
    let gated = "workflow w {\n  step ok = approval { approvers: [\"ana@acme.io\"], message: \"go?\" }\n}\n";
    flowd.deploy(ACME, gated).await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "w" })).await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );

    let cancel = format!("/v1/runs/{run_id}/cancel");
    let (status, _) = flowd.send(Method::POST, &cancel, Some(GLOBEX), None).await;
    assert_eq!(status, 404, "another account's run");
    let (status, body) = flowd.send(Method::POST, &cancel, Some(ACME), None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "cancelled");
    let (status, body) = flowd.approve(ACME, &run_id, "ok").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("decision_refused")),
        "{body}"
    );
    let (status, body) = flowd.send(Method::POST, &cancel, Some(ACME), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("run_ended")),
        "{body}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// A run's end is posted to the configured webhook, signed with HMAC-SHA256
/// over the body; when the receiver first answers 500, the delivery is
/// retried and then counted as delivered.
#[tokio::test]
async fn webhooks_are_signed_and_retried_after_a_500() {
    use axum::http::{HeaderMap, StatusCode};
    use hmac::{Hmac, Mac};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    type Received = Arc<Mutex<Vec<(HeaderMap, String)>>>;
    let received: Received = Arc::default();
    let receiver = {
        let received = Arc::clone(&received);
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: String| async move {
                let mut seen = received.lock().unwrap();
                seen.push((headers, body));
                if seen.len() == 1 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::NO_CONTENT
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    const SECRET: &str = "whsec-0123456789abcdef";
    let config = format!(
        "{CONFIG}[[accounts.webhooks]]\nname = \"crm\"\nurl = \"{hook_url}\"\nsecret = \"{SECRET}\"\nevents = [\"completed\"]\n"
    );
    let dir = TempDir::new("flowd-webhook");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, TWO_STEPS).await;
    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "text": "t" } }),
        )
        .await;
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "completed");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while received.lock().unwrap().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no retry after the 500"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let deliveries = received.lock().unwrap().clone();
    assert_eq!(
        deliveries.len(),
        2,
        "delivered once the receiver answered 2xx"
    );
    let (headers, body) = &deliveries[1];
    assert_eq!(headers["x-flow-event"], "completed");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        headers["x-flow-signature"],
        format!("sha256={expected}").as_str()
    );
    // Standard Webhooks: the same id on the retry, and the signature of
    // `id.timestamp.body`.
    let (first_headers, _) = &deliveries[0];
    assert_eq!(first_headers["webhook-id"], headers["webhook-id"]);
    let id = headers["webhook-id"].to_str().unwrap();
    // Regression: the id ended in the events' row id, which counts every
    // account's events, then in the time of the event, which two events
    // of a run may share; now in a tag of the row.
    let tag = id
        .strip_prefix(&format!("msg_{run_id}_completed_"))
        .unwrap_or_else(|| panic!("{id}"));
    assert!(
        tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let timestamp = headers["webhook-timestamp"].to_str().unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    use base64::Engine as _;
    let standard = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    assert_eq!(
        headers["webhook-signature"],
        format!("v1,{standard}").as_str()
    );
    let event: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(event["event"], "completed");
    assert_eq!(event["account"], "acme");
    assert_eq!(event["run"]["run_id"], run_id.as_str());
    assert_eq!(event["run"]["workflow"], "digest");

    // flowd counts the delivery once the receiver's answer is back.
    flowd
        .metric_reaches(
            "flow_webhook_deliveries_total{account=\"acme\",result=\"delivered\"} 1",
            std::time::Duration::from_secs(10),
        )
        .await;
    assert_eq!(flowd.stop(), Some(0));
}

/// Cancelling a run while it executes stops it: no step starts after the
/// cancel, and it stays cancelled.
#[tokio::test]
async fn a_running_run_is_stopped_by_cancel() {
    use flow_tests::fake_llm::FakeLlm;
    use reqwest::Method;
    use serde_json::json;
    use std::time::Duration;

    let server = FakeLlm::start(
        vec![],
        json!({ "summary": "s" }),
        Duration::from_millis(100),
    )
    .await;
    let config = format!("{CONFIG}{}", common::fake_model(&server.url));
    let dir = TempDir::new("flowd-cancel-running");
    let flowd = Flowd::start_with(&dir, &config);
    let mut source = String::from(TWO_STEPS);
    source.push_str("workflow long {\n  input { text: string }\n");
    for i in 0..20 {
        source.push_str(&format!(
            "  step s{i} = summarize {{ text: workflow_input.text }}\n"
        ));
    }
    source.push_str("}\n");
    flowd.deploy(ACME, &source).await;
    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "long", "input": { "text": "t" } }),
        )
        .await;
    server.until_requests(2).await;
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{run_id}/cancel"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let at_cancel = server.requests();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        server.requests() <= at_cancel + 1,
        "steps went on after the cancel: {} calls, {at_cancel} at the cancel",
        server.requests()
    );
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "cancelled");
    assert_eq!(flowd.stop(), Some(0));
}

/// Posts an approval page's form, as a browser would.
fn confirm(client: &reqwest::Client, link: &str, comment: &str) -> reqwest::RequestBuilder {
    client
        .post(link)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("comment={}", comment.replace(' ', "+")))
}

/// The links of an approval email, approve first.
fn links_in(mail: &flow_tests::smtp_sink::Mail) -> (String, String) {
    let find = |label: &str| {
        mail.body
            .lines()
            .find_map(|line| line.strip_prefix(label))
            .unwrap_or_else(|| panic!("no `{label}` line in {}", mail.body))
            .trim()
            .to_string()
    };
    (find("Approve: "), find("Reject: "))
}

/// Regression: a gate rejected by its email's link, its run redriven, was
/// decided again by the other link of that email, and the rejection was
/// lost. A link answers the asking it was sent for only.
#[tokio::test]
async fn a_link_does_not_decide_a_gate_asked_again_after_a_redrive() {
    use reqwest::Method;
    use serde_json::json;
    let sink = flow_tests::smtp_sink::SmtpSink::refusing(0).await;
    let dir = TempDir::new("flowd-link-redrive");
    let config = format!(
        "{CONFIG}
[smtp]
host = \"127.0.0.1\"
port = {port}
from = \"flowd@acme.io\"
tls = \"none\"
",
        port = sink.port
    );
    let flowd = Flowd::start_with(&dir, &config);
    let source = r#"workflow refund {
  step ok = approval { approvers: ["boss@acme.io"], message: "Refund?" }
}
"#;
    flowd.deploy(ACME, source).await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "refund" })).await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    let (approve, reject) = links_in(&sink.wait_for(1).await[0]);
    let client = reqwest::Client::new();
    let rejected = confirm(&client, &reject, "no").send().await.unwrap();
    assert_eq!(rejected.status(), 200);
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "failed");
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{run_id}/redrive"),
            Some(ACME),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    let shown = client.get(&approve).send().await.unwrap();
    assert_eq!(shown.status(), 409);
    assert!(shown.text().await.unwrap().contains("Asked again"));
    let again = confirm(&client, &approve, "").send().await.unwrap();
    assert_eq!(again.status(), 409);
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval",
        "the old link decided nothing"
    );
    // The gate asked again is emailed again, and its new link decides it.
    let mails = sink.wait_for(2).await;
    let (approve, _) = links_in(&mails[1]);
    let approved = confirm(&client, &approve, "yes").send().await.unwrap();
    assert_eq!(approved.status(), 200);
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "completed");
    // The rejection stays in the trace, as an attempt of the gate.
    let (_, trace) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(ACME),
            None,
        )
        .await;
    let text = trace.to_string();
    assert!(
        text.contains("rejected: boss@acme.io rejected the approval: no"),
        "{trace}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// A parked run emails every eligible approver (a named one and each member
/// of a named group) signed approve and reject links and lists the gate as
/// theirs; following a link only shows the request, confirming decides it
/// once, a tampered or already used link is refused; the handoff after it is
/// emailed to each member of the department and listed as a notification.
/// The sink refuses the first message, so delivery is retried.
#[tokio::test]
async fn approvals_and_handoffs_are_emailed_with_signed_single_use_links() {
    use reqwest::Method;
    use serde_json::json;
    let sink = flow_tests::smtp_sink::SmtpSink::refusing(1).await;
    let dir = TempDir::new("flowd-emails");
    let config = format!(
        "{CONFIG}
[accounts.departments]
support = [\"sam@acme.io\", \"sue@acme.io\"]
[smtp]
host = \"127.0.0.1\"
port = {port}
from = \"flowd@acme.io\"
tls = \"none\"
",
        port = sink.port
    )
    .replace(
        "leads = [\"ana@acme.io\"]",
        "leads = [\"ana@acme.io\", \"al@acme.io\"]",
    );
    let flowd = Flowd::start_with(&dir, &config);
    let source = r#"workflow refund {
  department "support"
  step ok = approval { approvers: ["leads", "boss@acme.io"], message: "Refund 40 EUR to Ada?", expires: 2h }
  step tell = handoff "support" { message: "Refund for Ada approved" }
  output { by: step.ok.approver, comment: step.ok.comment }
}
"#;
    flowd.deploy(ACME, source).await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "refund" })).await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );

    let mails = sink.wait_for(3).await;
    let mut to: Vec<&str> = mails.iter().map(|m| m.to[0].as_str()).collect();
    to.sort_unstable();
    assert_eq!(to, ["al@acme.io", "ana@acme.io", "boss@acme.io"]);
    for mail in &mails {
        assert_eq!(mail.from, "flowd@acme.io");
        assert_eq!(mail.header("Subject"), Some("Approval needed: refund (ok)"));
        // Quoted after the links, so that a message cannot pose as them.
        assert!(
            mail.body.contains("> Refund 40 EUR to Ada?"),
            "{}",
            mail.body
        );
        // Regression: the gate's `expires` (a duration) was read as a
        // deadline, and every link was expired in 1970 when it was sent.
        assert!(!mail.body.contains("1970"), "{}", mail.body);
        assert!(
            mail.body
                .contains(&format!("{}/inspector#/runs/{run_id}", flowd.url)),
            "{}",
            mail.body
        );
    }
    let mail_to = |who: &str| mails.iter().find(|m| m.to[0] == who).unwrap().clone();
    let (ana_approve, _) = links_in(&mail_to("ana@acme.io"));
    let (al_approve, _) = links_in(&mail_to("al@acme.io"));
    let (_, boss_reject) = links_in(&mail_to("boss@acme.io"));
    assert!(ana_approve.starts_with(&flowd.url), "{ana_approve}");

    // The gate is listed as ana's (through her group) and the boss's only.
    let mine = |who: &str, key: &'static str| {
        let path = format!("/v1/approvals?approver={who}");
        let flowd = &flowd;
        async move { flowd.send(Method::GET, &path, Some(key), None).await.1 }
    };
    let ana = mine("ana@acme.io", ACME).await;
    assert_eq!(ana["approvals"][0]["step_path"], "ok", "{ana}");
    assert_eq!(ana["approvals"][0]["run_id"], run_id.as_str());
    assert_eq!(
        mine("boss@acme.io", ACME).await["approvals"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(mine("eve@acme.io", ACME).await["approvals"], json!([]));
    assert_eq!(mine("ana@acme.io", GLOBEX).await["approvals"], json!([]));
    let (_, body) = flowd
        .send(
            Method::GET,
            "/v1/notifications?reader=ana@acme.io",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(body["notifications"][0]["kind"], "approval", "{body}");
    assert_eq!(body["notifications"][0]["audience"], "leads", "{body}");

    let client = reqwest::Client::new();
    // Following a link shows the request and decides nothing.
    let page = client.get(&ana_approve).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("Approve this request?"), "{html}");
    assert!(html.contains("Refund 40 EUR to Ada?"), "{html}");
    assert!(html.contains("ana@acme.io"), "{html}");
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    // A link changed in any way is refused.
    let mut tampered = ana_approve.clone().into_bytes();
    let at = tampered.len() - 3;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(client.get(&tampered).send().await.unwrap().status(), 403);
    assert_eq!(
        confirm(&client, &tampered, "x")
            .send()
            .await
            .unwrap()
            .status(),
        403
    );

    // Confirming decides, once.
    let confirmed = confirm(&client, &ana_approve, "ok by me")
        .send()
        .await
        .unwrap();
    assert_eq!(confirmed.status(), 200);
    assert!(
        confirmed
            .text()
            .await
            .unwrap()
            .contains("You approved step")
    );
    let done = flowd.settled(&run_id, ACME).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["output"],
        json!({ "by": "ana@acme.io", "comment": "ok by me" })
    );
    for used in [&ana_approve, &al_approve, &boss_reject] {
        let again = confirm(&client, used, "").send().await.unwrap();
        assert_eq!(again.status(), 409, "{used}");
        assert!(again.text().await.unwrap().contains("Already decided"));
    }

    // The handoff went to each member of the department, by email and in app.
    let mails = sink.wait_for(5).await;
    let handoffs: Vec<_> = mails
        .iter()
        .filter(|m| m.body.contains("Refund for Ada approved"))
        .collect();
    let mut to: Vec<&str> = handoffs.iter().map(|m| m.to[0].as_str()).collect();
    to.sort_unstable();
    assert_eq!(to, ["sam@acme.io", "sue@acme.io"]);
    let (_, body) = flowd
        .send(
            Method::GET,
            "/v1/notifications?reader=sam@acme.io",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(body["notifications"][0]["kind"], "handoff", "{body}");
    assert_eq!(body["notifications"][0]["read"], false, "{body}");
    let id = body["notifications"][0]["id"].clone();
    // Regression (an audit): the id was the store's row, which counts every
    // account's notifications; now a number of the account's own for it.
    assert!(
        id.as_i64().is_some_and(|id| id > 1 << 20 && id < 1 << 52),
        "{id}"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/notifications/read",
            Some(ACME),
            Some(json!({ "reader": "sam@acme.io", "ids": [id] })),
        )
        .await;
    assert_eq!((status, &body["marked"]), (200, &json!(1)), "{body}");
    let (_, body) = flowd
        .send(
            Method::GET,
            "/v1/notifications?reader=sam@acme.io&unread=true",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(body["notifications"], json!([]), "{body}");
    let (_, body) = flowd
        .send(
            Method::GET,
            "/v1/notifications?reader=sam@acme.io",
            Some(GLOBEX),
            None,
        )
        .await;
    assert_eq!(body["notifications"], json!([]), "another account's");

    let metrics = flowd.metrics().await;
    assert!(
        metrics.contains(r#"flow_emails_total{account="acme",kind="approval",result="sent"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"flow_emails_total{account="acme",kind="handoff",result="sent"} 2"#),
        "{metrics}"
    );

    // Another account's workflow reaches neither acme's approver group nor
    // an address it names outside its own people's domains: flowd is no
    // relay for links and text to whoever a caller names.
    flowd
        .deploy(
            GLOBEX,
            r#"workflow lure {
  step ok = approval { approvers: ["leads", "mallory@evil.example"], message: "Urgent: approve" }
}
"#,
        )
        .await;
    let lure = flowd.start_run(GLOBEX, json!({ "workflow": "lure" })).await;
    assert_eq!(
        flowd.settled(&lure, GLOBEX).await["status"],
        "pending_approval"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !flowd
        .metrics()
        .await
        .contains(r#"flow_emails_total{account="globex",kind="approval",result="skipped"} 2"#)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            flowd.metrics().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sink.mails().len(), 5, "nothing more was sent");
    assert_eq!(flowd.stop(), Some(0));
}

/// Twenty concurrent retries of a start with one `Idempotency-Key` start one
/// run and all answer it; the key with another input is refused; another
/// account's key space is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_starts_one_run_however_often_it_is_sent() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-idempotency");
    let flowd = std::sync::Arc::new(Flowd::start(&dir));
    let source =
        "workflow greet {\n  input { name: string }\n  output { hello: workflow_input.name }\n}\n";
    for key in [ACME, GLOBEX] {
        flowd.deploy(key, source).await;
    }
    let start = |account: &'static str, key: &'static str, name: &'static str| {
        let flowd = std::sync::Arc::clone(&flowd);
        async move {
            let response = flowd
                .client
                .post(format!("{}/v1/runs", flowd.url))
                .bearer_auth(account)
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(json!({ "workflow": "greet", "input": { "name": name } }).to_string())
                .send()
                .await
                .expect("flowd answers");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap();
            (status, body)
        }
    };
    let tries: Vec<_> = (0..20)
        .map(|_| tokio::spawn(start(ACME, "order-42", "Ada")))
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for attempt in tries {
        let (status, body) = attempt.await.unwrap();
        assert!(matches!(status, 200 | 202), "{status} {body}");
        created += usize::from(status == 202);
        ids.insert(body["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!((created, ids.len()), (1, 1), "one run: {ids:?}");
    let (_, listed) = flowd
        .send(Method::GET, "/v1/runs?workflow=greet", Some(ACME), None)
        .await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1, "{listed}");

    let (status, body) = start(ACME, "order-42", "Bob").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{body}"
    );
    let (status, body) = start(GLOBEX, "order-42", "Bob").await;
    assert_eq!(status, 202, "globex's keys are its own: {body}");
    // Regression: a key with a blank was taken, though keys are visible
    // ASCII.
    for key in ["", "order 43"] {
        let (status, body) = start(ACME, key, "Ada").await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_idempotency_key")),
            "`{key}`: {body}"
        );
    }

    // After a new version: the key with no version still answers the first
    // run; naming the version it ran too; naming another is refused.
    flowd
        .deploy(
            ACME,
            &source.replace("hello: workflow_input.name", "hello: \"hi\""),
        )
        .await;
    for (version, expected) in [(None, 200), (Some(1), 200), (Some(2), 422)] {
        let response = flowd
            .client
            .post(format!("{}/v1/runs", flowd.url))
            .bearer_auth(ACME)
            .header("content-type", "application/json")
            .header("idempotency-key", "order-42")
            .body(
                json!({ "workflow": "greet", "version": version, "input": { "name": "Ada" } })
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), expected, "version {version:?}");
    }
}

/// `/v1/openapi.json` is served without a key and describes every `/v1`
/// route, with the bearer scheme and the problem object.
#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let dir = TempDir::new("flowd-openapi");
    let flowd = Flowd::start(&dir);
    let (status, document) = flowd
        .send(reqwest::Method::GET, "/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, 200, "{document}");
    let mut routes: Vec<String> = document["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| format!("{} {path}", method.to_uppercase()))
        })
        .collect();
    routes.sort();
    assert_eq!(
        routes,
        [
            "DELETE /v1/kb/documents",
            "DELETE /v1/runs/{id}",
            "DELETE /v1/workflows/{workflow}",
            "GET /v1/approvals",
            "GET /v1/notifications",
            "GET /v1/runs",
            "GET /v1/runs/{id}",
            "GET /v1/runs/{id}/graph",
            "GET /v1/runs/{id}/test",
            "GET /v1/runs/{id}/trace",
            "GET /v1/workflows",
            "POST /v1/notifications/read",
            "POST /v1/runs",
            "POST /v1/runs/{id}/approvals/{step_path}",
            "POST /v1/runs/{id}/cancel",
            "POST /v1/runs/{id}/redrive",
            "POST /v1/workflows",
            "POST /v1/workflows/{workflow}/migrate",
        ]
    );
    assert_eq!(
        document["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );
    let start = &document["paths"]["/v1/runs"]["post"]["responses"];
    for status in ["202", "401", "415", "422", "503"] {
        assert!(
            start.get(status).is_some(),
            "POST /v1/runs documents {status}"
        );
    }
    assert!(document["components"]["schemas"]["Problem"]["properties"]["code"].is_object());
    let (status, body) = flowd
        .send(reqwest::Method::GET, "/inspector/nope.js", None, None)
        .await;
    assert_eq!(status, 404, "no key asked for a missing file: {body}");
    // Regression (an audit): `/inspector/` asked for a key.
    let slashed = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/inspector/", flowd.url))
        .send()
        .await
        .expect("flowd answers");
    assert_eq!(slashed.status().as_u16(), 308);
    assert_eq!(slashed.headers()["location"], "/inspector");
}

/// With `otlp_endpoint` set, a run's trace reaches an OTLP receiver: one span
/// for the run and one per step, in one trace, loop iterations' steps under
/// the loop's span and top-level steps under the run's, with the workflow,
/// run, path, kind and attempt attributes; a run parked and resumed by a
/// decision still adds to the same trace.
#[tokio::test]
async fn a_run_is_traced_to_an_otlp_receiver() {
    use common::{OtlpReceiver, attribute};
    use reqwest::Method;
    use serde_json::json;
    let receiver = OtlpReceiver::start().await;
    let dir = TempDir::new("flowd-otlp");
    let flowd = Flowd::start_with(
        &dir,
        &format!("otlp_endpoint = \"{}\"\n{CONFIG}", receiver.url),
    );
    let source = r#"recipe shout { model "m" input { word: string } output { loud: string } prompt "{{input.word}}" }
workflow echo {
  input { words: list<string> }
  step first = shout { word: "hello" }
  for workflow_input.words as each {
    step one = shout { word: loop_item }
  }
  step ok = approval { approvers: ["boss@acme.io"], message: "Go?" }
  output { n: step.first.loud }
}
"#;
    flowd.deploy(ACME, source).await;
    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "echo", "input": { "words": ["s3cret-a", "s3cret-b"] } }),
        )
        .await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{run_id}/approvals/ok"),
            Some(ACME),
            Some(json!({ "approver": "boss@acme.io", "approved": true })),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "completed");

    // The decided gate's span is sent on its own, when it is decided.
    receiver.wait_for("run echo").await;
    let spans = receiver.wait_for("approval ok").await;
    let by_path = |path: &str| {
        spans
            .iter()
            .find(|s| attribute(s, "flow.step.path") == path)
            .unwrap_or_else(|| panic!("no span of `{path}` in {spans:#?}"))
    };
    let run = spans.iter().find(|s| s["name"] == "run echo").unwrap();
    assert_eq!(attribute(run, "flow.run.id"), run_id);
    assert_eq!(attribute(run, "flow.workflow.name"), "echo");
    assert_eq!(run["status"]["code"], 1);
    let trace = run["traceId"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert!(spans.iter().all(|s| s["traceId"] == trace), "one trace");
    // Spans say what ran, never with what: no input or output in them.
    let exported = serde_json::to_string(&spans).unwrap();
    assert!(!exported.contains("s3cret"), "{exported}");

    let first = by_path("first");
    assert_eq!(first["parentSpanId"], run["spanId"]);
    assert_eq!(first["name"], "recipe first");
    assert_eq!(attribute(first, "flow.step.kind"), "recipe");
    assert_eq!(attribute(first, "flow.step.attempts"), "1");
    let each = by_path("each");
    assert_eq!(each["name"], "loop each");
    assert_eq!(each["parentSpanId"], run["spanId"]);
    for iteration in ["each[0]/one", "each[1]/one"] {
        assert_eq!(
            by_path(iteration)["parentSpanId"],
            each["spanId"],
            "{iteration}"
        );
    }
    // The gate, decided in a second invocation, is in the same trace.
    assert_eq!(by_path("ok")["parentSpanId"], run["spanId"]);
    let metrics = flowd.metrics().await;
    assert!(
        metrics.contains(r#"flow_trace_exports_total{result="delivered"}"#),
        "{metrics}"
    );
}

/// Regression: flowd read a deployed plan into a tree of values first,
/// which serde_json stops at 128 levels, so a plan of 40 nested branches
/// that `flowc build` wrote (169 levels) was refused as "not JSON", and
/// `flow --server` could not send it at all. Both now pass it on as text,
/// and the plan's own reader bounds its depth.
#[tokio::test]
async fn a_plan_nested_deeper_than_128_levels_deploys() {
    let dir = TempDir::new("flowd-deep-plan");
    let flowd = Flowd::start(&dir);
    let depth = 40;
    let mut source = String::from("workflow deep {\n  input { x: int }\n");
    for level in 0..depth {
        source.push_str(&format!("if workflow_input.x > {level} {{\n"));
    }
    source.push_str("step wait = approval { approvers: [\"boss@acme.io\"], message: \"go?\" }\n");
    source.push_str(&"}\n".repeat(depth));
    source.push_str("  output { x: workflow_input.x }\n}\n");
    let checked = flow_compiler::check_source("deep.flow", &source);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    let plan = flow_compiler::lower(&checked)
        .expect("lowers")
        .seal()
        .to_json();

    let answer = flowd
        .client
        .post(format!("{}/v1/workflows", flowd.url))
        .bearer_auth(ACME)
        .header("content-type", "application/json")
        .body(format!(r#"{{"plan": {plan}}}"#))
        .send()
        .await
        .expect("flowd answers");
    let status = answer.status().as_u16();
    assert_eq!(status, 201, "{}", answer.text().await.unwrap());

    dir.write("deep.flow", &source);
    dir.write("input.json", r#"{ "x": 50 }"#);
    let flow = flow_tests::flow_path();
    let args = ["--server", flowd.url.as_str(), "--api-key", ACME];
    let run = run_in(
        &flow,
        dir.path(),
        &[&args[..], &["run", "deep.flow", "--input", "input.json"]].concat(),
    );
    assert_eq!(run.code, 3, "parked at the innermost step: {}", run.all());
}

/// A deploy's body holds one of `source`, `files` and `plan`; any other
/// shape is refused with what the route takes and what was wrong.
#[tokio::test]
async fn a_deploy_of_another_shape_says_what_it_takes() {
    use serde_json::json;
    let dir = TempDir::new("flowd-deploy-shape");
    let flowd = Flowd::start(&dir);
    let source = "workflow w {\n  input { x: int }\n  output { x: workflow_input.x }\n}\n";
    let plan: serde_json::Value = serde_json::from_str(
        &flow_compiler::lower(&flow_compiler::check_source("w.flow", source))
            .expect("lowers")
            .seal()
            .to_json(),
    )
    .unwrap();
    for (case, body, says) in [
        ("nothing", json!({}), "none of them"),
        (
            "two at once",
            json!({ "source": source, "plan": plan }),
            "more than one of them",
        ),
        (
            "a path alone",
            json!({ "path": "w.flow" }),
            "`path` names a `source`",
        ),
        (
            "a root without files",
            json!({ "source": source, "root": "w.flow" }),
            "`root` names one of `files`",
        ),
        (
            "a misspelt field",
            json!({ "sorce": source }),
            "unknown field `sorce`",
        ),
        (
            "a source of another type",
            json!({ "source": 5 }),
            "invalid type: integer",
        ),
    ] {
        let (status, body) = flowd.try_deploy(ACME, body).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (422, Some("invalid_request")),
            "{case}: {body}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("send `source`") && detail.contains(says),
            "{case}: {detail}"
        );
    }
    let (status, body) = flowd.try_deploy(ACME, json!({ "plan": plan })).await;
    assert_eq!(status, 201, "{body}");

    // Regression (an audit): serde's words, "invalid length 0, expected
    // struct StartRun with 3 elements" for `[]`, "expected u32" for a
    // version, "Failed to deserialize query string: ... invalid digit".
    for (route, body, says) in [
        ("/v1/runs", json!([]), "a JSON object, `{...}`"),
        (
            "/v1/runs/r1/redrive",
            json!({ "version": -1 }),
            "expected a whole number, 0 or more",
        ),
    ] {
        let (status, answer) = flowd
            .send(reqwest::Method::POST, route, Some(ACME), Some(body))
            .await;
        assert_eq!(status, 422, "{answer}");
        let detail = answer["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{detail}");
    }
    let (status, answer) = flowd
        .send(reqwest::Method::GET, "/v1/runs?limit=-1", Some(ACME), None)
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["detail"], "the query does not read: limit: not a whole number, 0 or more",
        "{answer}"
    );

    // Bodies written out, as `serde_json` would not write them.
    let start_run = async |body: String| {
        let answer = flowd
            .client
            .post(format!("{}/v1/runs", flowd.url))
            .bearer_auth(ACME)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("flowd answers");
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        let detail = body["detail"].as_str().unwrap_or_default().to_string();
        (status, body["code"].clone(), detail)
    };

    // A body nested past what serde_json reads is JSON all the same: the
    // answer says how deep, not "not JSON".
    let deep = format!(
        r#"{{"workflow": "w", "input": {}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let (status, code, detail) = start_run(deep).await;
    assert_eq!((status, code.as_str()), (400, Some("malformed_json")));
    assert!(
        detail.starts_with("the body nests more than 128 arrays and objects deep (line 1, column "),
        "{detail}"
    );

    // An input that gives a key twice is refused, not read as its last
    // (which a proxy or a script's checks in front of flowd may not do).
    let twice = r#"{"workflow": "w", "input": {"ticket": {"id": "T-1", "id": "T-2"}}}"#;
    let (status, code, detail) = start_run(twice.to_string()).await;
    assert_eq!((status, code.as_str()), (422, Some("invalid_request")));
    assert!(
        detail.contains("the key `id` is given twice in one object"),
        "{detail}"
    );
}

/// `flow --server URL --api-key KEY` runs, approves, lists and shows runs on
/// a flowd, with the embedded store's output and exit codes: 3 parked, 0
/// completed, 1 input that does not match, 2 a bad key or a local-only
/// command.
#[tokio::test]
async fn the_flow_cli_drives_runs_on_a_flowd() {
    let dir = TempDir::new("flowd-remote-cli");
    let flowd = Flowd::start(&dir);
    dir.write(
        "refund.flow",
        "workflow refund {\n  input { amount: int }\n  step ok = approval { approvers: [\"boss@acme.io\"], message: \"Refund?\" }\n  output { amount: workflow_input.amount, by: step.ok.approver }\n}\n",
    );
    dir.write("input.json", r#"{ "amount": 40 }"#);
    dir.write("bad.json", r#"{ "amount": "forty" }"#);
    let flow = flow_tests::flow_path();
    let remote = |args: &[&str]| {
        let mut all = vec!["--server", flowd.url.as_str(), "--api-key", ACME];
        all.extend_from_slice(args);
        run_in(&flow, dir.path(), &all)
    };

    let parked = remote(&["run", "refund.flow", "--input", "input.json", "--json"]);
    assert_eq!(parked.code, 3, "{}", parked.all());
    let record: serde_json::Value = serde_json::from_str(&parked.stdout).unwrap();
    assert_eq!(record["status"], "pending_approval");
    assert_eq!(record["pending_approvals"][0]["path"], "ok");
    let run_id = record["run_id"].as_str().unwrap().to_string();
    assert!(
        !dir.path().join("flow.db").exists(),
        "nothing ran on the embedded store"
    );

    // The new everyday commands reach the same flowd (issue 17).
    let waiting = remote(&["approvals", "--as", "boss@acme.io", "--json"]);
    assert_eq!(waiting.code, 0, "{}", waiting.all());
    let gates: serde_json::Value = serde_json::from_str(&waiting.stdout).unwrap();
    assert_eq!(gates[0]["step_path"], "ok", "{gates}");
    assert_eq!(gates[0]["run_id"], run_id.as_str(), "{gates}");
    assert_eq!(remote(&["approvals"]).code, 2, "flowd needs to know whose");
    let misspelt = remote(&["approve", &run_id, "okk", "--as", "boss@acme.io"]);
    assert_eq!(misspelt.code, 2, "{}", misspelt.all());
    assert!(
        misspelt.stderr.contains("did you mean `ok`?"),
        "{}",
        misspelt.stderr
    );
    let parked_runs = remote(&["runs", "--status", "pending_approval", "--json"]);
    let parked_runs: serde_json::Value = serde_json::from_str(&parked_runs.stdout).unwrap();
    assert_eq!(parked_runs[0]["run_id"], run_id.as_str(), "{parked_runs}");
    assert_eq!(parked_runs[0]["interrupted"], false, "{parked_runs}");
    // The commands it prints reach the same flowd (regression: they named
    // none, and pasted they looked for the run in the embedded store).
    let pending = remote(&["show", "--last"]);
    assert!(
        pending.stdout.contains(&format!(
            "approve: flow approve {run_id} ok --as boss@acme.io --server {}\n",
            flowd.url
        )),
        "{}",
        pending.stdout
    );
    let parked_again = remote(&["run", "refund.flow", "--input", "input.json"]);
    assert!(
        parked_again
            .stdout
            .contains(&format!("ok --as boss@acme.io --server {}\n", flowd.url)),
        "{}",
        parked_again.stdout
    );
    let again = parked_again
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert_eq!(remote(&["cancel", &again]).code, 0);

    let done = remote(&["approve", &run_id, "ok", "--as", "boss@acme.io"]);
    assert_eq!(done.code, 0, "{}", done.all());
    assert!(
        done.stdout.contains(&format!("run {run_id} completed")),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout.contains("\"by\": \"boss@acme.io\""),
        "{}",
        done.stdout
    );

    // The deployed workflow runs again by name, without the file.
    let again = remote(&["run", "--workflow", "refund", "--input", "input.json"]);
    assert_eq!(again.code, 3, "{}", again.all());
    let listed = remote(&["runs"]);
    assert_eq!(listed.code, 0, "{}", listed.all());
    assert!(listed.stdout.contains(&run_id), "{}", listed.stdout);
    let shown = remote(&["show", &run_id]);
    assert_eq!(shown.code, 0, "{}", shown.all());
    assert!(
        shown.stdout.contains("status    completed\n")
            && shown.stdout.contains("\nok  approval  approved  waited "),
        "{}",
        shown.stdout
    );
    let again_id = remote(&["runs", "--limit", "1", "--json"]);
    let again_id: serde_json::Value = serde_json::from_str(&again_id.stdout).unwrap();
    let again_id = again_id[0]["run_id"].as_str().unwrap().to_string();
    assert_ne!(again_id, run_id, "newest first");
    let cancelled = remote(&["cancel", &again_id]);
    assert_eq!(cancelled.code, 0, "{}", cancelled.all());
    let twice = remote(&["cancel", &again_id]);
    assert_eq!(twice.code, 2, "{}", twice.all());

    let mismatch = remote(&["run", "refund.flow", "--input", "bad.json"]);
    assert_eq!(mismatch.code, 1, "{}", mismatch.all());
    assert!(mismatch.stderr.contains("amount"), "{}", mismatch.stderr);
    let refused = run_in(
        &flow,
        dir.path(),
        &[
            "--server",
            &flowd.url,
            "--api-key",
            "nobody-0123456789",
            "runs",
        ],
    );
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused.stderr.contains("belongs to no account"),
        "{}",
        refused.stderr
    );
    let keyless = run_in(&flow, dir.path(), &["--server", &flowd.url, "runs"]);
    assert_eq!(keyless.code, 2, "{}", keyless.all());
    assert!(keyless.stderr.contains("--api-key"), "{}", keyless.stderr);
    assert_eq!(remote(&["recover"]).code, 2);
}

/// Regression: flowd caches each account's deployments; a version deployed
/// after a start filled that cache is the one the next start runs, and an
/// older version can still be named.
#[tokio::test]
async fn a_start_after_a_deploy_runs_the_new_version() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-versions");
    let flowd = Flowd::start(&dir);
    let source = |tag: &str| format!("workflow tagged {{\n  output {{ tag: \"{tag}\" }}\n}}\n");
    let run = |version: Option<u32>| {
        let flowd = &flowd;
        async move {
            let (status, body) = flowd
                .send(
                    Method::POST,
                    "/v1/runs",
                    Some(ACME),
                    Some(json!({ "workflow": "tagged", "version": version })),
                )
                .await;
            assert_eq!(status, 202, "{body}");
            let record = flowd.settled(body["run_id"].as_str().unwrap(), ACME).await;
            record["output"]["tag"].clone()
        }
    };
    for (tag, version) in [("one", 1), ("two", 2)] {
        let (status, body) = flowd
            .try_deploy(ACME, json!({ "source": source(tag) }))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["deployments"][0]["version"], version, "{body}");
        assert_eq!(run(None).await, tag, "the latest version runs");
    }
    assert_eq!(run(Some(1)).await, "one");

    // Three runs, read in pages of two, newest first.
    let page = |query: String| {
        let flowd = &flowd;
        async move {
            let (status, body) = flowd
                .send(Method::GET, &format!("/v1/runs?{query}"), Some(ACME), None)
                .await;
            assert_eq!(status, 200, "{body}");
            body["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|run| run["run_id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    let first = page("limit=2".into()).await;
    assert_eq!(first.len(), 2);
    let second = page(format!("limit=2&before={}", first[1])).await;
    assert_eq!(second.len(), 1, "{first:?} then {second:?}");
    assert!(!first.contains(&second[0]));
    let (status, _) = flowd
        .send(Method::GET, "/v1/runs?before=no-such-run", Some(ACME), None)
        .await;
    assert_eq!(status, 404);
    let (_, record) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{}", second[0]),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(record["input"], json!({}), "{record}");
    assert!(record["updated_ms"].as_i64() >= record["created_ms"].as_i64());
}

/// Regression: a page's `next` leads to the page after it even once the
/// run it was taken from is deleted (retention deletes the oldest runs, the
/// last of a page), where `before` of that run answers 404.
#[tokio::test]
async fn a_pages_cursor_holds_after_its_last_run_is_deleted() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-cursor");
    let flowd = Flowd::start(&dir);
    flowd
        .deploy(ACME, "workflow quick {\n  output { done: true }\n}\n")
        .await;
    for _ in 0..3 {
        let run = flowd.start_run(ACME, json!({ "workflow": "quick" })).await;
        flowd.settled(&run, ACME).await;
    }
    let page = |query: String| {
        let flowd = &flowd;
        async move {
            flowd
                .send(Method::GET, &format!("/v1/runs?{query}"), Some(ACME), None)
                .await
        }
    };
    let ids = |body: &serde_json::Value| {
        body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };

    let (status, first) = page("limit=2".into()).await;
    assert_eq!(status, 200, "{first}");
    let first_ids = ids(&first);
    assert_eq!(first_ids.len(), 2, "{first}");
    let next = first["next"]
        .as_str()
        .expect("a full page has a next")
        .to_string();
    let (status, deleted) = flowd
        .send(
            Method::DELETE,
            &format!("/v1/runs/{}", first_ids[1]),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");

    let (status, _) = page(format!("limit=2&before={}", first_ids[1])).await;
    assert_eq!(status, 404, "`before` names a run, which is gone");
    let (status, second) = page(format!("limit=2&cursor={next}")).await;
    assert_eq!(status, 200, "{second}");
    let second_ids = ids(&second);
    assert_eq!(second_ids.len(), 1, "{first} then {second}");
    assert!(!first_ids.contains(&second_ids[0]));
    assert!(
        second.get("next").is_none(),
        "the last page has no next: {second}"
    );

    // Another account's cursor of the same place lists that account's runs
    // only: a cursor is a place, not a run.
    let (status, other) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs?cursor={next}"),
            Some(GLOBEX),
            None,
        )
        .await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(ids(&other), Vec::<String>::new());

    for (query, what) in [
        ("cursor=nonsense".to_string(), "is not one this API gave"),
        (format!("cursor={next}&before={}", first_ids[0]), "give one"),
    ] {
        let (status, problem) = page(query).await;
        assert_eq!(status, 400, "{problem}");
        assert_eq!(problem["code"], "invalid_query", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(what),
            "{problem}"
        );
    }
}

/// A gate with `expires` applies its `on_expire` when it is due while flowd
/// runs, with no request and no restart: the run goes on as rejected.
#[tokio::test]
async fn an_expired_gate_moves_its_run_on_without_a_request() {
    use serde_json::json;
    let dir = TempDir::new("flowd-expiry");
    let flowd = Flowd::start(&dir);
    let source = r#"workflow timed {
  step ok = approval {
    approvers: ["boss@acme.io"]
    message: "Quick?"
    expires: 1s
    on_reject: "continue"
    on_expire: "reject"
  }
  output { approved: step.ok.approved, comment: step.ok.comment }
}
"#;
    flowd.deploy(ACME, source).await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "timed" })).await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    // Due after a second; the sweep looks each second.
    let record = flowd.reaches(&run_id, ACME, "completed").await;
    assert_eq!(
        record["output"],
        json!({ "approved": false, "comment": "expired" })
    );
}

/// With `metrics_token` set, `/metrics` (whose labels name every account's
/// workflows) answers only that token.
#[tokio::test]
async fn a_metrics_token_guards_the_metrics() {
    let dir = TempDir::new("flowd-metrics-token");
    let flowd = Flowd::start_with(
        &dir,
        &format!("metrics_token = \"scrape-0123456789abcdef\"\n{CONFIG}"),
    );
    let scrape = |token: Option<&'static str>| {
        let mut request = flowd.client.get(format!("{}/metrics", flowd.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(scrape(None).await, 401);
    assert_eq!(scrape(Some("scrape-0123456789abcdeX")).await, 401);
    assert_eq!(scrape(Some(ACME)).await, 401, "an API key is not the token");
    assert_eq!(scrape(Some("scrape-0123456789abcdef")).await, 200);
}

/// Two flowd processes sharing one Redis hold an account to one limit of LLM
/// calls in flight, and say how long calls waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_flowds_sharing_redis_hold_an_account_to_one_limit() {
    flow_tests::require!(Redis);
    use flow_tests::fake_llm::FakeLlm;
    use reqwest::Method;
    use serde_json::json;
    let llm = FakeLlm::start(
        vec![],
        json!({ "summary": "s" }),
        std::time::Duration::from_millis(40),
    )
    .await;
    let prefix = format!("flow-test-flowd-{}", std::process::id());
    let config = format!(
        "{}[provider]
kind = \"openai\"
base_url = \"{url}\"
models = {{ default = \"fake\" }}
[limits]
redis_url = \"{redis}\"
redis_prefix = \"{prefix}\"
",
        CONFIG.replace(
            "api_keys = [\"acme-key-0123456789\"]\n",
            "api_keys = [\"acme-key-0123456789\"]\nllm_concurrency = 3\n"
        ),
        url = llm.url,
        redis = flow_tests::services::redis_url()
    );
    let source = r#"recipe summarize { model "default" input { text: string } output { summary: string } prompt "{{input.text}}" }
workflow one {
  step s = summarize { text: "t" }
  output { summary: step.s.summary }
}
"#;
    let (first_dir, second_dir) = (TempDir::new("flowd-redis-1"), TempDir::new("flowd-redis-2"));
    let flowds = [
        Flowd::start_with(&first_dir, &config),
        Flowd::start_with(&second_dir, &config),
    ];
    let mut runs = Vec::new();
    for flowd in &flowds {
        flowd.deploy(ACME, source).await;
        for _ in 0..12 {
            let (status, body) = flowd
                .send(
                    Method::POST,
                    "/v1/runs",
                    Some(ACME),
                    Some(json!({ "workflow": "one" })),
                )
                .await;
            assert_eq!(status, 202, "{body}");
            runs.push((flowd, body["run_id"].as_str().unwrap().to_string()));
        }
    }
    for (flowd, run) in &runs {
        assert_eq!(flowd.settled(run, ACME).await["status"], "completed");
    }
    assert_eq!(llm.requests(), 24);
    assert_eq!(llm.most_at_once(), 3, "one limit across both processes");
    for flowd in &flowds {
        let metrics = flowd.metrics().await;
        assert!(
            metrics.contains(r#"flow_llm_semaphore_wait_seconds_count{account="acme"} 12"#),
            "{metrics}"
        );
    }
    // The test's keys go; the limiter's own expire soon anyway.
    let keys = std::process::Command::new("redis-cli")
        .args(["--scan", "--pattern", &format!("{prefix}:*")])
        .output()
        .expect("redis-cli runs");
    for key in String::from_utf8_lossy(&keys.stdout).lines() {
        let _ = std::process::Command::new("redis-cli")
            .args(["DEL", key])
            .output();
    }
}

/// A Redis that does not answer when flowd starts is a warning naming it,
/// not a refusal to start: runs go on, their calls failing open (counted).
#[tokio::test]
async fn an_unreachable_redis_at_start_is_a_warning_and_calls_fail_open() {
    use serde_json::json;
    let dir = TempDir::new("flowd-redis-down");
    let flowd = Flowd::start_with(
        &dir,
        &format!("{CONFIG}[limits]\nredis_url = \"redis://127.0.0.1:1\"\n"),
    );
    assert!(
        flowd.startup.contains("WARN redis redis://127.0.0.1:1"),
        "{}",
        flowd.startup
    );
    flowd.deploy(ACME, TWO_STEPS).await;
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "text": "t" } }),
        )
        .await;
    assert_eq!(flowd.settled(&run, ACME).await["status"], "completed");
    let metrics = flowd.metrics().await;
    assert!(
        metrics.contains(r#"flow_llm_semaphore_fail_open_total{account="acme"} 2"#),
        "{metrics}"
    );
}

/// Links are signed with a key of the run's account, derived from the link
/// secret; the token names the secret, so that an operator who rotates it
/// (the old one moved to `previous_link_secrets`) breaks no link already
/// sent, and one who drops the old secret voids its links.
#[tokio::test]
async fn a_rotated_link_secret_keeps_the_links_already_sent() {
    let sink = flow_tests::smtp_sink::SmtpSink::refusing(0).await;
    let dir = TempDir::new("flowd-link-rotation");
    let smtp = format!(
        "[smtp]\nhost = \"127.0.0.1\"\nport = {}\nfrom = \"flowd@acme.io\"\ntls = \"none\"\n",
        sink.port
    );
    let old = "0123456789abcdef0123456789abcdef";
    let new = "a brand new secret of 32 characters";
    let flowd = Flowd::start_with(&dir, &format!("{CONFIG}{smtp}"));
    flowd
        .deploy(
            ACME,
            "workflow gate {\n  step ok = approval { approvers: [\"ana@acme.io\"], message: \"Go?\" }\n}\n",
        )
        .await;
    let run_id = flowd
        .start_run(ACME, serde_json::json!({ "workflow": "gate" }))
        .await;
    let mails = sink.wait_for(1).await;
    let (approve, _) = links_in(&mails[0]);
    let token = approve.rsplit('/').next().unwrap().to_string();
    drop(flowd);

    let opens = |flowd: &Flowd| {
        let url = format!("{}/approvals/{token}", flowd.url);
        let client = flowd.client.clone();
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    };
    // `previous_link_secrets` is a top-level key: before any table.
    let rotated = format!(
        "previous_link_secrets = [{old:?}]\n{}",
        CONFIG.replace(old, new)
    ) + &smtp;
    let flowd = Flowd::start_with(&dir, &rotated);
    assert_eq!(opens(&flowd).await, 200, "a link sent before the rotation");
    drop(flowd);
    let flowd = Flowd::start_with(&dir, &(CONFIG.replace(old, new) + &smtp));
    assert_eq!(opens(&flowd).await, 403, "the old secret was dropped");
    let (status, _) = flowd
        .send(
            reqwest::Method::GET,
            &format!("/v1/runs/{run_id}"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "the run is still there, waiting");
}

/// Regression (issue 21): a deployed plan whose input schema was an `anyOf`
/// of 20,000 branches made each 6 KB start request answer 480 MB in 13.5 s.
/// A plan from outside is validated before it is stored: this one is refused
/// at deploy with one short problem, and nothing is deployed.
#[tokio::test]
async fn a_plan_with_an_anyof_of_20000_branches_is_refused_at_deploy() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-anyof");
    let flowd = Flowd::start(&dir);
    let checked = flow_compiler::check_source(
        "wide.flow",
        "workflow wide {\n  input { tags: list<string> }\n  output { tags: workflow_input.tags }\n}\n",
    );
    let mut plan = flow_compiler::lower(&checked).expect("the source lowers");
    let branches: Vec<serde_json::Value> = (0..20_000)
        .map(|i| json!({ "type": "string", "enum": [format!("v{i}")] }))
        .collect();
    plan.workflows[0].input_schema["properties"]["tags"]["items"] = json!({ "anyOf": branches });
    // The hash is recomputed, as an attacker would: only validation stands
    // between this plan and the store.
    let plan: serde_json::Value = serde_json::from_str(&plan.seal().to_json()).unwrap();

    let (status, body) = flowd.try_deploy(ACME, json!({ "plan": plan })).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_plan")),
        "{body}"
    );
    assert_eq!(
        body["problems"],
        json!([{
            "path": "/workflows/0/input_schema/properties/tags/items/anyOf",
            "message": "`anyOf` has 20000 branches; a plan's `anyOf` is an optional, [a schema, {\"type\": \"null\"}]",
        }]),
        "{body}"
    );
    assert_eq!(body["more_problems"], false);
    assert!(body.to_string().len() < 1_024, "{body}");

    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "wide", "input": { "tags": ["x"] } })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_workflow")),
        "nothing was deployed: {body}"
    );
}

/// A plan with many problems is answered with the first 100, each short,
/// and says that validation stopped there.
#[tokio::test]
async fn an_invalid_plan_is_answered_with_at_most_100_short_problems() {
    use serde_json::json;
    let dir = TempDir::new("flowd-problems");
    let flowd = Flowd::start(&dir);
    let checked = flow_compiler::check_source(
        "many.flow",
        "workflow many {\n  input { text: string }\n  output { text: workflow_input.text }\n}\n",
    );
    let mut plan = flow_compiler::lower(&checked).expect("the source lowers");
    // Within the 2 MiB body: 500 names of 3,000 bytes.
    let long = "x".repeat(3_000);
    plan.workflows[0].output = (0..500)
        .map(|i| flow_plan::Field {
            name: format!("{long}{i}"),
            value: flow_plan::Expr::Ref(flow_plan::Ref {
                root: flow_plan::Root::Step(1_000 + i),
                path: vec![],
                optional: false,
            }),
        })
        .collect();
    let plan: serde_json::Value = serde_json::from_str(&plan.seal().to_json()).unwrap();
    let (status, body) = flowd.try_deploy(ACME, json!({ "plan": plan })).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_plan")),
        "{body}"
    );
    let problems = body["problems"].as_array().expect("a list of problems");
    assert_eq!(problems.len(), flow_plan::limits::MAX_PROBLEMS);
    assert_eq!(body["more_problems"], true);
    for problem in problems {
        let length = problem["path"].as_str().unwrap().chars().count()
            + problem["message"].as_str().unwrap().chars().count()
            + 2;
        assert!(length <= flow_plan::limits::MAX_PROBLEM_CHARS, "{problem}");
    }
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .ends_with("100 problem(s), and validation stopped there"),
        "{body}"
    );
}

/// Regression (issue 21): even a valid schema can be wide. A start request
/// of 7,000 mismatches against a record of 2,000 fields (each unknown field's
/// message once named every allowed one) answers at most 100 mismatches,
/// each short, and how many were left out.
#[tokio::test]
async fn a_start_against_a_wide_valid_schema_answers_a_bounded_422() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-wide-input");
    let flowd = Flowd::start(&dir);
    let fields: Vec<String> = (0..2_000).map(|i| format!("field_{i}: string")).collect();
    let source = format!(
        "workflow wide {{\n  input {{ {} }}\n  output {{ first: workflow_input.field_0 }}\n}}\n",
        fields.join(", ")
    );
    flowd.deploy(ACME, &source).await;

    let input: serde_json::Map<String, serde_json::Value> = (0..5_000)
        .map(|i| (format!("unknown_{i}"), json!(i)))
        .collect();
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "wide", "input": input })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_input")),
        "{body}"
    );
    let mismatches = body["mismatches"].as_array().expect("a list of mismatches");
    assert_eq!(mismatches.len(), 100);
    assert_eq!(
        body["mismatches_omitted"], 6_900,
        "5,000 unknown and 2,000 missing fields"
    );
    assert_eq!(mismatches[0]["path"], "/unknown_0");
    assert_eq!(
        mismatches[0]["expected"],
        "no field `unknown_0` (2000 allowed, such as `field_0`, `field_1`, `field_10`, `field_100`, `field_1000`, …)"
    );
    let size = body.to_string().len();
    assert!(size < 32 * 1024, "a 422 of {size} bytes");

    let (status, body) = flowd.send(Method::GET, "/v1/runs", Some(ACME), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["runs"], json!([]), "nothing was stored");
}

/// A source past the plan format's bounds is refused where it is
/// compiled, with where in the source, and nothing is stored: a timeout
/// over a year is an invalid duration (E206), a step id of 300 bytes past
/// a limit of plans (E212). Both once compiled to plans flowd refused as
/// `invalid_plan`, which said where in the plan, not in the source.
/// Regression, too: a tenant's source of 20,000 type aliases in a chain
/// overflowed the checker's stack, which aborted flowd for every account,
/// and 40 aliases each naming the one before twice started a schema of
/// 2^40 values; each is E212 at the first alias past the bounds, and
/// flowd answers on. And a source of 600 KB naming a 30,000-field type in
/// 240 recipes' outputs lowered to a plan of 270 MB (2,000 recipes: past
/// 24 GB of memory, for one deploy): E212 at the recipe whose schemas
/// pass the plan's 256 MiB, before any is written.
#[tokio::test]
async fn a_source_that_compiles_past_the_plan_bounds_is_refused() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-source-bounds");
    let flowd = Flowd::start(&dir);
    let long = "s".repeat(300);
    let mut chain = String::from("type D0 = { a: string }\n");
    for i in 1..20_000 {
        chain.push_str(&format!("type D{i} = {{ a: D{} }}\n", i - 1));
    }
    chain.push_str("workflow deep {\n  input { x: D19999 }\n  output { y: 1 }\n}\n");
    let mut doubling = String::from("type T0 = { a: string }\n");
    for i in 1..=40 {
        doubling.push_str(&format!("type T{i} = {{ a: T{0}, b: T{0} }}\n", i - 1));
    }
    doubling.push_str("workflow wide {\n  input { x: T40 }\n  output { y: 1 }\n}\n");
    let big = format!(
        "type Big = {{ {} }}\n{}workflow w {{\n  input {{ q: string }}\n}}\n",
        (0..30_000)
            .map(|i| format!("f_{i:05}: string"))
            .collect::<Vec<_>>()
            .join(", "),
        (0..240)
            .map(|i| format!("recipe big_{i:03} {{\n  model \"m\"\n  input {{ q: string }}\n  output {{ x: Big }}\n  prompt \"{{{{input.q}}}}\"\n}}\n"))
            .collect::<String>()
    );
    let cases = [
        (chain, "E212", 128),
        // The 59th recipe, of six lines each after `Big`'s one: each writes
        // `Big`'s 1,140,074 bytes, past flowd's 64 MiB there.
        (big, "E212", 2 + 58 * 6),
        (doubling, "E212", 16),
        (
            "workflow slow {\n  timeout 400d\n  output { x: 1 }\n}\n".to_string(),
            "E206",
            2,
        ),
        (
            format!(
                "workflow long {{\n  step {long} = kb_write \"notes\" {{ title: \"t\", content: \"c\" }} retry 1\n}}\n"
            ),
            "E212",
            2,
        ),
    ];
    for (source, code, line) in cases {
        let (status, body) = flowd
            .try_deploy(ACME, json!({ "source": source, "path": "slow.flow" }))
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (422, Some("does_not_check")),
            "{body}"
        );
        assert_eq!(body["diagnostics"][0]["code"], code, "{body}");
        assert_eq!(body["diagnostics"][0]["line"], line, "{body}");
    }
    // A source of thousands of errors, each about an enum of thousands of
    // variants: the first hundred are listed, each a sentence long, and
    // the count of the rest (a 422 listing every one in full, 80 KB each,
    // would have been gigabytes).
    let mut wrong = format!(
        "type E = {}
workflow w {{
  input {{ a: E }}
",
        (0..9_999)
            .map(|i| format!("\"variant_{i}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for i in 0..5_000 {
        wrong.push_str(&format!(
            "  if workflow_input.a == \"nope{i}\" {{\n    step h{i} = handoff \"t\" {{ subject: \"s\", message: \"m\" }}\n  }}\n"
        ));
    }
    wrong.push_str("}\n");
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": wrong, "path": "wrong.flow" }))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"], "wrong.flow has 5000 error(s)");
    let listed = body["diagnostics"].as_array().expect("diagnostics");
    assert_eq!(listed.len(), 100);
    assert_eq!(body["diagnostics_omitted"], 4_900);
    assert!(
        listed
            .iter()
            .all(|d| d["code"] == "E204" && d["message"].as_str().is_some_and(|m| m.len() < 300))
    );
    let (_, body) = flowd
        .send(Method::GET, "/v1/workflows", Some(ACME), None)
        .await;
    assert_eq!(body["deployments"], json!([]), "nothing was deployed");
}

/// A source of `recipes` recipes whose output is a record of `fields`
/// fields, and a workflow calling the first: its plan writes the record out
/// at each recipe.
fn recipes_of_a_big_record(fields: usize, recipes: usize) -> String {
    let fields: Vec<String> = (0..fields).map(|i| format!("field_{i}: string")).collect();
    let mut source = format!("type Big = {{ {} }}\n", fields.join(", "));
    for i in 0..recipes {
        source.push_str(&format!(
            "recipe r{i} {{\n  model \"m\"\n  input {{ q: string }}\n  output {{ x: Big }}\n  prompt \"{{{{input.q}}}}\"\n}}\n"
        ));
    }
    source.push_str(
        "workflow w {\n  input { q: string }\n  step a = r0 { q: workflow_input.q }\n}\n",
    );
    source
}

/// Regression: a source's types are written out in its plan wherever they
/// are named, so a deploy of 2 MB could stand for a plan of the format's
/// 256 MiB, gigabytes to build in flowd and to parse at each start.
/// `[limits] plan_bytes` bounds a deployed plan, held from the types before
/// the plan is written (E212 at the recipe past it).
#[tokio::test]
async fn a_deploy_past_the_plan_bytes_of_flowd_is_refused_before_it_is_built() {
    use serde_json::json;
    let dir = TempDir::new("flowd-plan-bytes");
    let flowd = Flowd::start_with(&dir, &format!("{CONFIG}[limits]\nplan_bytes = 1_048_576\n"));
    let source = recipes_of_a_big_record(2_000, 40);
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": source, "path": "big.flow" }))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "does_not_check", "{body}");
    assert_eq!(body["diagnostics"][0]["code"], "E212", "{body}");
    assert_eq!(
        body["diagnostics"][0]["message"],
        "the plan's JSON is over 1 MiB"
    );
    // Within it, a program deploys as ever.
    flowd.deploy(ACME, TWO_STEPS).await;
}

/// A deploy's source compiles in a process of its own (`flowd
/// compile-worker`), held to `[limits] compile_memory` and
/// `compile_seconds`: a source past them is refused with 422
/// `compile_limit`, and flowd, which drives every account's runs, goes on
/// as before. Before, the compile ran in flowd, where a cost nobody had
/// bounded (or a compiler bug's abort) was every tenant's.
#[tokio::test]
async fn a_compile_past_flowds_limits_stops_in_its_own_process() {
    use reqwest::Method;
    use serde_json::json;
    // Two thousand recipes whose output is a record of 200 fields: a
    // source of 400 KB whose plan, writing the record out at each, is
    // tens of megabytes, and a hundred megabytes or more while built.
    let source = recipes_of_a_big_record(200, 2_000);
    let dir = TempDir::new("flowd-compile-memory");
    let flowd = Flowd::start_with(
        &dir,
        &format!("{CONFIG}[limits]\ncompile_memory = 67_108_864\n"),
    );
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": source, "path": "big.flow" }))
        .await;
    assert_eq!(
        (status, &body["code"]),
        (422, &json!("compile_limit")),
        "{body}"
    );
    assert_eq!(
        body["detail"],
        "big.flow: compiling took more than 64 MiB of memory ([limits] compile_memory); a source that takes this much to check is refused"
    );
    // Within them, a program deploys and runs as ever.
    flowd.deploy(ACME, TWO_STEPS).await;
    let (_, body) = flowd
        .send(Method::GET, "/v1/workflows", Some(ACME), None)
        .await;
    assert_eq!(
        body["deployments"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );

    // The same source with memory to spare, against a second of CPU: a
    // debug build of the compiler takes longer than that over it.
    let dir = TempDir::new("flowd-compile-seconds");
    let flowd = Flowd::start_with(&dir, &format!("{CONFIG}[limits]\ncompile_seconds = 1\n"));
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": source, "path": "big.flow" }))
        .await;
    if cfg!(debug_assertions) || status != 201 {
        assert_eq!(
            (status, &body["code"]),
            (422, &json!("compile_limit")),
            "{body}"
        );
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("big.flow: compiling took more than")),
            "{body}"
        );
    }
    flowd.deploy(ACME, TWO_STEPS).await;
}

/// Regression (an audit): deploys took the places to compile in turn,
/// whatever their account, so one account queuing slow deploys kept every
/// other account's waiting past the connection's timeout. An account has
/// at most two deploys under way; a third answers 429 at once.
#[tokio::test]
async fn an_account_has_two_deploys_under_way_at_most() {
    use serde_json::json;
    let source = recipes_of_a_big_record(200, 2_000);
    let dir = TempDir::new("flowd-deploys-at-once");
    let flowd = Flowd::start_with(
        &dir,
        &format!(
            "{CONFIG}[limits]
compile_seconds = 1
"
        ),
    );
    let deploy = || flowd.try_deploy(ACME, json!({ "source": source, "path": "big.flow" }));
    let (a, b, c) = tokio::join!(deploy(), deploy(), deploy());
    let refused: Vec<_> = [a, b, c]
        .into_iter()
        .filter(|(status, _)| *status == 429)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        refused[0].1["code"], "deploys_in_flight",
        "{:?}",
        refused[0]
    );
    // Another account's deploy is not held behind them.
    flowd.deploy(GLOBEX, TWO_STEPS).await;
}

/// Regression: `[[webhooks]]` was global, and one account's run output
/// (its input included) went to the URL another account had configured.
/// Each account's events go to its own endpoints only, cancels included,
/// and a global `[[webhooks]]` is refused with what to write instead.
#[tokio::test]
async fn webhooks_are_an_accounts_own() {
    use axum::http::StatusCode;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    type Received = Arc<Mutex<Vec<serde_json::Value>>>;
    async fn receiver() -> (String, Received) {
        let received: Received = Arc::default();
        let kept = Arc::clone(&received);
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: String| async move {
                kept.lock()
                    .unwrap()
                    .push(serde_json::from_str(&body).unwrap());
                StatusCode::NO_CONTENT
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, received)
    }
    let (acme_url, acme_seen) = receiver().await;
    let (globex_url, globex_seen) = receiver().await;
    let config = common::config_with_endpoints(&globex_url, &acme_url);
    let dir = TempDir::new("flowd-webhooks-accounts");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, TWO_STEPS).await;
    flowd.deploy(GLOBEX, TWO_STEPS).await;
    let acme_run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "text": "acme secret" } }),
        )
        .await;
    let globex_run = flowd
        .start_run(
            GLOBEX,
            json!({ "workflow": "digest", "input": { "text": "globex" } }),
        )
        .await;
    flowd.settled(&acme_run, ACME).await;
    flowd.settled(&globex_run, GLOBEX).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while acme_seen.lock().unwrap().is_empty() || globex_seen.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no delivery");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for (seen, account, run) in [
        (&acme_seen, "acme", &acme_run),
        (&globex_seen, "globex", &globex_run),
    ] {
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{account}: {seen:?}");
        assert_eq!(seen[0]["account"], account);
        assert_eq!(seen[0]["run"]["run_id"], run.as_str());
    }

    // A cancel is an event too.
    flowd
        .deploy(
            ACME,
            "workflow g {\n  step ok = approval { approvers: [\"ana@acme.io\"], message: \"go?\" }\n}\n",
        )
        .await;
    let parked = flowd.start_run(ACME, json!({ "workflow": "g" })).await;
    flowd.settled(&parked, ACME).await;
    let (status, _) = flowd
        .send(
            reqwest::Method::POST,
            &format!("/v1/runs/{parked}/cancel"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !acme_seen
        .lock()
        .unwrap()
        .iter()
        .any(|e| e["event"] == "cancelled" && e["run"]["run_id"] == parked.as_str())
    {
        assert!(std::time::Instant::now() < deadline, "no cancelled event");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        globex_seen
            .lock()
            .unwrap()
            .iter()
            .all(|e| e["account"] == "globex"),
        "another account's event reached globex"
    );
    drop(flowd);

    let global = format!(
        "{CONFIG}[[webhooks]]\nurl = \"{acme_url}\"\nsecret = \"whsec-0123456789abcdef\"\n"
    );
    dir.write("global.toml", &global);
    let refused = self::flowd(&dir, &["check-config", "--config", "global.toml"]);
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused.all().contains("webhooks belong to an account"),
        "{}",
        refused.all()
    );
}

/// Issue 15: a run failed by a provider outage is redriven over HTTP and
/// completes, asking the model only for the step that failed; a run that
/// did not fail is refused, another account's run is not found.
#[tokio::test]
async fn a_failed_run_is_redriven_over_http() {
    use flow_tests::fake_llm::{FakeLlm, Reply, ok};
    use reqwest::Method;
    use serde_json::json;
    use std::time::Duration;

    let answer = json!({ "text": "t", "score": 1 });
    let server = FakeLlm::start(
        vec![
            ok(answer.clone()),
            Reply::Answer(503, vec![], "down".to_string()),
        ],
        answer,
        Duration::ZERO,
    )
    .await;
    let config = format!("{CONFIG}{}", common::fake_model(&server.url));
    let dir = TempDir::new("flowd-redrive");
    let flowd = Flowd::start_with(&dir, &config);
    flowd
        .deploy(
            ACME,
            r#"recipe answer { model "default" input { q: string } output { text: string, score: int } prompt "{{input.q}}" }
workflow pair {
  step first = answer { q: "first" }
  step second = answer { q: "second" } retry 1
  output { text: step.second.text }
}
"#,
        )
        .await;
    let run_id = flowd.start_run(ACME, json!({ "workflow": "pair" })).await;
    let failed = flowd.settled(&run_id, ACME).await;
    assert_eq!(failed["status"], "failed", "{failed}");

    let redrive = format!("/v1/runs/{run_id}/redrive");
    let (status, _) = flowd.send(Method::POST, &redrive, Some(GLOBEX), None).await;
    assert_eq!(status, 404, "another account's run");
    let (status, body) = flowd.send(Method::POST, &redrive, Some(ACME), None).await;
    assert_eq!(status, 202, "{body}");
    let done = flowd.settled(&run_id, ACME).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        server.prompts(),
        ["first", "second", "second"],
        "only the failed step went again"
    );
    let (status, body) = flowd.send(Method::POST, &redrive, Some(ACME), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_redrivable")),
        "{body}"
    );
    let (_, trace) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(ACME),
            None,
        )
        .await;
    let second = trace["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["path"] == "second")
        .unwrap();
    assert_eq!(second["attempts"].as_array().unwrap().len(), 2, "{second}");
    assert_eq!(flowd.stop(), Some(0));
}

/// Issue 15: runs parked on version 1 move to a compatible version 2 (a
/// step added after the gate) and complete on it; version 3 (a step added
/// before the gate) is refused with D006, and the runs keep their version.
#[tokio::test]
async fn parked_runs_move_to_a_compatible_version_only() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-migrate");
    let v1 = r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  output { approved: step.ok.approved }
}
"#;
    let v2 = r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  step after = handoff "ops" { message: "decided" }
  output { approved: step.ok.approved, version: 2 }
}
"#;
    let v3 = r#"workflow refund {
  step before = handoff "ops" { message: "asked" }
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  output { approved: step.ok.approved, version: 3 }
}
"#;
    let config = format!("{CONFIG}[accounts.departments]\nops = [\"ana@acme.io\"]\n");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, v1).await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let id = flowd.start_run(ACME, json!({ "workflow": "refund" })).await;
        assert_eq!(flowd.settled(&id, ACME).await["status"], "pending_approval");
        runs.push(id);
    }
    let (status, deployed) = flowd.try_deploy(ACME, json!({ "source": v2 })).await;
    assert_eq!(status, 201, "{deployed}");
    assert_eq!(
        deployed["earlier_runs"],
        json!([{ "workflow": "refund", "parked": 2, "running": 0, "movable": 2 }])
    );
    let (status, deployed) = flowd.try_deploy(ACME, json!({ "source": v3 })).await;
    assert_eq!(status, 201, "{deployed}");
    assert_eq!(deployed["earlier_runs"][0]["movable"], 0, "{deployed}");

    let migrate = "/v1/workflows/refund/migrate";
    let (status, answer) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "to_version": 3 })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["moved"], json!([]), "{answer}");
    assert_eq!(
        answer["refused"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );
    assert_eq!(
        answer["refused"][0]["problems"][0]["code"], "D006",
        "{answer}"
    );

    let (_, dry) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "to_version": 2, "dry_run": true })),
        )
        .await;
    assert_eq!(dry["moved"].as_array().map(Vec::len), Some(2), "{dry}");
    let (_, moved) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "to_version": 2 })),
        )
        .await;
    assert_eq!(moved["moved"].as_array().map(Vec::len), Some(2), "{moved}");
    let (_, again) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "to_version": 2 })),
        )
        .await;
    assert_eq!(again["moved"], json!([]), "moved once: {again}");
    // Regression: `to_version` moved the runs of a newer version back.
    let (_, back) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "to_version": 1 })),
        )
        .await;
    assert_eq!(back["moved"], json!([]), "runs move forward only: {back}");
    // Regression (an audit): a move back named both ways was answered
    // with nothing moved and no word of why.
    let (status, named) = flowd
        .send(
            Method::POST,
            migrate,
            Some(ACME),
            Some(json!({ "from_version": 2, "to_version": 1 })),
        )
        .await;
    assert_eq!(status, 422, "{named}");
    assert!(
        named["detail"]
            .as_str()
            .is_some_and(|d| d.contains("runs move forward only")),
        "{named}"
    );

    for id in &runs {
        let (status, body) = flowd.approve(ACME, id, "ok").await;
        assert_eq!(status, 202, "{body}");
        let done = flowd.settled(id, ACME).await;
        assert_eq!(
            done["output"],
            json!({ "approved": true, "version": 2 }),
            "completed on version 2: {done}"
        );
        let (_, trace) = flowd
            .send(
                Method::GET,
                &format!("/v1/runs/{id}/trace"),
                Some(ACME),
                None,
            )
            .await;
        // After the provider it began with.
        assert_eq!(trace["history"][0]["kind"], "began", "{trace}");
        assert_eq!(trace["history"][1]["kind"], "moved", "{trace}");
    }
    let (status, _) = flowd
        .send(
            Method::POST,
            "/v1/workflows/nope/migrate",
            Some(ACME),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression (issue 21): plans stored before flowd validated deployed plans
/// (or written to its store by other means) were run without the bounds a
/// deploy checks. A stored plan is validated when flowd first loads it: a
/// start of such a version is refused, saying to deploy it again.
#[tokio::test]
async fn a_stored_plan_past_the_bounds_is_not_run() {
    use reqwest::Method;
    use serde_json::json;
    let dir = TempDir::new("flowd-stored-plan");
    let checked = flow_compiler::check_source(
        "wide.flow",
        "workflow wide {\n  input { tags: list<string> }\n  output { tags: workflow_input.tags }\n}\n",
    );
    let mut plan = flow_compiler::lower(&checked).expect("the source lowers");
    let branches: Vec<serde_json::Value> = (0..20_000)
        .map(|i| json!({ "type": "string", "enum": [format!("v{i}")] }))
        .collect();
    plan.workflows[0].input_schema["properties"]["tags"]["items"] = json!({ "anyOf": branches });
    let plan = plan.seal();
    {
        let store = flow_runtime::sqlite::SqliteStore::open(&dir.path().join("flowd.db"))
            .expect("the store opens");
        store.put_plan(&plan).expect("stored as an older flowd did");
        store
            .deploy("acme", "wide", &plan.hash)
            .expect("deployed as an older flowd did");
    }
    let flowd = Flowd::start(&dir);
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "wide", "input": { "tags": [] } })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (500, Some("store_damaged")),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("deploy this version again") && d.len() < 1_000),
        "{body}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// A gated workflow whose gate expires after a second and lets the run go
/// on as rejected; `tag` makes plans of distinct hashes.
fn expiring_gate(tag: &str) -> String {
    format!(
        r#"workflow timed {{
  step ok = approval {{
    approvers: ["boss@acme.io"]
    message: "{tag}?"
    expires: 1s
    on_reject: "continue"
    on_expire: "reject"
  }}
  output {{ approved: step.ok.approved }}
}}
"#
    )
}

/// Regression: a stored plan that did not load stopped every run that came
/// after one of its runs. Recovery claimed runs before reading their plans
/// and gave up at the first that failed (so flowd did not start), and the
/// gate-expiry and orphan sweeps gave up at it each time (so no other
/// account's expired gate ever applied). Now that plan's runs wait, the
/// rest recover and expire, and a deploy of the plan mends it.
#[tokio::test]
async fn a_run_whose_plan_does_not_load_holds_back_no_other_run() {
    use serde_json::json;
    let dir = TempDir::new("flowd-unloadable-plan");
    let flowd = Flowd::start(&dir);
    flowd.deploy(GLOBEX, &expiring_gate("globex")).await;
    flowd.deploy(ACME, &expiring_gate("acme")).await;
    let stuck = flowd
        .start_run(GLOBEX, json!({ "workflow": "timed" }))
        .await;
    let parked = flowd.start_run(ACME, json!({ "workflow": "timed" })).await;
    for (id, key) in [(&stuck, GLOBEX), (&parked, ACME)] {
        assert_eq!(flowd.settled(id, key).await["status"], "pending_approval");
    }
    assert_eq!(flowd.stop(), Some(0));
    {
        // Damaged as a disk or a hand might: text that does not match its
        // hash, which `Plan::from_json` refuses.
        let store = flow_runtime::sqlite::SqliteStore::open(&dir.path().join("flowd.db"))
            .expect("the store opens");
        let hash = store.run(&stuck).unwrap().unwrap().plan_hash;
        let mut plan = store.plan(&hash).unwrap();
        // (Not its `source`, the file's path, which the hash leaves out.)
        plan.workflows[0].timeout_ms += 1;
        store.put_plan(&plan).expect("the stored copy is replaced");
    }
    // Both gates have expired when flowd starts again.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let flowd = Flowd::start(&dir);
    assert!(
        flowd
            .startup
            .contains("1 unfinished run(s) of plan sha256:")
            && flowd.startup.contains("stay as they are"),
        "{}",
        flowd.startup
    );
    let record = flowd.reaches(&parked, ACME, "completed").await;
    assert_eq!(record["output"], json!({ "approved": false }));
    // The sweep goes past the run it cannot resume, each second.
    let later = flowd.start_run(ACME, json!({ "workflow": "timed" })).await;
    flowd.reaches(&later, ACME, "completed").await;
    flowd.reaches(&stuck, GLOBEX, "pending_approval").await;
    // Deploying the source again stores the plan again: the next sweep
    // resumes the run, and its expired gate applies.
    flowd.deploy(GLOBEX, &expiring_gate("globex")).await;
    let record = flowd.reaches(&stuck, GLOBEX, "completed").await;
    assert_eq!(record["output"], json!({ "approved": false }));
    assert_eq!(flowd.stop(), Some(0));
}

/// A deploy says when a workflow can have more model calls in flight than
/// the deploying account runs at once (its own `llm_concurrency`, else
/// `[limits]`'s): the calls past it would wait. The same plan is within
/// another account's limit.
#[tokio::test]
async fn a_deploy_warns_of_more_model_calls_than_the_account_runs_at_once() {
    use serde_json::json;

    let config = CONFIG.replace(
        "id = \"globex\"\n",
        "id = \"globex\"\nllm_concurrency = 50\n",
    );
    let dir = TempDir::new("flowd-budget");
    let flowd = Flowd::start_with(&dir, &config);
    let source =
        "recipe r { model \"m\" input { a: string } output { a: string } prompt \"{{input.a}}\" }
workflow wide {
  input { items: list<string> }
  for workflow_input.items as each concurrency 20 {
    parallel p {
      branch x { step a = r { a: loop_item } }
      branch y { step b = r { a: loop_item } }
    }
  }
}
";
    let (status, body) = flowd.try_deploy(ACME, json!({ "source": source })).await;
    assert_eq!(status, 201, "{body}");
    let warnings = body["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{body}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.contains("40 model calls") && warning.contains("the 10 this account"),
        "{warning}"
    );
    let (status, body) = flowd.try_deploy(GLOBEX, json!({ "source": source })).await;
    assert_eq!(status, 201, "{body}");
    assert!(body.get("warnings").is_none(), "within globex's 50: {body}");
    assert_eq!(flowd.stop(), Some(0));
}

/// A model provider's failure keeps its kind (and retries) for the tenant,
/// but not the provider's words: they name the operator's endpoint and can
/// quote a part of its key. The tenant gets a reference that flowd's log
/// has the details under.
#[tokio::test]
async fn a_providers_failure_reaches_the_tenant_without_the_operators_details() {
    use flow_tests::fake_llm::{FakeLlm, Reply};
    use reqwest::Method;
    use serde_json::json;

    let model = FakeLlm::start(
        vec![Reply::Answer(
            401,
            vec![],
            "Incorrect API key provided: sk-op3r4t0r-s3cr3t".to_string(),
        )],
        json!({ "summary": "s" }),
        std::time::Duration::ZERO,
    )
    .await;
    let config = format!("{CONFIG}{}", common::fake_model(&model.url));
    let dir = TempDir::new("flowd-provider-error");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, TWO_STEPS).await;
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "digest", "input": { "text": "t" } })),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().unwrap().to_string();
    let record = flowd.settled(&id, ACME).await;
    assert_eq!(record["status"], "failed", "{record}");
    let (_, trace) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{id}/trace"),
            Some(ACME),
            None,
        )
        .await;
    for seen in [record.to_string(), trace.to_string()] {
        assert!(!seen.contains("sk-op3r4t0r"), "the key leaked: {seen}");
        assert!(!seen.contains(&model.url), "the endpoint leaked: {seen}");
        assert!(seen.contains("reference llm-"), "no reference: {seen}");
        assert!(seen.contains("client"), "the kind is kept: {seen}");
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// A flowd stopped (SIGTERM) on SQLite lets its runs finish the steps they
/// are in and starts no other, and its store commits what they completed
/// before the process exits: started again, it goes on from their next
/// steps and sends no step to the model twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_flowd_goes_on_from_the_next_step_when_started_again() {
    use serde_json::json;
    const STEPS: usize = 3;
    let llm = common::chain_model(std::time::Duration::from_millis(1500)).await;
    let config = format!("{CONFIG}{}", common::fake_model(&llm.url));
    let source = common::model_chain(STEPS);
    let dir = TempDir::new("flowd-stop-next-step");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, &source).await;
    let mut ids = Vec::new();
    for r in 0..2 {
        ids.push(
            flowd
                .start_run(
                    ACME,
                    json!({ "workflow": "chain", "input": { "tag": format!("run{r}") } }),
                )
                .await,
        );
    }
    llm.until_requests(2).await;
    let code = tokio::task::spawn_blocking(move || flowd.stop())
        .await
        .unwrap();
    assert_eq!(code, Some(0), "a stop is a clean exit");
    assert!(llm.requests() < 2 * STEPS, "the runs were still under way");
    let flowd = Flowd::start_with(&dir, &config);
    for id in &ids {
        let record = flowd
            .settled_within(id, ACME, std::time::Duration::from_secs(60))
            .await;
        assert_eq!(record["status"], "completed", "{record}");
    }
    let prompts = llm.prompts();
    for r in 0..2 {
        for i in 0..STEPS {
            let prompt = format!("run{r} step {i}");
            let calls = prompts.iter().filter(|p| **p == prompt).count();
            assert_eq!(calls, 1, "{prompt} went to the model {calls} times");
        }
    }
}

/// A stop starts no step that was waiting for a place when it began: with
/// one place for the account's steps, the second run's first step waits
/// behind the first run's, and once that one ends the stop (not the waiting
/// step) has the place. Before, the places were fair to whoever queued
/// first, so the waiting step went to the model during the stop, and a
/// step started then could be cut at the stop's end and sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_a_place_does_not_start_during_a_stop() {
    stop_while_one_call_is_out("flowd-stop-waiting-step", "steps_in_flight = 1").await;
}

/// A stop sends no call that waited for its turn when it began: with one
/// place among the account's model calls, the second run's first step holds
/// its step's place and waits for the first run's call, and once that one
/// answers, its call does not go out. Before, it went to the model during
/// the stop, where the grace period could cut it and the next start send it
/// again (an audit: a tool call queued for its connection went out 9 s
/// into a stop and ran twice). Tool calls wait for their turn on their
/// connection and are held back the same way (`TenantMcp`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_its_turn_does_not_go_out_during_a_stop() {
    stop_while_one_call_is_out("flowd-stop-waiting-call", "llm_concurrency = 1").await;
}

/// Two runs of a two-step chain on a flowd whose `[limits]` let one call
/// out at a time, stopped while the first run's first call is out, then
/// started again: only that call went to the model during the stop, and
/// each step went to it once in all.
async fn stop_while_one_call_is_out(name: &str, limit: &str) {
    use serde_json::json;
    let llm = common::chain_model(std::time::Duration::from_millis(1500)).await;
    let config = format!(
        "{CONFIG}{}[limits]\n{limit}\n",
        common::fake_model(&llm.url)
    );
    let dir = TempDir::new(name);
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, &common::model_chain(2)).await;
    let mut ids = Vec::new();
    for r in 0..2 {
        ids.push(
            flowd
                .start_run(
                    ACME,
                    json!({ "workflow": "chain", "input": { "tag": format!("run{r}") } }),
                )
                .await,
        );
    }
    llm.until_requests(1).await;
    let code = tokio::task::spawn_blocking(move || flowd.stop())
        .await
        .unwrap();
    assert_eq!(code, Some(0), "a stop is a clean exit");
    assert_eq!(
        llm.requests(),
        1,
        "only the call out when the stop began went to the model: {:?}",
        llm.prompts()
    );
    let flowd = Flowd::start_with(&dir, &config);
    for id in &ids {
        let record = flowd
            .settled_within(id, ACME, std::time::Duration::from_secs(60))
            .await;
        assert_eq!(record["status"], "completed", "{record}");
    }
    let prompts = llm.prompts();
    for r in 0..2 {
        for i in 0..2 {
            let prompt = format!("run{r} step {i}");
            let calls = prompts.iter().filter(|p| **p == prompt).count();
            assert_eq!(calls, 1, "{prompt} went to the model {calls} times");
        }
    }
}

/// A run's trace tells the steps it executes now, which have no record yet,
/// while this flowd drives it, and `flow show --server` puts them in its
/// header; once the run ends no step is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_runs_trace_tells_the_step_in_flight() {
    use reqwest::Method;
    use serde_json::json;
    let llm = common::chain_model(std::time::Duration::from_millis(1500)).await;
    let config = format!("{CONFIG}{}", common::fake_model(&llm.url));
    let dir = TempDir::new("flowd-in-flight");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, &common::model_chain(2)).await;
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "chain", "input": { "tag": "t" } }),
        )
        .await;
    llm.until_requests(1).await;

    let trace = flowd.trace(&run, ACME).await;
    assert_eq!(trace["steps"], json!([]), "{trace}");
    let now = &trace["in_flight"];
    assert_eq!(now.as_array().map(Vec::len), Some(1), "{trace}");
    assert_eq!(now[0]["path"], "s0", "{trace}");
    assert_eq!(now[0]["kind"], "recipe", "{trace}");
    assert_eq!(now[0]["attempts_failed"], 0, "{trace}");
    assert!(now[0]["calling_since_ms"].as_u64().is_some(), "{trace}");
    let shown = run_in(
        &flow_tests::flow_path(),
        dir.path(),
        &["--server", &flowd.url, "--api-key", ACME, "show", &run],
    );
    assert_eq!(shown.code, 0, "{}", shown.all());
    let header = shown
        .stdout
        .lines()
        .find(|line| line.starts_with("now"))
        .unwrap_or_else(|| panic!("no `now` line:\n{}", shown.stdout));
    assert!(header.contains("s0 (recipe, "), "{header}");

    // Another account sees nothing of it.
    let (status, _) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run}/trace"),
            Some(GLOBEX),
            None,
        )
        .await;
    assert_eq!(status, 404);

    let record = flowd.settled(&run, ACME).await;
    assert_eq!(record["status"], "completed", "{record}");
    let trace = flowd.trace(&run, ACME).await;
    assert!(trace.get("in_flight").is_none(), "{trace}");
}

/// Regression (an audit): two flowds on one SQLite file, which the docs
/// allow, each cached the account's deployments. A deploy or a delete
/// through one was never seen by the other: its starts ran the version
/// before, started a workflow deleted, or were refused 404 for good once
/// it had read the list before the first deploy.
#[tokio::test]
async fn two_flowds_on_one_sqlite_file_see_each_others_deploys() {
    use reqwest::Method;
    use serde_json::json;
    let (dir_a, dir_b, shared) = (
        TempDir::new("flowd-sqlite-a"),
        TempDir::new("flowd-sqlite-b"),
        TempDir::new("flowd-sqlite-store"),
    );
    let store = shared.path().join("flow.db");
    let config = format!("store = \"{}\"\n{CONFIG}", store.display());
    let a = Flowd::start_with(&dir_a, &config);
    let b = Flowd::start_with(&dir_b, &config);
    let (status, listed) = b.send(Method::GET, "/v1/workflows", Some(ACME), None).await;
    assert_eq!(status, 200, "{listed}");
    let gated = r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
}
"#;
    for version in [1, 2] {
        let source = gated.replace("Refund?", &format!("Refund (v{version})?"));
        a.deploy(ACME, &source).await;
        let run_id = b.start_run(ACME, json!({ "workflow": "refund" })).await;
        let parked = b.settled(&run_id, ACME).await;
        assert_eq!(
            parked["pending_approvals"][0]["message"],
            format!("Refund (v{version})?"),
            "{parked}"
        );
    }
    let (status, body) = a
        .send(Method::DELETE, "/v1/workflows/refund", Some(ACME), None)
        .await;
    assert!(status < 300, "{status} {body}");
    let (status, body) = b
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "refund" })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_workflow")),
        "{body}"
    );
    assert_eq!(a.stop(), Some(0));
    assert_eq!(b.stop(), Some(0));
}

/// Regression (an audit): a flowd on the SQLite file of a `flow run` that
/// was killed resumed that run (no account's, the CLI's) at its start or
/// sweep, with its own provider and configuration; `flow recover` then
/// found nothing. A flowd resumes its accounts' runs only. (Threads of
/// its own for the fake model, which answers while the test waits for
/// `flow`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flowd_leaves_a_killed_flow_runs_run_to_flow_recover() {
    use flow_tests::fake_llm::{FakeLlm, Reply};
    use serde_json::json;
    let model = FakeLlm::start(
        vec![Reply::Stall(std::time::Duration::from_secs(30))],
        json!({ "summary": "s" }),
        std::time::Duration::ZERO,
    )
    .await;
    let dir = TempDir::new("flowd-leaves-cli-runs");
    dir.write("w.flow", TWO_STEPS);
    let flow = flow_tests::flow_path();
    let mut child = std::process::Command::new(&flow)
        .args(["run", "w.flow", "--input", r#"{"text": "x"}"#])
        .current_dir(dir.path())
        .envs(model.flow_env())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("flow starts");
    let started = std::time::Instant::now();
    while !run_in(&flow, dir.path(), &["runs", "--json"])
        .stdout
        .contains("run-")
        || model.requests() == 0
    {
        assert!(started.elapsed().as_secs() < 20, "the run never started");
        // The fake model answers on this test's runtime.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    flow_tests::signal(child.id(), "KILL");
    let _ = child.wait();

    let flowd_dir = TempDir::new("flowd-leaves-cli-runs-flowd");
    let config = format!(
        "store = \"{}\"\n{CONFIG}{}",
        dir.path().join("flow.db").display(),
        common::fake_model(&model.url)
    );
    let flowd = Flowd::start_with(&flowd_dir, &config);
    // Past flowd's start and its first sweep for runs of processes gone.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(model.requests(), 1, "flowd sent the CLI's step again");
    let runs = run_in(&flow, dir.path(), &["runs", "--json"]);
    assert!(
        runs.stdout.contains(r#""status":"running""#),
        "{}",
        runs.stdout
    );
    assert_eq!(flowd.stop(), Some(0));

    let recovered = flow_tests::run_bounded(
        &flow,
        dir.path(),
        &["recover"],
        &model.flow_env(),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(recovered.code, 0, "{}", recovered.all());
    assert!(recovered.all().contains("completed"), "{}", recovered.all());
}

/// A gate decided while another branch of its run still runs in this
/// flowd: the run takes the decision up as it parks, and is not driven a
/// second time beside it. Regression (a review): the decision's claim
/// succeeded on the run this flowd drove, and on SQLite (which nothing
/// fences within one process) the other branch's step went to the model
/// twice.
#[tokio::test]
async fn a_gate_decided_while_its_run_is_driven_here_is_driven_once() {
    use std::time::Duration;

    use flow_tests::fake_llm::FakeLlm;
    use serde_json::json;

    let model = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_secs(2)).await;
    let dir = TempDir::new("flowd-decided-while-driven");
    let flowd = Flowd::start_with(
        &dir,
        &(CONFIG.to_string() + &common::fake_model(&model.url)),
    );
    flowd
        .deploy(
            ACME,
            "recipe answer { model \"default\" input { q: string } output { text: string } prompt \"{{input.q}}\" }
workflow both {
  parallel p {
    branch gate { step ok = approval { approvers: [\"ana@acme.io\"], message: \"Go?\" } }
    branch slow { step a = answer { q: \"x\" } }
  }
  output { approved: step.ok.approved, text: step.a.text }
}
",
        )
        .await;
    let run = flowd.start_run(ACME, json!({ "workflow": "both" })).await;
    // The gate is recorded pending as the slow branch's call goes out.
    let waited = std::time::Instant::now();
    while model.requests() < 1 {
        assert!(waited.elapsed() < Duration::from_secs(20), "no call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut decided = None;
    for _ in 0..100 {
        let (status, body) = flowd.approve(ACME, &run, "p/gate/ok").await;
        if status == 202 {
            decided = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(decided.is_some(), "the gate was decided while the run ran");
    let record = flowd
        .settled_within(&run, ACME, Duration::from_secs(30))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["output"], json!({ "approved": true, "text": "t" }));
    assert_eq!(model.requests(), 1, "{:?}", model.prompts());
    assert_eq!(flowd.stop(), Some(0));
}
