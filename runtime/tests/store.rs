//! The SQLite store: durability modes, exactly-once decisions, KB versions
//! and idempotency keys, migrations on reopen, and the runner on top of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use flow_plan::Durability;
use flow_runtime::interp::{Decision, Effects, Handoff, KbWrite, Outcome, Services};
use flow_runtime::offline::OfflineProvider;
use flow_runtime::sqlite::{RunJournal, SqliteStore};
use flow_runtime::store::{
    MailNext, MailState, NotificationKind, NotificationQuery, RunLog, RunStatus, Store,
};
use flow_tests::TempDir;
use serde_json::json;

fn plan(source: &str) -> flow_plan::Plan {
    let checked = flow_compiler::check_source("s.flow", source);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    flow_compiler::lower(&checked).expect("lowers")
}

/// Every notification, read or not.
const ALL: NotificationQuery = NotificationQuery {
    unread_only: false,
    limit: 1_000,
};

const TWO_STEPS: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  durability approval
  step one = r { q: "1" }
  step two = r { q: step.one.a }
}"#;

async fn run(journal: Arc<RunJournal>, plan: &flow_plan::Plan) -> Outcome {
    let services = Services {
        provider: Arc::new(OfflineProvider),
        effects: journal.clone(),
        mcp: None,
        journal,
    };
    flow_runtime::run(plan, "w", "run-1", json!({}), services).await
}

#[tokio::test]
async fn durability_approval_persists_at_the_end_only() {
    let dir = TempDir::new("store-durability");
    let store = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).unwrap();
    store
        .create_run("run-1", "", "w", &plan.hash, &json!({}), None)
        .await
        .unwrap();
    let journal = RunJournal::open(&store, "run-1", Durability::Approval).unwrap();
    let outcome = run(journal.clone(), &plan).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert!(
        store.step_records("run-1").unwrap().is_empty(),
        "nothing written before the flush"
    );
    journal.flush().await.unwrap();
    assert_eq!(store.step_records("run-1").unwrap().len(), 2);

    // Full durability writes as it goes.
    store
        .create_run("run-2", "", "w", &plan.hash, &json!({}), None)
        .await
        .unwrap();
    let journal = RunJournal::open(&store, "run-2", Durability::Full).unwrap();
    let services = Services {
        provider: Arc::new(OfflineProvider),
        effects: journal.clone(),
        mcp: None,
        journal,
    };
    let _ = flow_runtime::run(&plan, "w", "run-2", json!({}), services).await;
    assert_eq!(store.step_records("run-2").unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_applies_once_across_tasks_and_survives_reopening() {
    let dir = TempDir::new("store-decide");
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).expect("opens");
    let plan = plan("workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }");
    store.put_plan(&plan).unwrap();
    store
        .create_run("run-1", "", "w", &plan.hash, &json!({}), None)
        .await
        .unwrap();
    let journal = RunJournal::open(&store, "run-1", Durability::Full).unwrap();
    assert!(matches!(run(journal, &plan).await, Outcome::Parked { .. }));

    let applied = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let (store, applied) = (Arc::clone(&store), Arc::clone(&applied));
            tokio::spawn(async move {
                if store
                    .decide("run-1", "g", &decision("a", i % 2 == 0))
                    .await
                    .expect("the store answers")
                    .is_ok()
                {
                    applied.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(applied.load(Ordering::SeqCst), 1);
    drop(store);

    let reopened = SqliteStore::open(&path).expect("reopens, migrations already applied");
    let records = reopened.step_records("run-1").unwrap();
    assert_eq!(records.len(), 1);
    assert_ne!(records[0].status, flow_runtime::interp::StepStatus::Pending);
    assert_eq!(
        reopened.plan(&plan.hash).unwrap(),
        plan,
        "the run's plan is kept"
    );
}

#[tokio::test]
async fn kb_writes_version_documents_and_keys_make_retries_no_ops() {
    let dir = TempDir::new("store-kb");
    let store = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let journal = RunJournal::open(&store, "run-1", Durability::Full).unwrap();
    let write = |content: &str, key: Option<&str>| KbWrite {
        collection: "notes".into(),
        title: "T".into(),
        content: content.into(),
        metadata: None,
        key: key.map(str::to_string),
    };
    let first = journal.kb_write(&write("a", Some("k1"))).await.unwrap();
    assert_eq!(first, json!({ "id": "notes/T", "version": 1 }));
    let again = journal.kb_write(&write("b", Some("k1"))).await.unwrap();
    assert_eq!(again, first, "the same key is the same write");
    let second = journal.kb_write(&write("c", None)).await.unwrap();
    assert_eq!(second["version"], 2);
}

/// Regression: KB documents, write keys and notifications had no account, so
/// one account's workflow could overwrite another's document, get its keyed
/// result back, or read its handoffs.
#[tokio::test]
async fn kb_documents_keys_and_notifications_belong_to_the_run_account() {
    let dir = TempDir::new("store-kb-accounts");
    let store = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).unwrap();
    let mut journals = Vec::new();
    for (run, account) in [("run-a", "acme"), ("run-b", "globex")] {
        store
            .create_run(run, account, "w", &plan.hash, &json!({}), None)
            .await
            .unwrap();
        journals.push(RunJournal::open(&store, run, Durability::Full).unwrap());
    }
    let write = |content: &str| KbWrite {
        collection: "notes".into(),
        title: "T".into(),
        content: content.into(),
        metadata: None,
        key: Some("k1".into()),
    };
    let acme = journals[0].kb_write(&write("acme's")).await.unwrap();
    let globex = journals[1].kb_write(&write("globex's")).await.unwrap();
    assert_eq!(acme["version"], 1);
    assert_eq!(
        globex["version"], 1,
        "globex's write neither returns acme's keyed result nor versions acme's document"
    );

    for (journal, run) in journals.iter().zip(["run-a", "run-b"]) {
        journal
            .handoff(&Handoff {
                run_id: run.into(),
                department: "support".into(),
                message: format!("from {run}"),
                subject: None,
                key: Some("h1".into()),
            })
            .await
            .unwrap();
    }
    let audiences = ["support".to_string()];
    let listed = store
        .notifications("acme", &audiences, "ana@x.io", &ALL)
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].message, "from run-a");
    assert_eq!(listed[0].kind, NotificationKind::Handoff);
    assert!(!listed[0].read);

    // Marking is per reader and per account: globex cannot mark acme's.
    assert_eq!(
        store
            .mark_read("globex", "ana@x.io", &[listed[0].id])
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .mark_read("acme", "ana@x.io", &[listed[0].id])
            .unwrap(),
        1
    );
    assert!(
        store
            .notifications("acme", &audiences, "ana@x.io", &ALL)
            .unwrap()[0]
            .read
    );
    assert!(
        !store
            .notifications("acme", &audiences, "bo@x.io", &ALL)
            .unwrap()[0]
            .read
    );
    let unread = NotificationQuery {
        unread_only: true,
        ..ALL
    };
    assert!(
        store
            .notifications("acme", &audiences, "ana@x.io", &unread)
            .unwrap()
            .is_empty()
    );

    // Both handoffs wait in the outbox until mailed.
    let outbox = store.to_mail(u64::MAX, 10).unwrap();
    assert_eq!(outbox.len(), 2);
    store
        .mailed(
            outbox[0].notification.id,
            &[],
            MailNext::Done(MailState::Sent),
        )
        .unwrap();
    assert_eq!(store.to_mail(u64::MAX, 10).unwrap().len(), 1);

    // A retry: the recipients reached are kept, and the notification waits
    // until its time.
    let left = outbox[1].notification.id;
    store
        .mailed(left, &["sam@x.io".to_string()], MailNext::Retry(5_000))
        .unwrap();
    assert!(store.to_mail(4_999, 10).unwrap().is_empty(), "not yet");
    let again = store.to_mail(5_000, 10).unwrap();
    assert_eq!(
        (again[0].attempts, again[0].sent_to.clone()),
        (1, vec!["sam@x.io".to_string()])
    );
}

const GATED: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  step one = r { q: "1" }
  step ok = approval { approvers: ["boss@example.com"], message: "go?" }
  step two = r { q: step.one.a }
  output { a: step.two.a }
}"#;

/// The runner drives a run through the `Store` trait alone: it parks with the
/// run stored as `pending_approval`, a decision lets the next invocation
/// complete it, and recovery lists only what is due.
#[tokio::test]
async fn the_runner_parks_resumes_and_lists_runs_to_recover() {
    use flow_runtime::runner::{drive, runs_to_recover};
    let dir = TempDir::new("store-runner");
    let sqlite = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let store: Arc<dyn Store> = sqlite;
    let plan = plan(GATED);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", "w", &plan.hash, &json!({}), None)
        .await
        .unwrap();
    store
        .create_run("run-2", "", "w", &plan.hash, &json!({}), None)
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let observer: flow_runtime::runner::Observer = {
        let calls = Arc::clone(&calls);
        Arc::new(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    let parked = drive(
        &store,
        &plan,
        "w",
        "run-1",
        json!({}),
        Arc::new(OfflineProvider),
        Some(observer),
    )
    .await
    .unwrap();
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "step one and the gate were observed"
    );
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().status,
        RunStatus::PendingApproval
    );
    // The gate's approver was notified in the commit that stored the gate:
    // no later step (that a crash could skip) is needed for it.
    let notes = store
        .notifications(
            "",
            &["boss@example.com".to_string()],
            "boss@example.com",
            &ALL,
        )
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].kind, NotificationKind::Approval);
    assert_eq!(notes[0].step_path.as_deref(), Some("ok"));
    assert_eq!(notes[0].subject.as_deref(), Some("Approval needed: w (ok)"));

    // run-2 was created but never driven: as after a crash, it is due for
    // recovery; the parked run-1 is not (its approval has no expiry).
    let due: Vec<String> = runs_to_recover(store.as_ref(), u64::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(due, ["run-2"]);

    store
        .decide("run-1", "ok", &decision("boss@example.com", true))
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .claim_run("run-1", &[RunStatus::PendingApproval])
            .await
            .unwrap()
    );
    let done = drive(
        &store,
        &plan,
        "w",
        "run-1",
        json!({}),
        Arc::new(OfflineProvider),
        None,
    )
    .await
    .unwrap();
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.outcome.unwrap()["output"], done_output(&done));
}

fn done_output(outcome: &Outcome) -> serde_json::Value {
    match outcome {
        Outcome::Completed { output } => output.clone(),
        other => panic!("not completed: {other:?}"),
    }
}

/// Deploying makes versions per account and workflow; deploying the same plan
/// again is the same version; runs keep their account.
#[tokio::test]
async fn deployments_are_versioned_per_account_and_runs_keep_their_account() {
    let dir = TempDir::new("store-deploy");
    let store: Arc<dyn Store> = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let first = plan(TWO_STEPS);
    let second = plan(GATED);
    store.put_plan(&first).await.unwrap();
    store.put_plan(&second).await.unwrap();
    let v1 = store.deploy("acme", "w", &first.hash).await.unwrap();
    assert_eq!(v1.version, 1);
    let again = store.deploy("acme", "w", &first.hash).await.unwrap();
    assert_eq!(again, v1, "the same plan is the same version");
    let v2 = store.deploy("acme", "w", &second.hash).await.unwrap();
    assert_eq!(
        (v2.version, v2.plan_hash.as_str()),
        (2, second.hash.as_str())
    );
    let other = store.deploy("globex", "w", &second.hash).await.unwrap();
    assert_eq!(other.version, 1, "versions count per account");
    let acme: Vec<u32> = store
        .deployments("acme")
        .await
        .unwrap()
        .iter()
        .map(|d| d.version)
        .collect();
    assert_eq!(acme, [1, 2]);

    store
        .create_run("run-a", "acme", "w", &second.hash, &json!({}), None)
        .await
        .unwrap();
    assert_eq!(store.run("run-a").await.unwrap().unwrap().account, "acme");
}

/// A decision by `approver`, who belongs to no approver group.
fn decision(approver: &str, approved: bool) -> Decision {
    Decision {
        approver: approver.to_string(),
        groups: Vec::new(),
        approved,
        comment: None,
        decided_at: "2026-11-29T12:00:00Z".to_string(),
    }
}

/// An approval may name an approver group: a member (the caller says which
/// groups the approver is in) may decide; anyone else may not.
#[tokio::test]
async fn a_member_of_a_named_group_may_decide() {
    let dir = TempDir::new("store-groups");
    let store: Arc<dyn Store> = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let gated = plan(&GATED.replace("boss@example.com", "billing-leads"));
    store.put_plan(&gated).await.unwrap();
    store
        .create_run("run-1", "", "w", &gated.hash, &json!({}), None)
        .await
        .unwrap();
    let parked = flow_runtime::runner::drive(
        &store,
        &gated,
        "w",
        "run-1",
        json!({}),
        Arc::new(OfflineProvider),
        None,
    )
    .await
    .unwrap();
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    let outsider = store
        .decide("run-1", "ok", &decision("ana@x.io", true))
        .await
        .unwrap();
    assert!(
        outsider.is_err_and(|e| e.to_string().contains("may not decide")),
        "not in the group"
    );
    let member = Decision {
        groups: vec!["billing-leads".to_string()],
        ..decision("ana@x.io", true)
    };
    store.decide("run-1", "ok", &member).await.unwrap().unwrap();
    let record = store
        .step_records("run-1")
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.path == "ok")
        .unwrap();
    assert_eq!(record.output.unwrap()["approver"], "ana@x.io");
}
