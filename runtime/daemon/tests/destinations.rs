//! Destinations (issue 19): a workflow's `deliver` settings, delivered by
//! flowd after the run has its status, through the webhooks' durable
//! outbox: to the account's endpoint (signed), by email (text and HTML),
//! into the KB; retried, across a kill -9, once per delivery id where the
//! destination can tell (the KB's idempotency key, the webhook's id).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{ACME, CONFIG, Flowd, Receiver, SECRET};
use flow_runtime::store::{KbStore, RunChange};
use flow_tests::TempDir;
use flow_tests::smtp_sink::SmtpSink;
use serde_json::json;

/// `CONFIG` with acme's endpoint `crm` at `url`, subscribed to no event of
/// its own (it gets only what destinations send), and SMTP at `smtp_port`.
fn config(url: &str, smtp_port: u16) -> String {
    format!(
        "{CONFIG}[[accounts.webhooks]]\nname = \"crm\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nevents = []\n\
         [smtp]\nhost = \"127.0.0.1\"\nport = {smtp_port}\nfrom = \"flowd@acme.io\"\ntls = \"none\"\n"
    )
}

/// A workflow whose result goes to `destinations` (in this order).
fn workflow(destinations: &str) -> String {
    format!(
        r#"recipe summarize {{
  model "default"
  input {{ text: string }}
  output {{ summary: string }}
  prompt "Summarize {{{{input.text}}}}"
}}
workflow digest {{
  input {{ ticket: string, text: string }}
{destinations}
  step first = summarize {{ text: workflow_input.text }}
  output {{ summary: step.first.summary }}
}}
"#
    )
}

const TO_KB: &str = r#"  deliver on completed to kb "digests" title "{{workflow_input.ticket}}" content output.summary"#;
const TO_CRM: &str = r#"  deliver on completed to webhook "crm""#;
const TO_LEADS: &str = r#"  deliver on completed to email ["leads"] subject "Digest <{{workflow_input.ticket}}>" body "{{output.summary}}""#;

async fn completed_run(flowd: &Flowd, ticket: &str) -> String {
    let run_id = flowd
        .start_run(
            ACME,
            json!({ "workflow": "digest", "input": { "ticket": ticket, "text": "<b>t</b>" } }),
        )
        .await;
    assert_eq!(flowd.settled(&run_id, ACME).await["status"], "completed");
    run_id
}

/// The run's deliveries as its trace shows them.
async fn deliveries(flowd: &Flowd, run_id: &str) -> Vec<RunChange> {
    let trace = flowd.trace(run_id, ACME).await;
    serde_json::from_value::<Vec<RunChange>>(trace["history"].clone())
        .unwrap()
        .into_iter()
        .filter(|change| matches!(change, RunChange::Delivery { .. }))
        .collect()
}

/// The deliveries of the trace, as `(destination, result)`, once `count`
/// are there.
async fn results(flowd: &Flowd, run_id: &str, count: usize) -> Vec<(u32, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<_> = deliveries(flowd, run_id)
            .await
            .into_iter()
            .filter_map(|change| match change {
                RunChange::Delivery {
                    destination,
                    result,
                    id,
                    ..
                } => Some((destination, result, id)),
                _ => None,
            })
            .collect();
        if found.len() >= count {
            return found;
        }
        assert!(Instant::now() < deadline, "{found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kb_document(dir: &TempDir, title: &str) -> Option<flow_runtime::services::KbDocument> {
    let store = flow_runtime::sqlite::SqliteStore::open(&dir.path().join("flowd.db")).unwrap();
    block_on(store.kb_document("acme", "digests", title))
}

/// Waits on a store's future from a test's synchronous helper.
fn block_on<T>(future: flow_runtime::store::StoreFuture<'_, T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_is_delivered_to_a_real_receiver_mailbox_and_kb() {
    let receiver = Receiver::start(204).await;
    let sink = SmtpSink::start().await;
    let dir = TempDir::new("flowd-destinations");
    let flowd = Flowd::start_with(&dir, &config(&receiver.url, sink.port));
    flowd
        .deploy(ACME, &workflow(&[TO_KB, TO_CRM, TO_LEADS].join("\n")))
        .await;
    let run_id = completed_run(&flowd, "T-7").await;

    let posts = receiver
        .until(Duration::from_secs(15), |p| !p.is_empty())
        .await;
    assert!(posts[0].signed, "a verified Standard Webhooks signature");
    assert!(
        posts[0]
            .id
            .starts_with(&format!("dlv_{run_id}_1_completed_")),
        "{}",
        posts[0].id
    );
    assert_eq!(posts[0].body["event"], "completed");
    assert_eq!(posts[0].body["run"]["run_id"], run_id.as_str());
    assert!(posts[0].body["run"]["output"]["summary"].is_string());

    let mails = sink.wait_for(1).await;
    assert_eq!(
        mails[0].to,
        vec!["ana@acme.io".to_string()],
        "the group `leads`"
    );
    assert_eq!(mails[0].header("subject"), Some("Digest <T-7>"));
    assert!(
        mails[0]
            .header("content-type")
            .unwrap()
            .starts_with("multipart/alternative"),
        "{:?}",
        mails[0].headers
    );
    assert!(mails[0].body.contains("text/plain") && mails[0].body.contains("text/html"));

    let found = results(&flowd, &run_id, 3).await;
    let mut destinations: Vec<u32> = found.iter().map(|(d, _, _)| *d).collect();
    destinations.sort_unstable();
    assert_eq!(destinations, vec![0, 1, 2], "{found:?}");
    assert!(
        found.iter().all(|(_, result, _)| result == "delivered"),
        "{found:?}"
    );

    let document = kb_document(&dir, "T-7").expect("the KB destination wrote it");
    assert_eq!(document.version, 1);
    assert!(!document.content.is_empty());
    for kind in ["webhook", "email", "kb"] {
        flowd
            .metric_reaches(
                &format!(
                    "flow_destination_deliveries_total{{account=\"acme\",kind=\"{kind}\",result=\"delivered\"}} 1"
                ),
                Duration::from_secs(5),
            )
            .await;
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// A receiver that refuses for a while: each failed attempt is in the
/// trace, retried under one id until it is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_failing_for_a_while_is_retried_until_it_takes_it() {
    let receiver = Receiver::start(503).await;
    let sink = SmtpSink::start().await;
    let dir = TempDir::new("flowd-destination-retry");
    let flowd = Flowd::start_with(&dir, &config(&receiver.url, sink.port));
    flowd.deploy(ACME, &workflow(TO_CRM)).await;
    let run_id = completed_run(&flowd, "T-8").await;
    receiver
        .until(Duration::from_secs(15), |p| p.len() >= 2)
        .await;
    receiver.answer.store(204, Ordering::SeqCst);
    let posts = receiver
        .until(Duration::from_secs(15), |p| {
            p.iter().any(|p| p.answered == 204)
        })
        .await;
    assert!(
        posts.iter().all(|post| post.id == posts[0].id),
        "{posts:#?}"
    );
    let found = results(&flowd, &run_id, posts.len()).await;
    let (last, before) = found.split_last().unwrap();
    assert_eq!(last.1, "delivered", "{found:?}");
    assert!(
        before.len() >= 2 && before.iter().all(|(_, r, _)| r == "failed"),
        "{found:?}"
    );
    flowd
        .metric_reaches(
            &format!(
                "flow_destination_deliveries_total{{account=\"acme\",kind=\"webhook\",result=\"failed\"}} {}",
                before.len()
            ),
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(flowd.stop(), Some(0));
}

/// flowd killed after the run completed, while its destinations are being
/// delivered: the restarted flowd delivers them, and the KB document,
/// written before the kill, is not written again (one version per id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_delivered_after_a_kill_9_once_per_id() {
    let receiver = Receiver::start(204).await;
    // The webhook is slow: flowd is killed while its post is out, after
    // the KB destination (written first) but before the attempt's record.
    receiver.delay_ms.store(3_000, Ordering::SeqCst);
    let sink = SmtpSink::start().await;
    let dir = TempDir::new("flowd-destination-crash");
    let config = config(&receiver.url, sink.port);
    let flowd = Flowd::start_with(&dir, &config);
    flowd
        .deploy(ACME, &workflow(&[TO_KB, TO_CRM].join("\n")))
        .await;
    let run_id = completed_run(&flowd, "T-9").await;
    let first = receiver
        .until(Duration::from_secs(10), |p| !p.is_empty())
        .await;
    drop(flowd); // SIGKILL
    assert_eq!(kb_document(&dir, "T-9").map(|d| d.version), Some(1));

    receiver.delay_ms.store(0, Ordering::SeqCst);
    let flowd = Flowd::start_with(&dir, &config);
    let posts = receiver
        .until(Duration::from_secs(20), |p| p.len() >= 2)
        .await;
    assert_eq!(
        posts[1].id, first[0].id,
        "the same delivery id after the crash"
    );
    let found = results(&flowd, &run_id, 2).await;
    assert!(found.iter().all(|(_, r, _)| r == "delivered"), "{found:?}");
    // Delivered: nothing more comes, and the document kept its one version.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.posts().len(), 2);
    assert_eq!(kb_document(&dir, "T-9").map(|d| d.version), Some(1));
    assert_eq!(flowd.stop(), Some(0));
}

/// A workflow naming an endpoint or a recipient the account does not have
/// is refused at deploy, every missing name said.
#[tokio::test]
async fn a_deploy_naming_what_the_account_lacks_is_refused() {
    let dir = TempDir::new("flowd-destination-deploy");
    let flowd = Flowd::start(&dir);
    let source = workflow(
        "  deliver on completed to webhook \"erp\"\n  deliver on failed to email [\"leads\", \"finance\"] subject \"s\" body \"b\"",
    );
    let (status, body) = flowd.try_deploy(ACME, json!({ "source": source })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "unknown_destination");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("webhook endpoint `erp`"), "{detail}");
    assert!(detail.contains("emails `finance`"), "{detail}");
    assert!(!detail.contains("`leads`"), "{detail}");
    assert_eq!(flowd.stop(), Some(0));
}

/// A run that parks at two approvals in turn reaches `parked` twice: two
/// deliveries, told apart by their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_time_a_run_parks_is_a_delivery_of_its_own() {
    let receiver = Receiver::start(204).await;
    let sink = SmtpSink::start().await;
    let dir = TempDir::new("flowd-destination-parked");
    let flowd = Flowd::start_with(&dir, &config(&receiver.url, sink.port));
    flowd
        .deploy(
            ACME,
            r#"workflow twice {
  deliver on parked to webhook "crm"
  step first = approval { approvers: ["ana@acme.io"], message: "First?" }
  step second = approval { approvers: ["ana@acme.io"], message: "Second?" }
  output { approved: step.second.approved }
}
"#,
        )
        .await;
    let run_id = flowd
        .start_run(ACME, json!({ "workflow": "twice", "input": {} }))
        .await;
    assert_eq!(
        flowd.settled(&run_id, ACME).await["status"],
        "pending_approval"
    );
    receiver
        .until(Duration::from_secs(15), |p| p.len() == 1)
        .await;
    let (status, body) = flowd.approve(ACME, &run_id, "first").await;
    assert!(status < 300, "{status} {body}");
    let posts = receiver
        .until(Duration::from_secs(15), |p| p.len() == 2)
        .await;
    assert_ne!(posts[0].id, posts[1].id, "{posts:#?}");
    for post in &posts {
        assert!(
            post.id.starts_with(&format!("dlv_{run_id}_0_parked_")),
            "{}",
            post.id
        );
        assert_eq!(post.body["run"]["status"], "pending_approval");
    }
    assert_eq!(flowd.stop(), Some(0));
}
