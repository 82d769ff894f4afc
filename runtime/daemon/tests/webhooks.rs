//! Durable webhooks (issue 13): a run's events wait in the store's outbox
//! until the account's endpoint takes them, across a receiver's outage and
//! a crash of flowd, for `[limits] webhook_retry_secs`; every event kind is
//! posted; every attempt carries the same message id.

mod common;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::{ACME, CONFIG, Flowd, TWO_STEPS};
use flow_tests::TempDir;
use reqwest::Method;
use serde_json::{Value, json};

/// A webhook receiver on loopback that answers what it is told to and
/// keeps every post.
struct Receiver {
    url: String,
    answer: Arc<AtomicU16>,
    /// How long it takes to answer, in milliseconds.
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
    posts: Arc<Mutex<Vec<Post>>>,
}

#[derive(Clone, Debug)]
struct Post {
    id: String,
    event: Value,
    at: Instant,
    answered: u16,
}

impl Receiver {
    async fn start(answer: u16) -> Receiver {
        let answer = Arc::new(AtomicU16::new(answer));
        let delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
        let router = {
            let (answer, posts) = (Arc::clone(&answer), Arc::clone(&posts));
            let delay_ms = Arc::clone(&delay_ms);
            axum::Router::new().route(
                "/hook",
                axum::routing::post(move |headers: HeaderMap, body: String| async move {
                    let answered = answer.load(Ordering::SeqCst);
                    posts.lock().unwrap().push(Post {
                        id: headers["webhook-id"].to_str().unwrap().to_string(),
                        event: serde_json::from_str(&body).unwrap(),
                        at: Instant::now(),
                        answered,
                    });
                    let delay = delay_ms.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    StatusCode::from_u16(answered).unwrap()
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Receiver {
            url,
            answer,
            delay_ms,
            posts,
        }
    }

    fn answer(&self, status: u16) {
        self.answer.store(status, Ordering::SeqCst);
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    /// Waits until a post satisfies `done`; the posts so far.
    async fn until(&self, within: Duration, done: impl Fn(&[Post]) -> bool) -> Vec<Post> {
        let deadline = Instant::now() + within;
        loop {
            let posts = self.posts();
            if done(&posts) {
                return posts;
            }
            assert!(
                Instant::now() < deadline,
                "not within {within:?}: {posts:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `CONFIG` with acme's endpoint at `url` for `events`, and `limits`.
fn config(url: &str, events: &str, limits: &str) -> String {
    format!(
        "{CONFIG}[[accounts.webhooks]]\nname = \"crm\"\nurl = \"{url}\"\nsecret = \"whsec-0123456789abcdef\"\nevents = {events}\n{limits}"
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
    assert_eq!(ok.event["event"], "completed");
    assert_eq!(ok.event["run"]["run_id"], run_id.as_str());
    assert!(ok.event["run"]["output"]["summary"].is_string());
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
    assert_eq!(ok.event["run"]["run_id"], run_id.as_str());
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
            .find(|post| post.event["run"]["run_id"] == run && post.event["event"] == event)
            .unwrap_or_else(|| panic!("no `{event}` of {run}: {posts:#?}"))
            .clone()
    };
    let park = of(&parked, "parked");
    assert_eq!(park.event["run"]["status"], "pending_approval");
    assert_eq!(park.event["run"]["pending_approvals"][0]["path"], "ok");
    assert_eq!(park.event["account"], "acme");
    assert_eq!(of(&parked, "cancelled").event["run"]["status"], "cancelled");
    let fail = of(&failed, "failed");
    assert_eq!(fail.event["run"]["error"]["step"], "ok", "{:#}", fail.event);
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
