//! Durable webhooks (issue 13): a run's events wait in the store's outbox
//! until the account's endpoint takes them, across a receiver's outage and
//! a crash of flowd, for `[limits] webhook_retry_secs`; every event kind is
//! posted; every attempt carries the same message id.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{ACME, CONFIG, Flowd, Post, Receiver, SECRET, TWO_STEPS};
use flow_tests::TempDir;
use reqwest::Method;
use serde_json::json;

/// `CONFIG` with acme's endpoint at `url` for `events`, and `limits`.
fn config(url: &str, events: &str, limits: &str) -> String {
    format!(
        "{CONFIG}[[accounts.webhooks]]\nname = \"crm\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nevents = {events}\n{limits}"
    )
}

/// Deploys `TWO_STEPS` for acme and runs it to completion; its id.
async fn completed_run(flowd: &Flowd) -> String {
    flowd.deploy(ACME, TWO_STEPS).await;
    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "text": "t" } }),
        )
        .await;
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "completed");
    run_id
}

fn delivered(posts: &[Post]) -> bool {
    posts.iter().any(|post| post.answered == 204)
}

/// Regression: deliveries were five attempts within about four seconds, in
/// memory; a receiver down for longer lost the event for good.
#[tokio::test]
async fn a_receiver_down_longer_than_four_seconds_still_gets_the_event() {
    let receiver = Receiver::start(503).await;
    let dir = TempDir::new("flowd-webhook-outage");
    let flowd = Flowd::start_with(&dir, &config(&receiver.url, "[\"completed\"]", ""));
    let run_id = completed_run(&flowd).await;

    let first = receiver
        .until(Duration::from_secs(10), |p| !p.is_empty())
        .await[0]
        .at;
    // Down for six seconds from the first attempt, then back.
    tokio::time::sleep_until((first + Duration::from_secs(6)).into()).await;
    receiver.answer(204);
    let posts = receiver.until(Duration::from_secs(20), delivered).await;
    let ok = posts.iter().find(|post| post.answered == 204).unwrap();
    assert!(ok.at >= first + Duration::from_secs(6), "{posts:#?}");
    assert!(
        posts.iter().all(|post| post.id == posts[0].id),
        "one message id on every attempt: {posts:#?}"
    );
    assert_eq!(ok.body["event"], "completed");
    assert_eq!(ok.body["run"]["run_id"], run_id.as_str());
    assert!(ok.body["run"]["output"]["summary"].is_string());
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression: pending deliveries lived in flowd's memory, and a crash
/// dropped every one of them.
#[tokio::test]
async fn an_event_not_yet_delivered_survives_kill_9() {
    let receiver = Receiver::start(500).await;
    // Killed while its post is out: the event is claimed, not yet recorded.
    receiver.delay_ms.store(3_000, Ordering::SeqCst);
    let dir = TempDir::new("flowd-webhook-crash");
    let config = config(&receiver.url, "[\"completed\"]", "");
    let flowd = Flowd::start_with(&dir, &config);
    let run_id = completed_run(&flowd).await;
    let refused = receiver
        .until(Duration::from_secs(10), |p| !p.is_empty())
        .await;
    drop(flowd); // SIGKILL
    receiver.answer(204);
    receiver.delay_ms.store(0, Ordering::SeqCst);
    let flowd = Flowd::start_with(&dir, &config);
    let posts = receiver.until(Duration::from_secs(20), delivered).await;
    let ok = posts.iter().find(|post| post.answered == 204).unwrap();
    assert_eq!(ok.id, refused[0].id, "the same message id after the crash");
    assert_eq!(ok.body["run"]["run_id"], run_id.as_str());
    // Delivered once: nothing more comes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = receiver.posts();
    assert_eq!(
        after.iter().filter(|post| post.answered == 204).count(),
        1,
        "{after:#?}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression: a graceful stop (SIGTERM) aborted the posts out, and an
/// endpoint that had taken the event was posted it again on the next start.
#[tokio::test]
async fn a_post_out_at_a_graceful_stop_is_recorded_not_made_again() {
    let receiver = Receiver::start(204).await;
    receiver.delay_ms.store(1_500, Ordering::SeqCst);
    let dir = TempDir::new("flowd-webhook-stop");
    let config = config(&receiver.url, "[\"completed\"]", "");
    let flowd = Flowd::start_with(&dir, &config);
    completed_run(&flowd).await;
    receiver
        .until(Duration::from_secs(10), |p| !p.is_empty())
        .await;
    // Stopped while the post is out; the receiver answers meanwhile.
    let stopped = tokio::task::spawn_blocking(move || flowd.stop());
    assert_eq!(stopped.await.unwrap(), Some(0));
    receiver.delay_ms.store(0, Ordering::SeqCst);
    let flowd = Flowd::start_with(&dir, &config);
    // The deliverer looks at once as it starts, and every second after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let posts = receiver.posts();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    assert_eq!(flowd.stop(), Some(0));
}

/// A run that parks, is cancelled, or fails posts `parked`, `cancelled`
/// and `failed`, each with the run's state at that moment.
#[tokio::test]
async fn parked_cancelled_and_failed_runs_post_their_events() {
    let receiver = Receiver::start(204).await;
    let dir = TempDir::new("flowd-webhook-events");
    let flowd = Flowd::start_with(
        &dir,
        &config(&receiver.url, "[\"parked\", \"cancelled\", \"failed\"]", ""),
    );
    flowd
        .deploy(
            ACME,
            "workflow refund {
  input { approvers: list<string> }
  step ok = approval { approvers: workflow_input.approvers, message: \"Refund?\" }
  output { approved: step.ok.approved }
}
",
        )
        .await;
    let parked = flowd
        .start_run(
            ACME,
            json!({ "workflow": "refund", "input": { "approvers": ["ana@acme.io"] } }),
        )
        .await;
    assert_eq!(
        flowd.settled(&parked, ACME).await["status"],
        "pending_approval"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{parked}/cancel"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Nobody may decide an approval without approvers: the run fails.
    let failed = flowd
        .start_run(
            ACME,
            json!({ "workflow": "refund", "input": { "approvers": [] } }),
        )
        .await;
    assert_eq!(flowd.settled(&failed, ACME).await["status"], "failed");

    let posts = receiver
        .until(Duration::from_secs(15), |posts| posts.len() >= 3)
        .await;
    let of = |run: &str, event: &str| {
        posts
            .iter()
            .find(|post| post.body["run"]["run_id"] == run && post.body["event"] == event)
            .unwrap_or_else(|| panic!("no `{event}` of {run}: {posts:#?}"))
            .clone()
    };
    let park = of(&parked, "parked");
    assert_eq!(park.body["run"]["status"], "pending_approval");
    assert_eq!(park.body["run"]["pending_approvals"][0]["path"], "ok");
    assert_eq!(park.body["account"], "acme");
    assert_eq!(of(&parked, "cancelled").body["run"]["status"], "cancelled");
    let fail = of(&failed, "failed");
    assert_eq!(fail.body["run"]["error"]["step"], "ok", "{:#}", fail.body);
    assert_eq!(posts.len(), 3, "one post per event: {posts:#?}");
    assert_ne!(park.id, of(&parked, "cancelled").id);
    assert_eq!(flowd.stop(), Some(0));
}

/// An endpoint that never takes an event is given up after
/// `webhook_retry_secs`, counted as failed, and posted no more.
#[tokio::test]
async fn an_event_is_given_up_after_the_retry_period() {
    let receiver = Receiver::start(500).await;
    let dir = TempDir::new("flowd-webhook-give-up");
    let flowd = Flowd::start_with(
        &dir,
        &config(
            &receiver.url,
            "[\"completed\"]",
            "[limits]\nwebhook_retry_secs = 2\n",
        ),
    );
    completed_run(&flowd).await;
    flowd
        .metric_reaches(
            "flow_webhook_deliveries_total{account=\"acme\",result=\"failed\"} 1",
            Duration::from_secs(15),
        )
        .await;
    let attempts = receiver.posts().len();
    assert!(attempts >= 2, "retried before giving up: {attempts}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.posts().len(), attempts, "no post after giving up");
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression: the deliverer's 64 attempts in flight went to the oldest
/// due events, whoever's. An account whose endpoint takes seconds to answer
/// and whose runs end by the dozen held every one, and another account's
/// events waited (here 9 s; with a hanging endpoint, behind its retries for
/// as long as they lasted). Now an account takes more than its fair quarter
/// only while a quarter stays free for the others.
#[tokio::test]
async fn an_accounts_slow_endpoint_holds_back_no_other_accounts_events() {
    use common::GLOBEX;
    let slow = Receiver::start(204).await;
    slow.delay_ms.store(9_000, Ordering::SeqCst);
    let quick = Receiver::start(204).await;
    let config = common::config_with_endpoints(&slow.url, &quick.url);
    let dir = TempDir::new("flowd-webhook-share");
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(GLOBEX, TWO_STEPS).await;
    // More ended runs than the deliverer has attempts in flight.
    for _ in 0..80 {
        let run = flowd
            .start_run(
                GLOBEX,
                json!({ "workflow": "digest", "input": { "text": "t" } }),
            )
            .await;
        flowd.settled(&run, GLOBEX).await;
    }
    slow.until(Duration::from_secs(5), |posts| posts.len() >= 48)
        .await;
    // Acme's event goes out while globex's posts are all still waiting.
    let run_id = completed_run(&flowd).await;
    let posts = quick.until(Duration::from_secs(5), delivered).await;
    assert_eq!(posts[0].body["run"]["run_id"], run_id.as_str());
    // Until the first of globex's posts is answered, three quarters of the
    // attempts are globex's: a quarter stayed free, and acme took one.
    let posts = slow.posts();
    let answered = posts[0].at + Duration::from_millis(8_500);
    let held = posts.iter().filter(|post| post.at < answered).count();
    assert_eq!(held, 48, "{posts:#?}");
    assert_eq!(flowd.stop(), Some(0));
}
