//! The conformance suite of the durable stores: SQLite and PostgreSQL held
//! to the same rules by the same tests, for each part of `Store` (grouped
//! below by part): durability modes, exactly-once decisions, KB versions and
//! idempotency keys per account, notifications and the outbox, deployments,
//! idempotent starts, expired gates, migrations on reopen, and the runner on
//! top of them. Each test body runs once per store (`sqlite::NAME`,
//! `postgres::NAME`); what only one store has (leases) is tested at the end.
//!
//! The PostgreSQL tests need the server at 127.0.0.1:5432 (or
//! `FLOW_TEST_POSTGRES_URL`); each uses a schema of its own, dropped after.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flow_plan::Durability;
use flow_runtime::approval::Decision;
use flow_runtime::journal::{Attempt, Outcome, StepRecord, StepStatus};
use flow_runtime::offline::OfflineProvider;
use flow_runtime::postgres::{PostgresOptions, PostgresStore};
use flow_runtime::services::{Handoff, KbWrite, Services};
use flow_runtime::sqlite::SqliteStore;
use flow_runtime::store::{
    Deletion, DueEvents, EventNext, EventsOf, KbQuery, MailNext, MailState, NewRun,
    NotificationKind, NotificationQuery, NotificationStore, PendingGates, PlanStore, RunChange,
    RunEnd, RunEvent, RunLog, RunStatus, RunStore, Store, StoreError,
};
use flow_tests::TempDir;
use flow_tests::postgres::TestSchema;
use serde_json::json;

/// Where a store under test keeps its data; it can be opened again there.
enum Backend {
    Sqlite(TempDir),
    Postgres(TestSchema),
}

impl Backend {
    fn sqlite() -> Backend {
        Backend::Sqlite(TempDir::new("store"))
    }

    fn postgres() -> Backend {
        Backend::Postgres(TestSchema::new())
    }

    /// Opens the store (again, the second time: migrations already applied).
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(dir) => SqliteStore::open(&dir.path().join("s.db")).expect("opens"),
            Backend::Postgres(schema) => PostgresStore::connect(&schema.url())
                .await
                .expect("connects"),
        }
    }
}

/// Each test body, as a test on each store.
macro_rules! on_each_store {
    ($($body:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Backend::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    flow_tests::require!(Postgres);
                    super::$body(super::Backend::postgres()).await;
                }
            )*
        }
    };
}

on_each_store!(
    // PlanStore
    deployments_are_versioned_per_account_and_runs_keep_their_account,
    // RunStore and its journals
    durability_approval_persists_at_the_end_only,
    a_retrying_record_is_kept_until_its_step_ends,
    an_idempotency_key_starts_one_run_per_account,
    a_created_run_keeps_the_provider_it_began_with,
    a_cancelled_run_records_nothing_more,
    a_cancelled_runs_step_writes_no_document_and_hands_nothing_off,
    an_invocation_cancelled_and_redriven_in_its_process_writes_nothing_more,
    a_run_given_up_is_orphaned_until_claimed,
    a_failed_run_is_redriven_from_the_step_that_failed_it,
    a_gate_decided_after_a_redrive_is_decided_in_its_round,
    a_panic_fails_its_run_which_a_redrive_takes_on,
    a_redrive_reruns_only_the_failed_iterations_of_a_loop,
    a_run_is_redriven_again_and_at_most_max_times,
    a_redrive_cut_short_goes_on_from_where_it_was,
    a_step_the_deadline_cut_short_runs_again_whatever_its_policy,
    stored_bytes_count_an_accounts_data_only,
    a_parked_run_moves_to_another_plan_once,
    deployments_runs_and_documents_can_be_deleted,
    the_runner_parks_resumes_and_lists_runs_to_recover,
    a_plan_that_does_not_load_holds_back_only_its_own_runs,
    a_run_started_by_its_first_write_is_stored_with_its_steps_and_end,
    // ApprovalStore
    a_decision_applies_once_across_tasks_and_survives_reopening,
    a_member_of_a_named_group_may_decide,
    expired_gates_are_listed_when_due,
    // NotificationStore, and a journal's handoffs
    the_outbox_mails_each_accounts_oldest_in_turn,
    // EventStore
    run_events_are_kept_with_each_status_change_and_handed_out_once,
    due_events_are_shared_between_accounts,
    an_accounts_events_go_out_in_the_order_they_came_due,
    an_accounts_mail_goes_out_in_the_order_it_came_due,
    run_events_of_an_account_without_endpoints_are_kept_only_to_deliver,
    a_destinations_delivery_writes_its_document_once_and_is_in_the_history,
    kb_documents_keys_and_notifications_belong_to_the_run_account,
    // KbStore, and a journal's KB writes and context
    kb_writes_version_documents_and_keys_make_retries_no_ops,
    concurrent_kb_writes_with_one_key_write_once,
    kb_context_ranks_by_the_terms_within_the_ids,
    kb_documents_are_listed_searched_and_read_per_account,
    a_nul_byte_in_a_documents_or_handoffs_text_is_kept_alike,
    a_department_owns_the_documents_its_workflows_write,
);

fn plan(source: &str) -> flow_plan::Plan {
    let checked = flow_compiler::check_source("s.flow", source);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    flow_compiler::lower(&checked).expect("lowers")
}

/// A run of workflow `w` on `plan_hash`, for `create_run`; which provider
/// answers it is not kept.
fn new_run(plan_hash: &str, input: &serde_json::Value) -> NewRun {
    NewRun {
        workflow: "w".to_string(),
        plan_hash: plan_hash.to_string(),
        input: input.clone(),
        provider: None,
    }
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

async fn run(journal: Arc<dyn RunLog>, plan: &flow_plan::Plan, run_id: &str) -> Outcome {
    let services = Services {
        provider: Arc::new(OfflineProvider::default()),
        effects: journal.clone(),
        mcp: None,
        journal,
        steps: None,
        in_flight: None,
    };
    flow_runtime::run(plan, "w", run_id, json!({}), services).await
}

/// A step between attempts is journaled as retrying (so that a crash does
/// not reset its attempts); its next record replaces that one, in the same
/// batch or a later one, and a reopened journal finds whichever is last.
async fn a_retrying_record_is_kept_until_its_step_ends(backend: Backend) {
    let store = backend.open().await;
    let journal = owned_journal(&store, "run-1").await;
    let reopen = || async {
        Arc::clone(&store)
            .open_journal("run-1", Durability::Full)
            .await
            .unwrap()
    };
    let record = |status: StepStatus, attempts: u32| StepRecord {
        path: "one".to_string(),
        step_id: "one".to_string(),
        kind: flow_plan::StepKind::Recipe,
        status,
        input: json!({ "q": "1" }),
        output: (status == StepStatus::Completed).then(|| json!({ "a": "x" }).into()),
        error: None,
        attempts: (0..attempts)
            .map(|index| Attempt {
                index,
                error: (index + 1 < attempts || status != StepStatus::Completed)
                    .then(|| "server: 500".to_string()),
                delay_ms: Some(10),
                round: 0,
                repair: false,
                started_ms: Some(1),
                ended_ms: Some(2),
                cut_short: false,
            })
            .collect(),
        started_ms: 1,
        ended_ms: 2,
        round: 0,
    };
    journal
        .record(record(StepStatus::Retrying, 1))
        .await
        .unwrap();
    let found = reopen().await.lookup("one").unwrap();
    assert_eq!(
        (found.status, found.attempts.len()),
        (StepStatus::Retrying, 1)
    );
    // Two records of one path in one batch, then a final one.
    let (second, third) = (
        journal.record(record(StepStatus::Retrying, 2)),
        journal.record(record(StepStatus::Retrying, 3)),
    );
    second.await.unwrap();
    third.await.unwrap();
    journal
        .record(record(StepStatus::Completed, 4))
        .await
        .unwrap();
    // A final record waits for the next attempt or the run's end.
    journal.flush().await.unwrap();
    let stored = store.step_records("run-1").await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (stored[0].status, stored[0].attempts.len()),
        (StepStatus::Completed, 4)
    );
    // A final record is never replaced.
    journal
        .record(record(StepStatus::Retrying, 5))
        .await
        .unwrap();
    let stored = store.step_records("run-1").await.unwrap();
    assert_eq!(stored[0].status, StepStatus::Completed);
}

async fn durability_approval_persists_at_the_end_only(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-1", Durability::Approval)
        .await
        .unwrap();
    let outcome = run(journal.clone(), &plan, "run-1").await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert!(
        store.step_records("run-1").await.unwrap().is_empty(),
        "nothing written before the flush"
    );
    journal.flush().await.unwrap();
    assert_eq!(store.step_records("run-1").await.unwrap().len(), 2);

    // Full durability writes as it goes: each record is stored before the
    // next step's attempt goes out, the last when the run ends.
    store
        .create_run("run-2", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-2", Durability::Full)
        .await
        .unwrap();
    let _ = run(journal.clone(), &plan, "run-2").await;
    let records = store.step_records("run-2").await.unwrap();
    assert_eq!(records.len(), 1, "the last record waits for the run's end");
    journal.flush().await.unwrap();
    let records = store.step_records("run-2").await.unwrap();
    let paths: Vec<&str> = records.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["one", "two"], "stored in the order recorded");
}

async fn a_decision_applies_once_across_tasks_and_survives_reopening(backend: Backend) {
    let store = backend.open().await;
    let plan = plan("workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }");
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    assert!(matches!(
        run(journal.clone(), &plan, "run-1").await,
        Outcome::Parked { .. }
    ));
    // The gate's record rides with the run's end; a journal dropped
    // without one sends it without waiting, and PostgreSQL's decisions do
    // not queue behind it (they did in SQLite's one writer): the race made
    // every decision find no gate, now and then.
    journal.flush().await.unwrap();

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

    let reopened = backend.open().await;
    let records = reopened.step_records("run-1").await.unwrap();
    assert_eq!(records.len(), 1);
    assert_ne!(records[0].status, StepStatus::Pending);
    assert_eq!(
        reopened.plan(&plan.hash).await.unwrap(),
        plan,
        "the run's plan is kept"
    );
}

fn kb_write(content: &str, key: Option<&str>) -> KbWrite {
    KbWrite {
        collection: "notes".into(),
        title: "T".into(),
        content: content.into(),
        metadata: Some(json!({ "source": "test" })),
        key: key.map(str::to_string),
        department: None,
    }
}

/// The journal of a new run of no account that this store's process owns:
/// a PostgreSQL journal writes only for a run its process holds.
async fn owned_journal(store: &Arc<dyn Store>, run_id: &str) -> Arc<dyn RunLog> {
    account_journal(store, run_id, "").await
}

/// `owned_journal` for a run of `account`.
async fn account_journal(store: &Arc<dyn Store>, run_id: &str, account: &str) -> Arc<dyn RunLog> {
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run(run_id, account, &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    Arc::clone(store)
        .open_journal(run_id, Durability::Full)
        .await
        .unwrap()
}

async fn kb_writes_version_documents_and_keys_make_retries_no_ops(backend: Backend) {
    let store = backend.open().await;
    let journal = owned_journal(&store, "run-1").await;
    let first = journal.kb_write(&kb_write("a", Some("k1"))).await.unwrap();
    assert_eq!(first, json!({ "id": "notes/T", "version": 1 }));
    let again = journal.kb_write(&kb_write("b", Some("k1"))).await.unwrap();
    assert_eq!(again, first, "the same key is the same write");
    let second = journal.kb_write(&kb_write("c", None)).await.unwrap();
    assert_eq!(second["version"], 2);
}

/// A recipe's context: the documents its ids name (a collection, or one
/// document as `collection/title`), those matching the prompt's terms first,
/// the rest after, within the limit.
async fn kb_context_ranks_by_the_terms_within_the_ids(backend: Backend) {
    let store = backend.open().await;
    let journal = owned_journal(&store, "run-1").await;
    for (collection, title, content) in [
        (
            "fixes",
            "printer",
            "Printers jam when the tray is overfilled.",
        ),
        ("fixes", "router", "Error E42: reset the router firmware."),
        (
            "fixes",
            "billing",
            "Wrong currency: change the billing country.",
        ),
        ("other", "router", "A router elsewhere, firmware too."),
    ] {
        journal
            .kb_write(&KbWrite {
                collection: collection.into(),
                title: title.into(),
                content: content.into(),
                metadata: None,
                key: None,
                department: None,
            })
            .await
            .unwrap();
    }
    let terms = flow_runtime::kb::search_terms("How to fix E42 on the router firmware?");
    let ids = ["fixes".to_string()];
    let found = journal.kb_context(&ids, None, &terms, 2).await.unwrap();
    let titles: Vec<&str> = found.iter().map(|d| d.title.as_str()).collect();
    assert_eq!(titles[0], "router", "{found:?}");
    assert_eq!(found.len(), 2, "filled up to the limit: {found:?}");
    assert!(found.iter().all(|d| d.collection == "fixes"), "{found:?}");
    let one = journal
        .kb_context(&["other/router".to_string()], None, &[], 5)
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].collection.as_str(), one[0].version), ("other", 1));
    assert!(
        journal
            .kb_context(&["nothing".to_string()], None, &terms, 5)
            .await
            .unwrap()
            .is_empty()
    );
}

/// What `flow kb` and `flow notifications` read: an account's documents
/// listed by collection and title, searched by words, read one by one, and
/// its notifications to every audience; never another account's.
async fn kb_documents_are_listed_searched_and_read_per_account(backend: Backend) {
    let store = backend.open().await;
    let acme = account_journal(&store, "run-a", "acme").await;
    let globex = account_journal(&store, "run-b", "globex").await;
    for (collection, title, content) in [
        ("fixes", "router", "Error E42: reset the router firmware."),
        (
            "fixes",
            "printer",
            "Printers jam when the tray is overfilled.",
        ),
        ("notes", "router", "The router in room 4 is new."),
    ] {
        let write = KbWrite {
            collection: collection.into(),
            title: title.into(),
            content: content.into(),
            metadata: None,
            key: None,
            department: None,
        };
        acme.kb_write(&write).await.unwrap();
        acme.kb_write(&write).await.unwrap();
    }
    globex
        .kb_write(&KbWrite {
            collection: "fixes".into(),
            title: "secret".into(),
            content: "globex router".into(),
            metadata: None,
            key: None,
            department: None,
        })
        .await
        .unwrap();
    let names = |found: &[flow_runtime::services::KbDocument]| -> Vec<String> {
        found
            .iter()
            .map(|d| format!("{}/{}@{}", d.collection, d.title, d.version))
            .collect()
    };
    let all = KbQuery {
        limit: 10,
        ..KbQuery::default()
    };
    let listed = store.kb_documents("acme", &all).await.unwrap();
    assert_eq!(
        names(&listed),
        ["fixes/printer@2", "fixes/router@2", "notes/router@2"]
    );
    let fixes = KbQuery {
        collection: Some("fixes".into()),
        limit: 1,
        ..KbQuery::default()
    };
    assert_eq!(
        names(&store.kb_documents("acme", &fixes).await.unwrap()),
        ["fixes/printer@2"]
    );
    let search = KbQuery {
        terms: flow_runtime::kb::search_terms("router firmware"),
        limit: 10,
        ..KbQuery::default()
    };
    let found = store.kb_documents("acme", &search).await.unwrap();
    assert_eq!(
        names(&found),
        ["fixes/router@2", "notes/router@2"],
        "the better match first, and nothing of globex's"
    );
    let one = store
        .kb_document("acme", "notes", "router")
        .await
        .unwrap()
        .expect("the document");
    assert_eq!(one.content, "The router in room 4 is new.");
    assert_eq!(
        store.kb_document("acme", "fixes", "secret").await.unwrap(),
        None
    );

    for (department, journal, run) in [
        ("support", &acme, "run-a"),
        ("sales", &acme, "run-a"),
        ("support", &globex, "run-b"),
    ] {
        journal
            .handoff(&Handoff {
                run_id: run.into(),
                department: department.into(),
                message: format!("to {department}"),
                subject: None,
                key: None,
            })
            .await
            .unwrap();
    }
    let inbox = store.account_notifications("acme", 10).await.unwrap();
    let messages: Vec<&str> = inbox.iter().map(|n| n.message.as_str()).collect();
    assert_eq!(messages, ["to sales", "to support"], "newest first");
    assert_eq!(
        store.account_notifications("acme", 1).await.unwrap().len(),
        1
    );
}

/// A step retried in several places at once (a process presumed dead and
/// its successor) writes with one key: one document version, one result.
async fn concurrent_kb_writes_with_one_key_write_once(backend: Backend) {
    let store = backend.open().await;
    let journal = owned_journal(&store, "run-1").await;
    let writes: Vec<_> = (0..10)
        .map(|i| {
            let journal = Arc::clone(&journal);
            tokio::spawn(async move {
                journal
                    .kb_write(&kb_write(&format!("attempt {i}"), Some("once")))
                    .await
            })
        })
        .collect();
    for write in writes {
        assert_eq!(
            write.await.unwrap().expect("each write answers"),
            json!({ "id": "notes/T", "version": 1 })
        );
    }
    let unkeyed = journal.kb_write(&kb_write("after", None)).await.unwrap();
    assert_eq!(unkeyed["version"], 2, "the keyed writes made one version");
}

/// Regression (issue 13): a NUL byte in a run's text made PostgreSQL fail
/// the step (its text columns cannot hold one) while SQLite stored it. Both
/// now store U+FFFD in its place, in KB documents and handoffs alike.
async fn a_nul_byte_in_a_documents_or_handoffs_text_is_kept_alike(backend: Backend) {
    let store = backend.open().await;
    let journal = account_journal(&store, "run-n", "acme").await;
    journal.kb_write(&kb_write("a\0b", None)).await.unwrap();
    let found = journal
        .kb_context(&["notes".to_string()], None, &[], 5)
        .await
        .unwrap();
    assert_eq!(found[0].content, "a\u{fffd}b");
    journal
        .handoff(&Handoff {
            run_id: "run-n".into(),
            department: "support".into(),
            message: "x\0y".into(),
            subject: Some("s\0".into()),
            key: None,
        })
        .await
        .unwrap();
    let listed = store
        .notifications("acme", &["support".to_string()], "ana@x.io", &ALL)
        .await
        .unwrap();
    assert_eq!(listed[0].message, "x\u{fffd}y");
}

/// Regression: KB documents, write keys and notifications had no account, so
/// one account's workflow could overwrite another's document, get its keyed
/// result back, or read its handoffs.
async fn kb_documents_keys_and_notifications_belong_to_the_run_account(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    let mut journals = Vec::new();
    for (run, account) in [("run-a", "acme"), ("run-b", "globex")] {
        store
            .create_run(run, account, &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
        journals.push(
            Arc::clone(&store)
                .open_journal(run, Durability::Full)
                .await
                .unwrap(),
        );
    }
    let acme = journals[0]
        .kb_write(&kb_write("acme's", Some("k1")))
        .await
        .unwrap();
    let globex = journals[1]
        .kb_write(&kb_write("globex's", Some("k1")))
        .await
        .unwrap();
    assert_eq!(acme["version"], 1);
    assert_eq!(
        globex["version"], 1,
        "globex's write neither returns acme's keyed result nor versions acme's document"
    );

    for (journal, run) in journals.iter().zip(["run-a", "run-b"]) {
        for _ in 0..2 {
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
    }
    let audiences = ["support".to_string()];
    let listed = store
        .notifications("acme", &audiences, "ana@x.io", &ALL)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "a key stores one notification: {listed:?}");
    assert_eq!(listed[0].message, "from run-a");
    assert_eq!(listed[0].kind, NotificationKind::Handoff);
    assert!(!listed[0].read);
    let elsewhere = ["billing".to_string()];
    assert!(
        store
            .notifications("acme", &elsewhere, "ana@x.io", &ALL)
            .await
            .unwrap()
            .is_empty(),
        "another audience's"
    );

    // Marking is per reader and per account: globex cannot mark acme's.
    assert_eq!(
        store
            .mark_read("globex", "ana@x.io", &[listed[0].id])
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .mark_read("acme", "ana@x.io", &[listed[0].id])
            .await
            .unwrap(),
        1
    );
    let read = |reader: &'static str, query: NotificationQuery| {
        let (store, audiences) = (Arc::clone(&store), audiences.clone());
        async move {
            store
                .notifications("acme", &audiences, reader, &query)
                .await
                .unwrap()
        }
    };
    assert!(read("ana@x.io", ALL).await[0].read);
    assert!(!read("bo@x.io", ALL).await[0].read);
    let unread = NotificationQuery {
        unread_only: true,
        ..ALL
    };
    assert!(read("ana@x.io", unread).await.is_empty());

    // Both handoffs wait in the outbox until mailed.
    let outbox = store.to_mail(u64::MAX, 10).await.unwrap();
    assert_eq!(outbox.len(), 2);
    assert!(
        outbox[0].notification.id < outbox[1].notification.id,
        "oldest first"
    );
    store
        .mailed(
            outbox[0].notification.id,
            &[],
            MailNext::Done(MailState::Sent),
        )
        .await
        .unwrap();

    // A retry: the recipients reached are kept, and the notification waits
    // until its time.
    let left = outbox[1].notification.id;
    store
        .mailed(left, &["sam@x.io".to_string()], MailNext::Retry(5_000))
        .await
        .unwrap();
    assert!(
        store.to_mail(4_999, 10).await.unwrap().is_empty(),
        "not yet"
    );
    let again = store.to_mail(5_000, 10).await.unwrap();
    assert_eq!(
        (again[0].attempts, again[0].sent_to.clone()),
        (1, vec!["sam@x.io".to_string()])
    );
    store
        .mailed(left, &[], MailNext::Done(MailState::Failed))
        .await
        .unwrap();
    assert!(store.to_mail(u64::MAX, 10).await.unwrap().is_empty());
}

const GATED: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  step one = r { q: "1" }
  step ok = approval { approvers: ["boss@example.com"], message: "go?" }
  step two = r { q: step.one.a }
  output { a: step.two.a }
}"#;

/// Regression guard for one commit per step (issue 18): a run that `flow
/// run` starts is not written before its first step's record, and its end
/// rides with its last record. Whatever shares a commit, the store ends up
/// with the run's row (its account and input), every record, the gate's
/// notification and the run's end.
async fn a_run_started_by_its_first_write_is_stored_with_its_steps_and_end(backend: Backend) {
    use flow_runtime::runner::{Invocation, drive};
    let store = backend.open().await;
    let plan = plan(GATED);
    store.put_plan(&plan).await.unwrap();
    let start = Invocation::Start {
        account: "acme".to_string(),
        run: NewRun {
            workflow: "w".to_string(),
            plan_hash: plan.hash.clone(),
            input: json!({}),
            provider: None,
        },
    };
    let parked = drive(
        &store,
        &plan,
        "w",
        "run-1",
        start,
        json!({}),
        Arc::new(OfflineProvider::default()),
        None,
        None,
        None,
        None,
    )
    .await
    .unwrap();
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    let row = store
        .run("run-1")
        .await
        .unwrap()
        .expect("the run is stored");
    assert_eq!(
        (row.account.as_str(), row.status, &row.input),
        ("acme", RunStatus::PendingApproval, &json!({}))
    );
    let records = store.step_records("run-1").await.unwrap();
    let stored: Vec<(&str, StepStatus)> = records
        .iter()
        .map(|record| (record.path.as_str(), record.status))
        .collect();
    assert_eq!(
        stored,
        [("one", StepStatus::Completed), ("ok", StepStatus::Pending)]
    );
    let notified = store.account_notifications("acme", 10).await.unwrap();
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert!(
        store.orphaned_runs().await.unwrap().is_empty(),
        "the end gave the run up"
    );
}

/// The runner drives a run through the `Store` trait alone: it parks with the
/// run stored as `pending_approval`, a decision lets the next invocation
/// complete it, and recovery lists only what is due.
async fn the_runner_parks_resumes_and_lists_runs_to_recover(backend: Backend) {
    use flow_runtime::runner::{drive, runs_to_recover};
    let store = backend.open().await;
    let plan = plan(GATED);
    store.put_plan(&plan).await.unwrap();
    for run in ["run-1", "run-2"] {
        store
            .create_run(run, "", &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let observer: flow_runtime::runner::Observer = {
        let calls = Arc::clone(&calls);
        Arc::new(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    let parked = drive(
        &store,
        &plan,
        "w",
        "run-1",
        flow_runtime::runner::Invocation::Created {
            account: String::new(),
            asked_at: std::time::Instant::now(),
        },
        json!({}),
        Arc::new(OfflineProvider::default()),
        None,
        Some(observer),
        None,
        None,
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
    assert_eq!(
        store.pending_approvals().await.unwrap(),
        [PendingGates {
            account: String::new(),
            workflow: "w".to_string(),
            gates: 1
        }]
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
    // The decider's in the decision's commit: running, so that recovery
    // takes it if the decider dies before its claim; no orphan while the
    // decider lives.
    let decided = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(decided.status, RunStatus::Running);
    assert!(store.orphaned_runs().await.unwrap().is_empty());
    assert!(
        store
            .claim_run("run-1", &[RunStatus::PendingApproval, RunStatus::Running])
            .await
            .unwrap()
    );
    let done = drive(
        &store,
        &plan,
        "w",
        "run-1",
        flow_runtime::runner::Invocation::Resume,
        json!({}),
        Arc::new(OfflineProvider::default()),
        None,
        None,
        None,
        None,
    )
    .await
    .unwrap();
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.outcome.unwrap()["output"], done_output(&done));
    assert!(store.pending_approvals().await.unwrap().is_empty());
    assert_eq!(store.runs().await.unwrap().len(), 2);
}

/// Regression: recovery claimed each run before reading its plan, and a
/// plan that did not load (damaged, or refused by flowd's validation)
/// stopped the whole recovery, and with it flowd's start, for every
/// account. Now each plan is loaded once, before its runs are claimed; a
/// plan that does not load leaves its runs as they were, the rest recover,
/// and putting the plan again mends the stored copy.
async fn a_plan_that_does_not_load_holds_back_only_its_own_runs(backend: Backend) {
    use flow_runtime::runner::claim_runs_to_recover;
    let store = backend.open().await;
    let good = plan(TWO_STEPS);
    store.put_plan(&good).await.unwrap();
    let intact = plan(GATED);
    // Text that no longer matches its hash: `from_json` refuses it.
    let mut damaged = intact.clone();
    // (Not its `source`, the file's path, which the hash leaves out.)
    damaged.workflows[0].timeout_ms += 1;
    store.put_plan(&damaged).await.unwrap();
    for (run, hash) in [
        ("run-good-1", &good.hash),
        ("run-damaged", &intact.hash),
        ("run-good-2", &good.hash),
    ] {
        store
            .create_run(run, "", &new_run(hash, &json!({})), None)
            .await
            .unwrap();
    }
    // Another account's run (a flowd's, whose store `flow recover` is
    // pointed at) is left to flowd.
    store
        .create_run("run-acme", "acme", &new_run(&good.hash, &json!({})), None)
        .await
        .unwrap();
    // The loader the CLI gives: the store's plan, as read.
    async fn recover(
        store: &Arc<dyn Store>,
        loads: &mut Vec<String>,
    ) -> Result<flow_runtime::runner::Recovery, StoreError> {
        claim_runs_to_recover(
            store.as_ref(),
            |account| account.is_empty(),
            |hash| {
                loads.push(hash.clone());
                let store = Arc::clone(store);
                async move { store.plan(&hash).await.map(Arc::new) }
            },
        )
        .await
    }

    let mut loads = Vec::new();
    let recovery = recover(&store, &mut loads).await.unwrap();
    let mut claimed: Vec<&str> = recovery
        .claimed
        .iter()
        .map(|(row, _)| row.id.as_str())
        .collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ["run-good-1", "run-good-2"]);
    assert_eq!(recovery.unloadable.len(), 1, "{:?}", recovery.unloadable);
    let (row, error) = &recovery.unloadable[0];
    assert_eq!(row.id, "run-damaged");
    assert!(matches!(error, StoreError::Damaged(_)), "{error:?}");
    loads.sort_unstable();
    let mut hashes = vec![good.hash.clone(), intact.hash.clone()];
    hashes.sort_unstable();
    assert_eq!(loads, hashes, "each plan is loaded once");
    assert_eq!(
        store.run("run-damaged").await.unwrap().unwrap().status,
        RunStatus::Running,
        "left as it was, for a later recovery"
    );

    // A deploy puts the plan again: the stored copy is mended, and the run
    // recovers.
    store.put_plan(&intact).await.unwrap();
    assert_eq!(store.plan(&intact.hash).await.unwrap(), intact);
    let recovery = recover(&store, &mut Vec::new()).await.unwrap();
    assert!(recovery.unloadable.is_empty(), "{:?}", recovery.unloadable);
    assert!(
        recovery
            .claimed
            .iter()
            .any(|(row, plan)| row.id == "run-damaged" && **plan == intact)
    );
}

fn done_output(outcome: &Outcome) -> serde_json::Value {
    match outcome {
        Outcome::Completed { output } => output.clone(),
        other => panic!("not completed: {other:?}"),
    }
}

/// Deploying makes versions per account and workflow; deploying the same plan
/// again is the same version; runs keep their account.
async fn deployments_are_versioned_per_account_and_runs_keep_their_account(backend: Backend) {
    let store = backend.open().await;
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
    // What a start reads: the latest version, or the one named, of the
    // account's own deployments only.
    let started = |account: &'static str, workflow: &'static str, version: Option<u32>| {
        let store = Arc::clone(&store);
        async move {
            store
                .deployment(account, workflow, version)
                .await
                .unwrap()
                .map(|d| (d.version, d.plan_hash))
        }
    };
    assert_eq!(
        started("acme", "w", None).await,
        Some((2, second.hash.clone()))
    );
    assert_eq!(
        started("acme", "w", Some(1)).await,
        Some((1, first.hash.clone()))
    );
    assert_eq!(started("acme", "w", Some(3)).await, None);
    assert_eq!(started("acme", "v", None).await, None);
    assert_eq!(
        started("globex", "w", None).await,
        Some((1, second.hash.clone()))
    );
    assert_eq!(started("initech", "w", None).await, None);

    store
        .create_run("run-a", "acme", &new_run(&second.hash, &json!({})), None)
        .await
        .unwrap();
    assert_eq!(store.run("run-a").await.unwrap().unwrap().account, "acme");
    // Another account's run is no run at all to it.
    let own = store.account_run("acme", "run-a").await.unwrap();
    assert_eq!(own.map(|row| row.id).as_deref(), Some("run-a"));
    assert_eq!(store.account_run("globex", "run-a").await.unwrap(), None);
    assert_eq!(store.account_run("acme", "run-zz").await.unwrap(), None);
    let query = flow_runtime::store::RunQuery {
        workflow: Some("w".into()),
        status: Some(RunStatus::Running),
        limit: 10,
        before: None,
    };
    let listed = store.account_runs("acme", &query).await.unwrap();
    assert_eq!(listed.len(), 1);
    // Pages: newest first, the next page after the last run of the one before.
    store
        .create_run("run-b", "acme", &new_run(&second.hash, &json!({})), None)
        .await
        .unwrap();
    let page = |before: Option<(i64, String)>| {
        let store = Arc::clone(&store);
        async move {
            let query = flow_runtime::store::RunQuery {
                workflow: None,
                status: None,
                limit: 1,
                before,
            };
            store.account_runs("acme", &query).await.unwrap()
        }
    };
    let first_page = page(None).await;
    let second_page = page(Some((first_page[0].created_ms, first_page[0].id.clone()))).await;
    let mut ids = vec![first_page[0].id.clone(), second_page[0].id.clone()];
    ids.sort();
    assert_eq!(ids, ["run-a", "run-b"], "each run on one page");
    let last = &second_page[0];
    assert!(
        page(Some((last.created_ms, last.id.clone())))
            .await
            .is_empty()
    );
    assert!(
        store
            .account_runs("globex", &query)
            .await
            .unwrap()
            .is_empty()
    );
    store.undeploy("acme", "w", Some(2)).await.unwrap();
    assert_eq!(
        started("acme", "w", None).await,
        Some((1, first.hash.clone())),
        "an undeployed version is no longer started"
    );
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
async fn a_member_of_a_named_group_may_decide(backend: Backend) {
    let store = backend.open().await;
    let gated = plan(&GATED.replace("boss@example.com", "billing-leads"));
    store.put_plan(&gated).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&gated.hash, &json!({})), None)
        .await
        .unwrap();
    let parked = flow_runtime::runner::drive(
        &store,
        &gated,
        "w",
        "run-1",
        flow_runtime::runner::Invocation::Resume,
        json!({}),
        Arc::new(OfflineProvider::default()),
        None,
        None,
        None,
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

/// One key starts one run in an account, however often it is sent; another
/// account's same key is its own.
async fn an_idempotency_key_starts_one_run_per_account(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    let input = json!({ "n": 1 });
    let start = |id: &'static str, account: &'static str| {
        let (store, plan_hash, input) = (Arc::clone(&store), plan.hash.clone(), input.clone());
        async move {
            store
                .create_run(id, account, &new_run(&plan_hash, &input), Some("key-1"))
                .await
                .unwrap()
        }
    };
    assert!(start("run-1", "acme").await);
    assert!(!start("run-2", "acme").await, "the key is taken");
    assert!(start("run-3", "globex").await, "keys are per account");
    let first = store.run_by_key("acme", "key-1").await.unwrap().unwrap();
    assert_eq!((first.id.as_str(), &first.input), ("run-1", &input));
    assert!(store.run("run-2").await.unwrap().is_none());
    assert!(store.run_by_key("acme", "key-2").await.unwrap().is_none());
    // Runs without a key never collide.
    for id in ["run-4", "run-5"] {
        assert!(
            store
                .create_run(id, "acme", &new_run(&plan.hash, &input), None)
                .await
                .unwrap()
        );
    }
}

/// A run `create_run` stores (flowd's, over HTTP) keeps in its history the
/// provider that answers it, and a process with none refuses to go on with
/// it (regression: a flowd restarted without its `[provider]` finished
/// such runs with the offline provider's made-up answers).
async fn a_created_run_keeps_the_provider_it_began_with(backend: Backend) {
    use flow_runtime::runner::missing_provider;
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    let mut run = new_run(&plan.hash, &json!({ "n": 1 }));
    run.provider = Some("anthropic".to_string());
    assert!(store.create_run("run-1", "acme", &run, None).await.unwrap());
    let history = store.run_history("run-1").await.unwrap();
    assert!(
        matches!(&history[..], [RunChange::Began { provider, .. }] if provider == "anthropic"),
        "{history:?}"
    );
    let missing = |id: &'static str, here: &'static str| {
        let store = Arc::clone(&store);
        async move { missing_provider(store.as_ref(), id, here).await.unwrap() }
    };
    assert_eq!(
        missing("run-1", "offline").await.as_deref(),
        Some("anthropic")
    );
    assert_eq!(
        missing("run-1", "openai").await,
        None,
        "another real provider may go on"
    );
    // A run begun offline, or before the provider was kept, goes on anywhere.
    run.provider = Some("offline".to_string());
    store.create_run("run-2", "acme", &run, None).await.unwrap();
    store
        .create_run("run-3", "acme", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    assert_eq!(missing("run-2", "offline").await, None);
    assert_eq!(missing("run-3", "offline").await, None);
}

/// A parked run is listed as having an expired gate once its approval's
/// expiry has passed, and not before; a decided gate is never listed.
async fn expired_gates_are_listed_when_due(backend: Backend) {
    let store = backend.open().await;
    let gated = plan(&GATED.replace("message: \"go?\"", "message: \"go?\", expires: 1h"));
    store.put_plan(&gated).await.unwrap();
    for run in ["run-1", "run-2"] {
        store
            .create_run(run, "", &new_run(&gated.hash, &json!({})), None)
            .await
            .unwrap();
        let parked = flow_runtime::runner::drive(
            &store,
            &gated,
            "w",
            run,
            flow_runtime::runner::Invocation::Resume,
            json!({}),
            Arc::new(OfflineProvider::default()),
            None,
            None,
            None,
            None,
        )
        .await
        .unwrap();
        assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    }
    let gate = store
        .step_records("run-1")
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.path == "ok")
        .unwrap();
    let due_ms = gate.started_ms + 3_600_000;
    let listed = |now_ms: u64| {
        let store = Arc::clone(&store);
        async move {
            store
                .expired_gates(now_ms)
                .await
                .unwrap()
                .into_iter()
                .map(|row| row.id)
                .collect::<Vec<_>>()
        }
    };
    assert!(listed(due_ms - 1_000).await.is_empty(), "not yet due");
    store
        .decide("run-2", "ok", &decision("boss@example.com", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed(due_ms + 1_000).await, ["run-1"], "run-2 was decided");
}

/// Cancelling takes the run from its owner: the owner's later `finish_run`
/// and heartbeat change nothing, and it cannot be claimed to resume.
async fn a_cancelled_run_records_nothing_more(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    assert!(
        store.orphaned_runs().await.unwrap().is_empty(),
        "a run its live creator holds is nobody's to take"
    );
    let journal = Arc::clone(&store)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    assert!(store.cancel_run("run-1").await.unwrap());
    assert!(!store.cancel_run("run-1").await.unwrap(), "already ended");
    // Regression: SQLite's writer took a step's record into a run another
    // process had cancelled (the step in flight as `flow cancel` ran), and
    // the next attempt went out after it.
    let _ = journal.record(late_record()).await;
    assert!(
        journal.admit().await.is_err(),
        "no attempt starts once the run is cancelled"
    );
    assert!(
        store.step_records("run-1").await.unwrap().is_empty(),
        "the late record is not written"
    );
    assert!(
        !journal.heartbeat(Duration::from_secs(1)).await.unwrap(),
        "the heartbeat says the run is no longer the invocation's"
    );
    let finished = store
        .finish_run(
            "run-1",
            RunStatus::Completed,
            &json!({}),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert!(!finished);
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!((row.status, row.active_ms), (RunStatus::Cancelled, 0));
    assert!(
        !store
            .claim_run("run-1", &[RunStatus::Running, RunStatus::PendingApproval])
            .await
            .unwrap()
    );
}

/// A run cancelled and redriven in the process that drives it (flowd) is
/// the process's again, in a new invocation: what the earlier invocation
/// still writes (a record, a document, its end) is refused. Regression: on
/// SQLite writes were fenced by the run's owner alone, which the redrive
/// gave back to the same process.
async fn an_invocation_cancelled_and_redriven_in_its_process_writes_nothing_more(backend: Backend) {
    let store = backend.open().await;
    let earlier = account_journal(&store, "run-1", "acme").await;
    assert!(store.cancel_run("run-1").await.unwrap());
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let _ = earlier.record(late_record()).await;
    assert!(
        store.step_records("run-1").await.unwrap().is_empty(),
        "the earlier invocation's record is not written"
    );
    let written = earlier.kb_write(&kb_write("late", None)).await;
    assert!(written.is_err(), "{written:?}");
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Running, "the redriven run goes on");
    // Regression: the redrive overwrote the status, and nothing said the
    // run had been cancelled (`flow show` read it as one that had failed).
    let history = store.run_history("run-1").await.unwrap();
    assert!(
        matches!(
            history.as_slice(),
            [
                RunChange::Cancelled { .. },
                RunChange::Redriven { round: 1, .. }
            ]
        ),
        "{history:?}"
    );
}

/// A step's KB write and handoff are the run's writes as its records are:
/// once another process has cancelled the run, neither is written.
/// Regression: on SQLite only records were fenced by the run's owner, so a
/// `kb_write` or `handoff` step in flight as `flow cancel` ran still wrote
/// its document or its notification into the account.
async fn a_cancelled_runs_step_writes_no_document_and_hands_nothing_off(backend: Backend) {
    let store = backend.open().await;
    let mut journals = Vec::new();
    for run in ["run-kb", "run-handoff"] {
        journals.push(account_journal(&store, run, "acme").await);
        assert!(store.cancel_run(run).await.unwrap());
    }
    let written = journals[0].kb_write(&kb_write("late", None)).await;
    assert!(written.is_err(), "the document was written: {written:?}");
    let all = KbQuery {
        limit: 10,
        ..KbQuery::default()
    };
    assert!(store.kb_documents("acme", &all).await.unwrap().is_empty());
    let handed = journals[1]
        .handoff(&Handoff {
            run_id: "run-handoff".into(),
            department: "support".into(),
            message: "late".into(),
            subject: None,
            key: None,
        })
        .await;
    assert!(handed.is_err(), "the handoff was written");
    let audiences = ["support".to_string()];
    let listed = store
        .notifications("acme", &audiences, "ana@x.io", &ALL)
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// The outbox of run events: an event is kept with the change of status it
/// reports, for the accounts asked for only; handed to one deliverer at a
/// time; kept with the endpoints it reached until done; and deleted with
/// its run.
/// A destination's KB document is written outside any run's journal, once
/// per delivery id (its key), whoever owns the run; each attempt is added
/// to the run's history, after its redrives and moves.
async fn a_destinations_delivery_writes_its_document_once_and_is_in_the_history(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("d1", "acme", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let write = kb_write("summary", Some("dlv_d1_0_completed"));
    let first = store.write_document("acme", &write).await.unwrap();
    assert_eq!(first, json!({ "id": "notes/T", "version": 1 }));
    let again = store
        .write_document("acme", &kb_write("other", Some("dlv_d1_0_completed")))
        .await;
    assert_eq!(again.unwrap(), first, "one delivery id, one version");
    let document = store
        .kb_document("acme", "notes", "T")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(document.content, "summary");
    assert!(
        store
            .kb_document("globex", "notes", "T")
            .await
            .unwrap()
            .is_none()
    );
    let attempt = |result: &str, error: Option<&str>| RunChange::Delivery {
        at_ms: 1,
        id: "dlv_d1_0_completed".into(),
        destination: 0,
        to: "kb".into(),
        event: "completed".into(),
        result: result.into(),
        error: error.map(str::to_string),
    };
    let failed = attempt("failed", Some("the store did not answer"));
    store.note_delivery("d1", &failed).await.unwrap();
    store
        .note_delivery("d1", &attempt("delivered", None))
        .await
        .unwrap();
    assert_eq!(
        store.run_history("d1").await.unwrap(),
        vec![failed, attempt("delivered", None)]
    );
}

/// An account without webhook endpoints has events kept only for the runs
/// of plans with destinations: the others' would be claimed and deleted
/// unread, at a cost to every run (B9).
async fn run_events_of_an_account_without_endpoints_are_kept_only_to_deliver(backend: Backend) {
    let store = backend.open().await;
    let quiet = plan(TWO_STEPS);
    let delivering = plan(&TWO_STEPS.replace(
        "  durability approval",
        "  durability approval\n  deliver on completed to webhook \"crm\"",
    ));
    assert!(delivering.delivers() && !quiet.delivers());
    for plan in [&quiet, &delivering] {
        store.put_plan(plan).await.unwrap();
    }
    store
        .keep_events_of(&[
            ("acme".to_string(), EventsOf::Deliveries),
            ("globex".to_string(), EventsOf::EveryRun),
        ])
        .await
        .unwrap();
    let runs = [
        ("quiet", "acme", &quiet),
        ("delivering", "acme", &delivering),
        ("hooked", "globex", &quiet),
    ];
    let done = json!({ "status": "completed", "output": {} });
    for (id, account, plan) in runs {
        store
            .create_run(id, account, &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
        assert!(
            store
                .finish_run(id, RunStatus::Completed, &done, Duration::ZERO)
                .await
                .unwrap()
        );
    }
    let now = flow_runtime::time::now_ms() + 1_000;
    let mut kept: Vec<String> = store
        .due_events(&DueEvents::any(now, 10))
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.run_id)
        .collect();
    kept.sort();
    assert_eq!(kept, ["delivering", "hooked"]);
}

async fn run_events_are_kept_with_each_status_change_and_handed_out_once(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .keep_events_of(&[("acme".to_string(), EventsOf::EveryRun)])
        .await
        .unwrap();
    for (id, account) in [("a1", "acme"), ("a2", "acme"), ("g1", "globex")] {
        store
            .create_run(id, account, &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
    }
    let done = json!({ "status": "completed", "output": { "x": 1 } });
    for id in ["a1", "g1"] {
        assert!(
            store
                .finish_run(id, RunStatus::Completed, &done, Duration::ZERO)
                .await
                .unwrap()
        );
    }
    assert!(store.cancel_run("a2").await.unwrap());
    // Giving a run up while it is still running is no event.
    store
        .create_run("a3", "acme", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    store
        .finish_run("a3", RunStatus::Running, &json!(null), Duration::ZERO)
        .await
        .unwrap();

    let now = flow_runtime::time::now_ms() + 1_000;
    let due = store.due_events(&DueEvents::any(now, 10)).await.unwrap();
    let seen: Vec<(&str, &str, &str)> = due
        .iter()
        .map(|e| (e.run_id.as_str(), e.account.as_str(), e.event.as_str()))
        .collect();
    assert_eq!(
        seen,
        [("a1", "acme", "completed"), ("a2", "acme", "cancelled")],
        "globex keeps no events"
    );
    assert_eq!(due[0].outcome, Some(done));
    assert_eq!(due[0].workflow, "w");
    assert!(
        store
            .due_events(&DueEvents::any(now, 10))
            .await
            .unwrap()
            .is_empty(),
        "claimed: not handed out twice"
    );

    let (completed, cancelled) = (&due[0], &due[1]);
    store
        .event_attempted(completed.id, &["crm".to_string()], EventNext::Retry(now))
        .await
        .unwrap();
    store
        .event_attempted(cancelled.id, &[], EventNext::Done)
        .await
        .unwrap();
    let again = store.due_events(&DueEvents::any(now, 10)).await.unwrap();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(
        (again[0].id, again[0].attempts, again[0].reached.clone()),
        (completed.id, 1, vec!["crm".to_string()])
    );
    store
        .event_attempted(completed.id, &["erp".to_string()], EventNext::Retry(now))
        .await
        .unwrap();
    let third = store.due_events(&DueEvents::any(now, 10)).await.unwrap();
    assert_eq!(third[0].reached, ["crm", "erp"]);
    store
        .event_attempted(
            completed.id,
            &["erp".into(), "crm".into()],
            EventNext::Retry(now),
        )
        .await
        .unwrap();
    let fourth = store.due_events(&DueEvents::any(now, 10)).await.unwrap();
    assert_eq!(fourth[0].reached, ["crm", "erp"], "each endpoint once");

    // Deleting the run deletes its events.
    assert_eq!(
        store.delete_run("acme", "a1").await.unwrap(),
        Deletion::Deleted
    );
    store
        .event_attempted(completed.id, &[], EventNext::Retry(now))
        .await
        .unwrap();
    assert!(
        store
            .due_events(&DueEvents::any(now, 10))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Regression: the mailer took the outbox oldest first, whoever's: an
/// account that parked thousands of runs held every other account's
/// approvers waiting behind its emails, sent one after another. Now the
/// accounts take turns, each oldest first.
async fn the_outbox_mails_each_accounts_oldest_in_turn(backend: Backend) {
    let store = backend.open().await;
    for (account, message) in [
        ("acme", "a1"),
        ("acme", "a2"),
        ("acme", "a3"),
        ("globex", "g1"),
        ("acme", "a4"),
        ("globex", "g2"),
    ] {
        hand_off(&*store, account, message).await;
    }
    let order: Vec<String> = store
        .to_mail(u64::MAX, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|outgoing| outgoing.notification.message)
        .collect();
    assert_eq!(order, ["a1", "g1", "a2", "g2", "a3", "a4"]);
}

/// Regression: the deliverer took the oldest due events, whoever's: an
/// account whose endpoints hang and whose runs end by the thousand held
/// every attempt in flight (10 s each), and another account's events
/// waited behind its retries. Now each account has at most `per_account`
/// in flight, and the accounts with fewer in flight go first.
async fn due_events_are_shared_between_accounts(backend: Backend) {
    // Acme's five events are older than globex's two.
    let runs = [
        ("a1", "acme"),
        ("a2", "acme"),
        ("a3", "acme"),
        ("a4", "acme"),
        ("a5", "acme"),
        ("g1", "globex"),
        ("g2", "globex"),
    ];
    let store = store_with_completed_runs(&backend, &["acme", "globex"], &runs).await;
    let now = flow_runtime::time::now_ms() + 1_000;
    let runs = |events: Vec<RunEvent>| -> Vec<String> {
        events.into_iter().map(|event| event.run_id).collect()
    };
    // Acme has one in flight: two more of its fit under three; globex's go
    // first, being fewer in flight, and three are asked for.
    let held = [("acme".to_string(), 1)];
    let due = DueEvents {
        now_ms: now,
        limit: 3,
        per_account: 3,
        in_flight: &held,
    };
    assert_eq!(
        runs(store.due_events(&due).await.unwrap()),
        ["a1", "g1", "g2"]
    );
    // The deliverer took a1: acme has two in flight, room for one.
    let held = [("acme".to_string(), 2)];
    let due = DueEvents {
        limit: 10,
        in_flight: &held,
        ..due
    };
    assert_eq!(runs(store.due_events(&due).await.unwrap()), ["a2"]);
    // Acme now holds three: none of its events is handed out.
    let held = [("acme".to_string(), 3)];
    let due = DueEvents {
        in_flight: &held,
        ..due
    };
    assert!(store.due_events(&due).await.unwrap().is_empty());
    // With nothing in flight and no bound, the rest go, oldest first.
    assert_eq!(
        runs(store.due_events(&DueEvents::any(now, 10)).await.unwrap()),
        ["a3", "a4", "a5"]
    );
}

/// An account's events go out in the order they came due: one retried
/// (due again later) goes behind those that came due before it. Guards the
/// seek into each account's range of the outbox, in that order, which
/// replaced ranking every due event on each call: with a backlog of
/// 100,000 events that took 180 ms, in a transaction every commit waited
/// for (docs/benchmarks.md, "The outboxes with a backlog").
async fn an_accounts_events_go_out_in_the_order_they_came_due(backend: Backend) {
    let runs = [("r1", "acme"), ("r2", "acme"), ("r3", "acme")];
    let store = store_with_completed_runs(&backend, &["acme"], &runs).await;
    let now = flow_runtime::time::now_ms() + 1_000;
    let taken = store.due_events(&DueEvents::any(now, 10)).await.unwrap();
    assert_eq!(taken.len(), 3);
    // Each refused, and due again: r2 first, then r1, then r3.
    for (event, again) in taken.iter().zip([10, 5, 20]) {
        store
            .event_attempted(event.id, &[], EventNext::Retry(now + again))
            .await
            .unwrap();
    }
    let next = |at: u64| {
        let store = Arc::clone(&store);
        async move {
            store
                .due_events(&DueEvents::any(at, 1))
                .await
                .unwrap()
                .into_iter()
                .map(|event| event.run_id)
                .collect::<Vec<_>>()
        }
    };
    assert!(next(now + 1).await.is_empty());
    assert_eq!(next(now + 30).await, ["r2"]);
    assert_eq!(next(now + 30).await, ["r1"]);
    assert_eq!(next(now + 30).await, ["r3"]);
    assert!(next(now + 30).await.is_empty());
}

/// Regression: the mailer read each account's unmailed notifications by
/// id, so with a mail server down every poll walked all those waiting for
/// a retry to find the few due. They are now read in the order they came
/// due (a retry's time, or else the notification's creation), which ends
/// at the first not due yet.
async fn an_accounts_mail_goes_out_in_the_order_it_came_due(backend: Backend) {
    let store = backend.open().await;
    for message in ["m1", "m2", "m3"] {
        hand_off(&*store, "acme", message).await;
    }
    let now = flow_runtime::time::now_ms() + 1_000;
    let taken = store.to_mail(now, 10).await.unwrap();
    assert_eq!(taken.len(), 3);
    // Each refused, and due again: m2 first, then m3, then m1; and m4, not
    // tried yet, due since its creation, before them all.
    for (outgoing, again) in taken.iter().zip([20, 5, 10]) {
        store
            .mailed(outgoing.notification.id, &[], MailNext::Retry(now + again))
            .await
            .unwrap();
    }
    hand_off(&*store, "acme", "m4").await;
    let mut order = Vec::new();
    loop {
        let due = store.to_mail(now + 30, 1).await.unwrap();
        let Some(outgoing) = due.first() else { break };
        order.push(outgoing.notification.message.clone());
        store
            .mailed(
                outgoing.notification.id,
                &[],
                MailNext::Done(MailState::Sent),
            )
            .await
            .unwrap();
    }
    assert_eq!(order, ["m4", "m2", "m3", "m1"]);
}

/// Notes a handoff of `account` to its support department, as a run's
/// handoff step does, with `message` as its text and its key.
async fn hand_off(store: &dyn Store, account: &str, message: &str) {
    let notification = flow_runtime::store::NewNotification {
        account,
        kind: NotificationKind::Handoff,
        audience: "support",
        run_id: "run-1",
        step_path: None,
        subject: None,
        message,
        key: Some(message),
    };
    assert!(store.notify(&notification).await.unwrap(), "stored");
}

/// A store that keeps every run's events for the accounts `kept`, with
/// `runs` (id, account) completed in that order.
async fn store_with_completed_runs(
    backend: &Backend,
    kept: &[&str],
    runs: &[(&str, &str)],
) -> Arc<dyn Store> {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    let kept: Vec<_> = kept
        .iter()
        .map(|account| (account.to_string(), EventsOf::EveryRun))
        .collect();
    store.keep_events_of(&kept).await.unwrap();
    let done = json!({ "status": "completed", "output": {} });
    for (id, account) in runs {
        store
            .create_run(id, account, &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
        store
            .finish_run(id, RunStatus::Completed, &done, Duration::ZERO)
            .await
            .unwrap();
    }
    store
}

/// A run its owner gave up while still `running` (its driving failed) is
/// orphaned: any process may claim it and resume it.
async fn a_run_given_up_is_orphaned_until_claimed(backend: Backend) {
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    assert!(
        store
            .finish_run("run-1", RunStatus::Running, &json!(null), Duration::ZERO)
            .await
            .unwrap()
    );
    let orphaned: Vec<String> = store
        .orphaned_runs()
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(orphaned, ["run-1"]);
    assert!(
        store
            .claim_run("run-1", &[RunStatus::Running])
            .await
            .unwrap()
    );
    assert!(store.orphaned_runs().await.unwrap().is_empty());
}

/// Two PostgreSQL store instances are two owners, as two flowd processes on
/// two machines would be.
async fn two_owners(schema: &TestSchema, lease: Duration) -> [Arc<PostgresStore>; 2] {
    let options = PostgresOptions {
        lease,
        ..PostgresOptions::default()
    };
    let first = PostgresStore::connect_with(&schema.url(), options.clone())
        .await
        .expect("connects");
    let second = PostgresStore::connect_with(&schema.url(), options)
        .await
        .expect("connects");
    assert_ne!(first.owner(), second.owner());
    [first, second]
}

/// A run's owner holds it while its lease is live, and renews the lease
/// with each heartbeat; once the lease runs out another process takes
/// the run over, and the old owner can no longer record anything of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_keep_a_run_with_its_live_owner_until_they_run_out() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let lease = Duration::from_millis(800);
    let [first, second] = two_owners(&schema, lease).await;
    let plan = plan(TWO_STEPS);
    first.put_plan(&plan).await.unwrap();
    first
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let running = [RunStatus::Running];
    assert!(
        !second.claim_run("run-1", &running).await.unwrap(),
        "the creator's lease is live"
    );
    assert!(
        first.claim_run("run-1", &running).await.unwrap(),
        "its owner may take it again"
    );
    let journal = Arc::clone(&first)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    // Renewed twice within the lease, the run stays with its owner past
    // the first lease's end.
    for _ in 0..2 {
        tokio::time::sleep(lease / 2).await;
        assert!(journal.heartbeat(Duration::from_millis(400)).await.unwrap());
        assert!(!second.claim_run("run-1", &running).await.unwrap());
    }
    // Without a heartbeat the lease runs out: the run is orphaned for
    // others to take, and for its owner, which leaves those it drives
    // (regression, a chaos audit: a run its owner gave up while the store
    // was cut off, still its own, was found by nobody while it lived).
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    assert_eq!(first.orphaned_runs().await.unwrap().len(), 1);
    assert_eq!(second.orphaned_runs().await.unwrap().len(), 1);
    assert!(
        second.claim_run("run-1", &running).await.unwrap(),
        "an expired lease is taken over"
    );
    assert!(!journal.heartbeat(Duration::from_secs(5)).await.unwrap());
    assert!(
        !first
            .finish_run("run-1", RunStatus::Completed, &json!({}), Duration::ZERO)
            .await
            .unwrap(),
        "the old owner records nothing"
    );
    assert!(
        !first.claim_run("run-1", &running).await.unwrap(),
        "the new owner's lease is live"
    );
    assert!(
        second
            .finish_run("run-1", RunStatus::Completed, &json!({}), Duration::ZERO)
            .await
            .unwrap()
    );
    let row = second.run("run-1").await.unwrap().unwrap();
    assert_eq!((row.status, row.active_ms), (RunStatus::Completed, 800));
}

/// Regression: on SQLite an attempt with nothing to write before it never
/// asked the store, so a step that waited to retry while another process
/// cancelled its run sent its next attempt all the same. A confirmation
/// that the run is this process's (a renewal, or a write the writer fenced)
/// holds 2.7 s (nine tenths of three heartbeats); after it, an attempt asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_attempt_asks_once_its_confirmation_has_run_out() {
    let backend = Backend::sqlite();
    let store = backend.open().await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    journal.admit().await.expect("its own run");
    // Another connection (as another process's `flow cancel` is).
    let other = backend.open().await;
    assert!(other.cancel_run("run-1").await.unwrap());
    tokio::time::sleep(Duration::from_millis(2_800)).await;
    let refused = journal
        .admit()
        .await
        .expect_err("the attempt asks, and is refused");
    assert!(
        refused.message.contains("no longer this process's"),
        "{refused:?}"
    );
}

/// Step `one` completed, as a journal whose run is no longer its own
/// would record it.
fn late_record() -> flow_runtime::journal::StepRecord {
    flow_runtime::journal::StepRecord {
        path: "one".into(),
        step_id: "one".into(),
        kind: flow_plan::StepKind::Recipe,
        status: StepStatus::Completed,
        input: json!({}),
        output: Some(json!({ "a": "late" }).into()),
        error: None,
        attempts: Vec::new(),
        started_ms: 0,
        ended_ms: 0,
        round: 0,
    }
}

/// A stopping flowd gives up the runs it still holds: another process may
/// take them at once, rather than once their leases run out. What a
/// journal dropped with its run's task sent before (a step completed
/// just then) is written; what the old owner sends after is refused, as
/// after a takeover. Runs of other owners, and runs that ended, are left
/// as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_runs_given_up_are_taken_at_once_and_fence_their_old_owner() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let [first, second] = two_owners(&schema, Duration::from_secs(60)).await;
    let plan = plan(TWO_STEPS);
    first.put_plan(&plan).await.unwrap();
    for (store, id) in [
        (&first, "run-1"),
        (&first, "run-2"),
        (&first, "run-4"),
        (&second, "run-3"),
    ] {
        store
            .create_run(id, "", &new_run(&plan.hash, &json!({})), None)
            .await
            .unwrap();
    }
    first
        .finish_run("run-2", RunStatus::Completed, &json!({}), Duration::ZERO)
        .await
        .unwrap();
    let journal = |id: &'static str| {
        let first = Arc::clone(&first);
        async move { first.open_journal(id, Durability::Full).await.unwrap() }
    };
    // Run 1's step completed as its task was stopped: the record is only
    // remembered, and sent, unawaited, as the journal drops.
    let stopped = journal("run-1").await;
    stopped.record(late_record()).await.unwrap();
    drop(stopped);
    let old = journal("run-4").await;
    let running = [RunStatus::Running];
    assert!(!second.claim_run("run-1", &running).await.unwrap());
    assert!(second.orphaned_runs().await.unwrap().is_empty());

    first.release_runs().await.unwrap();
    let orphaned: Vec<String> = second
        .orphaned_runs()
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(
        orphaned,
        ["run-1", "run-4"],
        "long before the 60 s lease ran out"
    );
    assert!(!old.heartbeat(Duration::from_millis(100)).await.unwrap());
    assert!(old.record(late_record()).await.is_err(), "no record");
    for id in ["run-1", "run-4"] {
        assert!(second.claim_run(id, &running).await.unwrap());
    }
    let taken = |id: &'static str| {
        let second = Arc::clone(&second);
        async move { second.open_journal(id, Durability::Full).await.unwrap() }
    };
    assert!(
        taken("run-1").await.lookup("one").is_some(),
        "sent before the release"
    );
    assert!(
        taken("run-4").await.lookup("one").is_none(),
        "sent after it"
    );
    assert_eq!(
        second.run("run-2").await.unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert!(
        !first.claim_run("run-3", &running).await.unwrap(),
        "another owner's run stays with it"
    );
}

/// Heartbeats are batched on PostgreSQL (`postgres/lease.rs` has the test
/// of one batch): heartbeats sent at once each count, and one sent as the
/// run ends finds it ended rather than undoing the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_heartbeats_sent_at_once_each_count() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let [store, _] = two_owners(&schema, Duration::from_secs(10)).await;
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    let mut beats = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let journal = Arc::clone(&journal);
        beats.spawn(async move { journal.heartbeat(Duration::from_millis(100)).await });
    }
    while let Some(renewed) = beats.join_next().await {
        assert!(renewed.unwrap().unwrap(), "the run is still this owner's");
    }
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(row.active_ms, 800, "every heartbeat's time is added");
    assert!(
        journal
            .finish(RunEnd {
                status: RunStatus::Completed,
                outcome: json!({}),
                active: Duration::from_millis(50),
            })
            .await
            .unwrap()
    );
    assert!(
        !journal.heartbeat(Duration::from_millis(100)).await.unwrap(),
        "an ended run is no longer the invocation's to renew"
    );
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!((row.status, row.active_ms), (RunStatus::Completed, 850));
}

/// Regression (issue 13): a flowd stopped (SIGSTOP) past its lease went on,
/// once continued, with the runs another process had taken over: it called
/// the model for their next steps again and wrote their handoffs twice.
/// A journal acts only in the epoch it opened in: once another owner claims
/// the run, the old journal's steps are refused before they start, and its
/// records, KB writes and handoffs are refused in the transaction that
/// would write them; the new owner's journal sees none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_journal_whose_run_was_taken_over_does_nothing_more() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let lease = Duration::from_millis(600);
    let [first, second] = two_owners(&schema, lease).await;
    let plan = plan(TWO_STEPS);
    first.put_plan(&plan).await.unwrap();
    first
        .create_run("run-1", "acme", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    let old = Arc::clone(&first)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    old.admit().await.expect("its own run, within the lease");
    assert!(old.heartbeat(Duration::from_millis(100)).await.unwrap());

    // The old owner is paused past its lease; the other takes the run over.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let running = [RunStatus::Running];
    assert!(second.claim_run("run-1", &running).await.unwrap());

    let refused = old.admit().await.expect_err("a step may not start");
    assert!(
        refused.message.contains("no longer this process's"),
        "{refused:?}"
    );
    assert!(!old.heartbeat(Duration::from_secs(1)).await.unwrap());
    assert!(old.record(late_record()).await.is_err(), "no record");
    assert!(
        old.kb_write(&kb_write("late", None)).await.is_err(),
        "no document"
    );
    let handoff = Handoff {
        run_id: "run-1".into(),
        department: "support".into(),
        message: "late".into(),
        subject: None,
        key: None,
    };
    assert!(old.handoff(&handoff).await.is_err(), "no handoff");

    // The new owner's journal holds none of it, and works.
    let new = Arc::clone(&second)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    assert!(new.lookup("one").is_none());
    new.admit().await.expect("the new owner's steps start");
    assert!(new.heartbeat(Duration::from_millis(100)).await.unwrap());
    new.handoff(&handoff)
        .await
        .expect("the new owner's handoff");
    let handoffs = second
        .notifications("acme", &["support".to_string()], "ana@x.io", &ALL)
        .await
        .unwrap()
        .into_iter()
        .filter(|n| n.kind == NotificationKind::Handoff)
        .count();
    assert_eq!(handoffs, 1);
    let row = second.run("run-1").await.unwrap().unwrap();
    assert_eq!(
        row.active_ms, 200,
        "the old heartbeat after the takeover added nothing"
    );
}

/// Regression (the chaos test, seed 1796625127954100555: a run's first step
/// sent to the model 622 ms after another flowd completed it): a process
/// stopped between the create or claim that gave it a run and the opening
/// of the run's journal counted a whole lease from the opening, so once
/// continued it sent a step that another process had taken over and run
/// meanwhile. A fresh journal's hold counts from when `create_run` was
/// asked, and an opened one's from what is left of the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_journal_opened_late_holds_only_what_is_left_of_the_lease() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let lease = Duration::from_millis(1000);
    let [first, second] = two_owners(&schema, lease).await;
    let plan = plan(TWO_STEPS);
    first.put_plan(&plan).await.unwrap();
    let asked_at = std::time::Instant::now();
    first
        .create_run("run-1", "acme", &new_run(&plan.hash, &json!({})), None)
        .await
        .unwrap();
    // Stopped between the create and the journals.
    tokio::time::sleep(lease * 8 / 10).await;
    let fresh = Arc::clone(&first).fresh_journal("run-1", "acme", None, asked_at, Durability::Full);
    let opened = Arc::clone(&first)
        .open_journal("run-1", Durability::Full)
        .await
        .unwrap();
    tokio::time::sleep(lease / 2).await;
    let running = [RunStatus::Running];
    assert!(
        second.claim_run("run-1", &running).await.unwrap(),
        "taken over"
    );
    for (journal, what) in [(fresh, "fresh"), (opened, "opened")] {
        let hold = journal.hold().expect("a PostgreSQL journal has a hold");
        assert!(
            !hold.live(),
            "the {what} journal's hold outlived the lease it came from"
        );
    }
}

/// Two mailers sharing the database never get the same outbox entry while
/// the first holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_entries_go_to_one_mailer_at_a_time() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let [first, second] = two_owners(&schema, Duration::from_secs(10)).await;
    for key in ["a", "b", "c"] {
        hand_off(&*first, "acme", key).await;
    }
    let taken: Vec<String> = first
        .to_mail(u64::MAX, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|outgoing| outgoing.notification.message)
        .collect();
    assert_eq!(taken, ["a", "b"]);
    let rest = second.to_mail(u64::MAX, 10).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].notification.message, "c");
    assert!(second.to_mail(u64::MAX, 10).await.unwrap().is_empty());
    // An attempt recorded lets the entry go: due again at its retry time,
    // to whichever mailer asks first.
    let retried = rest[0].notification.id;
    second
        .mailed(retried, &["sam@x.io".to_string()], MailNext::Retry(0))
        .await
        .unwrap();
    let again = first.to_mail(u64::MAX, 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (
            again[0].notification.id,
            again[0].attempts,
            again[0].sent_to.clone()
        ),
        (retried, 1, vec!["sam@x.io".to_string()])
    );
}

/// Processes starting together on a new schema migrate it once: the
/// advisory lock makes them take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_starts_migrate_once() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let url = schema.url();
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(&url).await.map(|_| ()) })
        })
        .collect();
    for start in starts {
        start.await.unwrap().expect("each start succeeds");
    }
    let store = PostgresStore::connect(&url).await.unwrap();
    assert!(store.runs().await.unwrap().is_empty());
}

/// Documents belong to the department of the workflow that wrote them last;
/// a department's documents are found without naming their collections, and
/// another department's are not.
async fn a_department_owns_the_documents_its_workflows_write(backend: Backend) {
    let store = backend.open().await;
    let journal = owned_journal(&store, "run-1").await;
    let write = |collection: &str, title: &str, content: &str, department: Option<&str>| KbWrite {
        collection: collection.into(),
        title: title.into(),
        content: content.into(),
        metadata: None,
        key: None,
        department: department.map(str::to_string),
    };
    for document in [
        write(
            "resolutions",
            "t-1",
            "Invoices are sent monthly.",
            Some("support"),
        ),
        write(
            "resolutions",
            "t-2",
            "A refund goes to the card used.",
            Some("support"),
        ),
        write("deals", "acme", "Acme renews in March.", Some("sales")),
        write("misc", "loose", "Nobody owns this refund note.", None),
    ] {
        journal.kb_write(&document).await.unwrap();
    }
    let titles = |found: Vec<flow_runtime::services::KbDocument>| -> Vec<String> {
        found
            .into_iter()
            .map(|d| format!("{}/{}", d.collection, d.title))
            .collect()
    };
    let terms = flow_runtime::kb::search_terms("refund please");
    let support = journal
        .kb_context(&[], Some("support"), &terms, 5)
        .await
        .unwrap();
    assert_eq!(
        titles(support),
        ["resolutions/t-2", "resolutions/t-1"],
        "the one with the word first (t-2), then the rest"
    );
    let sales = journal
        .kb_context(&[], Some("sales"), &[], 5)
        .await
        .unwrap();
    assert_eq!(titles(sales), ["deals/acme"]);
    let both = journal
        .kb_context(&["misc".to_string()], Some("sales"), &[], 5)
        .await
        .unwrap();
    assert_eq!(
        titles(both),
        ["deals/acme", "misc/loose"],
        "ids and department together"
    );

    // An update from a workflow without a department keeps the owner; one
    // from another department takes the document over.
    journal
        .kb_write(&write("deals", "acme", "Acme renews in April.", None))
        .await
        .unwrap();
    let sales = journal
        .kb_context(&[], Some("sales"), &[], 5)
        .await
        .unwrap();
    assert_eq!(sales[0].content, "Acme renews in April.");
    journal
        .kb_write(&write(
            "deals",
            "acme",
            "Acme moved to support.",
            Some("support"),
        ))
        .await
        .unwrap();
    assert!(
        journal
            .kb_context(&[], Some("sales"), &[], 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        titles(
            journal
                .kb_context(&[], Some("support"), &[], 5)
                .await
                .unwrap()
        ),
        ["deals/acme", "resolutions/t-1", "resolutions/t-2"]
    );
}

/// Deployments are retired without their version numbers coming back, ended
/// runs are deleted with their journals (live ones are not), plans nothing
/// uses go with them, and KB documents can be deleted; all per account.
async fn deployments_runs_and_documents_can_be_deleted(backend: Backend) {
    let store = backend.open().await;
    let first = plan(TWO_STEPS);
    let second = plan(GATED);
    store.put_plan(&first).await.unwrap();
    store.put_plan(&second).await.unwrap();
    store.deploy("acme", "w", &first.hash).await.unwrap();
    store.deploy("acme", "w", &second.hash).await.unwrap();
    assert_eq!(store.undeploy("globex", "w", None).await.unwrap(), 0);
    assert_eq!(store.undeploy("acme", "w", Some(1)).await.unwrap(), 1);
    let versions = |list: Vec<flow_runtime::store::Deployment>| -> Vec<u32> {
        list.iter().map(|d| d.version).collect()
    };
    assert_eq!(versions(store.deployments("acme").await.unwrap()), [2]);
    assert!(
        store.plan(&first.hash).await.is_err(),
        "no one uses the plan"
    );
    store.put_plan(&first).await.unwrap();
    let again = store.deploy("acme", "w", &first.hash).await.unwrap();
    assert_eq!(again.version, 3, "a version number is never given twice");

    // A run: not deleted while it runs, nor by another account.
    store
        .create_run("run-d", "acme", &new_run(&first.hash, &json!({})), None)
        .await
        .unwrap();
    let journal = Arc::clone(&store)
        .open_journal("run-d", Durability::Full)
        .await
        .unwrap();
    let outcome = run(journal, &first, "run-d").await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(
        store.delete_run("acme", "run-d").await.unwrap(),
        Deletion::NotEnded(RunStatus::Running)
    );
    assert!(
        store
            .finish_run("run-d", RunStatus::Completed, &json!({}), Duration::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(
        store.delete_run("globex", "run-d").await.unwrap(),
        Deletion::Unknown
    );
    assert!(!store.step_records("run-d").await.unwrap().is_empty());
    assert_eq!(
        store.delete_run("acme", "run-d").await.unwrap(),
        Deletion::Deleted
    );
    assert_eq!(store.run("run-d").await.unwrap(), None);
    assert!(store.step_records("run-d").await.unwrap().is_empty());
    assert!(store.plan(&first.hash).await.is_ok(), "still deployed");

    // Retention: ended runs before a time go, with the plans they alone
    // kept; a parked run stays, and so does a run cancelled just now.
    for id in ["run-e", "run-f", "run-g"] {
        store
            .create_run(id, "acme", &new_run(&second.hash, &json!({})), None)
            .await
            .unwrap();
    }
    let journal = Arc::clone(&store)
        .open_journal("run-g", Durability::Full)
        .await
        .unwrap();
    assert!(matches!(
        run(journal, &second, "run-g").await,
        Outcome::Parked { .. }
    ));
    store
        .finish_run(
            "run-g",
            RunStatus::PendingApproval,
            &json!({}),
            Duration::ZERO,
        )
        .await
        .unwrap();
    store
        .finish_run("run-e", RunStatus::Failed, &json!({}), Duration::ZERO)
        .await
        .unwrap();
    assert!(store.cancel_run("run-f").await.unwrap());
    let later = flow_runtime::time::now_ms() as i64 + 1_000;
    assert_eq!(store.delete_ended_runs(later, 100).await.unwrap(), 1);
    assert_eq!(store.run("run-e").await.unwrap(), None);
    assert!(
        store.run("run-f").await.unwrap().is_some(),
        "cancelled just now"
    );
    assert!(store.run("run-g").await.unwrap().is_some(), "parked");

    // Documents, written by a run its process holds again.
    assert!(
        store
            .claim_run("run-g", &[RunStatus::PendingApproval])
            .await
            .unwrap()
    );
    let journal = Arc::clone(&store)
        .open_journal("run-g", Durability::Full)
        .await
        .unwrap();
    let write = KbWrite {
        collection: "notes".into(),
        title: "T".into(),
        content: "kept words".into(),
        metadata: None,
        key: None,
        department: None,
    };
    journal.kb_write(&write).await.unwrap();
    assert!(!store.delete_document("globex", "notes", "T").await.unwrap());
    assert!(store.delete_document("acme", "notes", "T").await.unwrap());
    assert!(!store.delete_document("acme", "notes", "T").await.unwrap());
    let found = journal
        .kb_context(&["notes".to_string()], None, &["kept".to_string()], 5)
        .await
        .unwrap();
    assert!(found.is_empty(), "{found:?}");
}

/// A model with an outage: a call whose prompt is `down` fails (a 5xx), one
/// whose prompt is `hung` never answers, one whose prompt is `broken`
/// panics (a bug); every call is noted by prompt.
#[derive(Default)]
struct Outage {
    down: std::sync::Mutex<std::collections::BTreeSet<String>>,
    hung: std::sync::Mutex<std::collections::BTreeSet<String>>,
    broken: std::sync::Mutex<std::collections::BTreeSet<String>>,
    calls: std::sync::Mutex<Vec<String>>,
}

impl Outage {
    fn down(prompts: &[&str]) -> Arc<Outage> {
        let outage = Outage::default();
        outage
            .down
            .lock()
            .unwrap()
            .extend(prompts.iter().map(|p| p.to_string()));
        Arc::new(outage)
    }

    fn over(&self) {
        self.down.lock().unwrap().clear();
        self.hung.lock().unwrap().clear();
        self.broken.lock().unwrap().clear();
    }

    fn calls_of(&self, prompt: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == prompt)
            .count()
    }
}

impl flow_runtime::services::Provider for Outage {
    fn complete<'a>(
        &'a self,
        call: &'a flow_runtime::services::RecipeCall<'a>,
    ) -> flow_runtime::services::BoxFuture<
        'a,
        Result<serde_json::Value, flow_runtime::error::StepError>,
    > {
        self.calls.lock().unwrap().push(call.prompt.clone());
        let down = self.down.lock().unwrap().contains(&call.prompt);
        let hung = self.hung.lock().unwrap().contains(&call.prompt);
        let broken = self.broken.lock().unwrap().contains(&call.prompt);
        Box::pin(async move {
            assert!(!broken, "a bug met by the call of {}", call.prompt);
            if hung {
                std::future::pending::<()>().await;
            }
            if down {
                return Err(flow_runtime::error::StepError::new(
                    flow_runtime::error::ErrorKind::Server,
                    "503 the provider is down",
                ));
            }
            Ok(json!({ "a": "fine" }))
        })
    }
}

const EIGHT_STEPS: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  step s1 = r { q: "s1" }
  step s2 = r { q: "s2" }
  step s3 = r { q: "s3" }
  step s4 = r { q: "s4" }
  step s5 = r { q: "s5" }
  step s6 = r { q: "s6" }
  step s7 = r { q: "s7" } retry 2 backoff 10ms..10ms
  step s8 = r { q: "s8" }
  output { last: step.s8.a }
}"#;

/// Creates run `run-1` of workflow `w` of `source` with `input`.
async fn created(
    store: &Arc<dyn Store>,
    source: &str,
    input: serde_json::Value,
) -> flow_plan::Plan {
    let plan = plan(source);
    store.put_plan(&plan).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&plan.hash, &input), None)
        .await
        .unwrap();
    plan
}

async fn drive_with(
    store: &Arc<dyn Store>,
    plan: &flow_plan::Plan,
    input: serde_json::Value,
    model: &Arc<Outage>,
) -> Outcome {
    flow_runtime::runner::drive(
        store,
        plan,
        "w",
        "run-1",
        flow_runtime::runner::Invocation::Resume,
        input,
        model.clone(),
        None,
        None,
        None,
        None,
    )
    .await
    .unwrap()
}

async fn record_of(store: &Arc<dyn Store>, path: &str) -> StepRecord {
    store
        .step_records("run-1")
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("a record of {path}"))
}

/// Issue 15: a run failed by a provider outage at step 7 of 8 is redriven:
/// steps 1 to 6 are kept, only 7 and 8 go to the model, and the trace keeps
/// the failed attempt beside the one that succeeded.
async fn a_failed_run_is_redriven_from_the_step_that_failed_it(backend: Backend) {
    let store = backend.open().await;
    let plan = created(&store, EIGHT_STEPS, json!({})).await;
    let model = Outage::down(&["s7"]);
    let failed = drive_with(&store, &plan, json!({}), &model).await;
    assert!(
        matches!(&failed, Outcome::Failed { step: Some(step), .. } if step == "s7"),
        "{failed:?}"
    );
    assert_eq!(
        store.redrive_run("never-started", None).await.unwrap(),
        None,
        "no such run"
    );

    model.over();
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.redrives, row.active_ms),
        (RunStatus::Running, 1, 0)
    );
    let history = store.run_history("run-1").await.unwrap();
    assert!(
        matches!(history.as_slice(), [RunChange::Redriven { round: 1, .. }]),
        "{history:?}"
    );
    let done = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    for step in ["s1", "s2", "s3", "s4", "s5", "s6", "s8"] {
        assert_eq!(model.calls_of(step), 1, "{step}");
    }
    assert_eq!(
        model.calls_of("s7"),
        3,
        "s7: two attempts, then the redrive"
    );
    let s7 = record_of(&store, "s7").await;
    assert_eq!(s7.status, StepStatus::Completed);
    assert_eq!(s7.round, 1);
    let rounds: Vec<(u32, u32, bool)> = s7
        .attempts
        .iter()
        .map(|a| (a.index, a.round, a.error.is_some()))
        .collect();
    assert_eq!(
        rounds,
        [(0, 0, true), (1, 0, true), (2, 1, false)],
        "{s7:?}"
    );
    assert_eq!(
        store.redrive_run("run-1", None).await.unwrap(),
        None,
        "a completed run is not redriven"
    );
}

/// Regression: a run cancelled while parked and redriven parks at the same
/// gate record; a rejection there was recorded in the round the gate first
/// parked in, taken for a failure the redrive runs again, so the gate
/// parked again at once, found itself decided, and the run went round for
/// ever (`flow approve --reject` never returned; flowd spun). A decision
/// is the round's it is made in: this rejection fails the run.
async fn a_gate_decided_after_a_redrive_is_decided_in_its_round(backend: Backend) {
    let store = backend.open().await;
    let plan = created(&store, GATED, json!({})).await;
    let model = Arc::new(Outage::default());
    let parked = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    assert!(store.cancel_run("run-1").await.unwrap());
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let parked = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    store
        .decide("run-1", "ok", &decision("boss@example.com", false))
        .await
        .unwrap()
        .unwrap();
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        drive_with(&store, &plan, json!({}), &model),
    )
    .await
    .expect("the run ends");
    assert!(
        matches!(&ended, Outcome::Failed { step: Some(step), .. } if step == "ok"),
        "{ended:?}"
    );
    let gate = record_of(&store, "ok").await;
    assert_eq!((gate.status, gate.round), (StepStatus::Failed, 1));
    assert_eq!(
        model.calls.lock().unwrap().len(),
        1,
        "only `one` was called"
    );
}

/// Regression: a panic in a run's task (a provider's, met through a key
/// with a line break) ended the task, and flowd's run stayed `running`,
/// driven by nobody, until a restart met the panic again; `flow run`
/// crashed. The run now fails with what it met, its finished steps kept,
/// and a redrive goes on from there.
async fn a_panic_fails_its_run_which_a_redrive_takes_on(backend: Backend) {
    let store = backend.open().await;
    let plan = created(&store, EIGHT_STEPS, json!({})).await;
    let model = Arc::new(Outage::default());
    model.broken.lock().unwrap().insert("s3".to_string());
    let failed = drive_with(&store, &plan, json!({}), &model).await;
    let Outcome::Failed {
        error, step: None, ..
    } = &failed
    else {
        panic!("{failed:?}")
    };
    assert_eq!(error.kind, flow_runtime::error::ErrorKind::Internal);
    assert!(
        error
            .message
            .starts_with("flow failed on this run (a bug met by the call of s3)"),
        "{}",
        error.message
    );
    let row = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);

    model.over();
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let done = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    for (step, calls) in [("s1", 1), ("s2", 1), ("s3", 2), ("s8", 1)] {
        assert_eq!(model.calls_of(step), calls, "{step}");
    }
}

/// Issue 15: of a loop's 10 iterations 2 failed; a redrive runs those 2.
async fn a_redrive_reruns_only_the_failed_iterations_of_a_loop(backend: Backend) {
    let store = backend.open().await;
    let source = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  input { items: list<string> }
  for workflow_input.items as each concurrency 10 {
    step one = r { q: "item {{loop_item}}" } retry 1
  }
}"#;
    let input = json!({ "items": (0..10).map(|i| i.to_string()).collect::<Vec<_>>() });
    let plan = created(&store, source, input.clone()).await;
    let model = Outage::down(&["item 3", "item 7"]);
    let failed = drive_with(&store, &plan, input.clone(), &model).await;
    assert!(matches!(failed, Outcome::Failed { .. }), "{failed:?}");
    model.over();
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let done = drive_with(&store, &plan, input, &model).await;
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    for i in 0..10 {
        let expected = if i == 3 || i == 7 { 2 } else { 1 };
        assert_eq!(model.calls_of(&format!("item {i}")), expected, "item {i}");
    }
}

/// A redrive that fails again can be redriven again, each with the step's
/// retry budget anew, up to `MAX_REDRIVES`.
async fn a_run_is_redriven_again_and_at_most_max_times(backend: Backend) {
    let store = backend.open().await;
    let plan = created(&store, EIGHT_STEPS, json!({})).await;
    let model = Outage::down(&["s7"]);
    drive_with(&store, &plan, json!({}), &model).await;
    for round in 1..=flow_runtime::store::MAX_REDRIVES {
        assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(round));
        let failed = drive_with(&store, &plan, json!({}), &model).await;
        assert!(matches!(failed, Outcome::Failed { .. }), "{failed:?}");
        assert_eq!(
            model.calls_of("s7"),
            2 * (1 + round as usize),
            "the step's two attempts in each round"
        );
    }
    assert_eq!(
        store.redrive_run("run-1", None).await.unwrap(),
        None,
        "no more"
    );
    assert_eq!(
        model.calls_of("s6"),
        1,
        "s6 completed once, before the outage"
    );
    let s7 = record_of(&store, "s7").await;
    assert_eq!(
        s7.attempts.len(),
        2 * (1 + flow_runtime::store::MAX_REDRIVES as usize)
    );
}

/// A process that dies during a redrive: the run is `running` in its
/// redrive, and whoever drives it next goes on in that round, asking no
/// completed step again.
async fn a_redrive_cut_short_goes_on_from_where_it_was(backend: Backend) {
    let store = backend.open().await;
    let plan = created(&store, EIGHT_STEPS, json!({})).await;
    let model = Outage::down(&["s7"]);
    drive_with(&store, &plan, json!({}), &model).await;
    model.over();
    model.hung.lock().unwrap().insert("s8".to_string());
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let cut = tokio::time::timeout(
        Duration::from_millis(500),
        drive_with(&store, &plan, json!({}), &model),
    )
    .await;
    assert!(cut.is_err(), "the redrive was cut short at s8");
    model.over();
    let done = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    assert_eq!(model.calls_of("s7"), 3, "s7 completed in the redrive, once");
    assert_eq!(model.calls_of("s8"), 2, "s8 was in flight when it was cut");
    assert_eq!(model.calls_of("s1"), 1);
}

/// Regression: a step with `on_error continue` (or a fallback) that the
/// workflow's timeout cut short was, in a redrive, taken as a failure its
/// policy had handled: the run went on past it, the step never asked again
/// (and a fallback ran instead). Its policy never saw that failure.
async fn a_step_the_deadline_cut_short_runs_again_whatever_its_policy(backend: Backend) {
    let store = backend.open().await;
    let source = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow w {
  timeout 1s
  step first = r { q: "first" }
  step slow = r { q: "slow" } retry 1 timeout 50s on_error continue
  step fell = r { q: "fell" } retry 1 timeout 50s on_error fallback {
    step spare = r { q: "spare" }
  }
  step after = r { q: "after" }
  output { a: step.after.a, slow: step.slow?.a ?? "none", fell: step.fell?.a ?? "none" }
}"#;
    let plan = created(&store, source, json!({})).await;
    let model = Outage::default();
    model.hung.lock().unwrap().insert("slow".to_string());
    let model = Arc::new(model);
    let failed = drive_with(&store, &plan, json!({}), &model).await;
    assert!(
        matches!(&failed, Outcome::Failed { error, .. } if error.kind == flow_runtime::error::ErrorKind::Timeout),
        "{failed:?}"
    );
    let cut = record_of(&store, "slow").await;
    let last = cut.attempts.last().expect("the attempt out");
    assert!(last.cut_short && last.started_ms.is_some(), "{cut:?}");

    model.over();
    model.hung.lock().unwrap().insert("fell".to_string());
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(1));
    let failed = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(failed, Outcome::Failed { .. }), "{failed:?}");
    assert_eq!(model.calls_of("slow"), 2, "asked again in the redrive");
    assert_eq!(model.calls_of("spare"), 0, "no fallback for a cut step");

    model.over();
    assert_eq!(store.redrive_run("run-1", None).await.unwrap(), Some(2));
    let done = drive_with(&store, &plan, json!({}), &model).await;
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    assert_eq!(
        model.calls_of("fell"),
        2,
        "asked again in the second redrive"
    );
    assert_eq!(model.calls_of("spare"), 0);
    assert_eq!(model.calls_of("first"), 1);
    assert_eq!(model.calls_of("after"), 1);
}

/// A parked run moves to another plan once, and the move is in its history;
/// a run not parked on the plan named does not move.
async fn a_parked_run_moves_to_another_plan_once(backend: Backend) {
    let store = backend.open().await;
    let old = plan(GATED);
    let new = plan(&GATED.replace("workflow w {", "workflow w {\n  timeout 2h"));
    assert_ne!(old.hash, new.hash);
    store.put_plan(&old).await.unwrap();
    store.put_plan(&new).await.unwrap();
    store
        .create_run("run-1", "", &new_run(&old.hash, &json!({})), None)
        .await
        .unwrap();
    assert!(
        !store.move_run("run-1", &old.hash, &new.hash).await.unwrap(),
        "a running run does not move"
    );
    let parked = flow_runtime::runner::drive(
        &store,
        &old,
        "w",
        "run-1",
        flow_runtime::runner::Invocation::Resume,
        json!({}),
        Arc::new(OfflineProvider::default()),
        None,
        None,
        None,
        None,
    )
    .await
    .unwrap();
    assert!(matches!(parked, Outcome::Parked { .. }), "{parked:?}");
    assert!(store.move_run("run-1", &old.hash, &new.hash).await.unwrap());
    assert!(
        !store.move_run("run-1", &old.hash, &new.hash).await.unwrap(),
        "moved once"
    );
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().plan_hash,
        new.hash
    );
    let history = store.run_history("run-1").await.unwrap();
    assert!(
        matches!(history.as_slice(), [RunChange::Moved { from_plan, to_plan, .. }]
            if *from_plan == old.hash && *to_plan == new.hash),
        "{history:?}"
    );
}

/// An account's stored bytes count its plans, runs and journals, not
/// another account's.
async fn stored_bytes_count_an_accounts_data_only(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.stored_bytes("acme").await.unwrap(), 0);
    let plan = plan(TWO_STEPS);
    store.put_plan(&plan).await.unwrap();
    store.deploy("acme", "w", &plan.hash).await.unwrap();
    let deployed = store.stored_bytes("acme").await.unwrap();
    let compact = serde_json::to_string(&plan).unwrap().len() as u64;
    assert!(deployed >= compact, "{deployed} for a plan of {compact}");
    let input = json!({ "note": "x".repeat(10_000) });
    store
        .create_run("run-1", "acme", &new_run(&plan.hash, &input), None)
        .await
        .unwrap();
    let with_run = store.stored_bytes("acme").await.unwrap();
    assert!(with_run >= deployed + 10_000, "{deployed} then {with_run}");
    assert_eq!(store.stored_bytes("globex").await.unwrap(), 0);
}

/// Regression (found by killing PostgreSQL's backends under load): a
/// journal write that met a terminated connection failed, which failed its
/// run for good (a tenth of the runs), and took the records it carried with
/// it: a branch's completed step, sent with a sibling's attempt, was never
/// stored while its run went on and completed. The writer now waits the
/// lost connection out, and a failed write gives its records back. Here
/// every backend of the store is terminated every few milliseconds while
/// runs of parallel branches and a loop go: each completes with every
/// step's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_go_on_through_terminated_connections_and_keep_every_record() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let application = schema.name().to_string();
    let url = format!("{}&application_name={application}", schema.url());
    let store: Arc<dyn Store> = PostgresStore::connect(&url).await.expect("connects");
    let source = format!(
        "{}\nworkflow w {{\n  for [\"a\", \"b\", \"c\", \"d\"] as each concurrency 2 {{\n    step per = r {{ q: loop_item }}\n  }}\n  parallel par {{\n    branch one {{ step p1 = r {{ q: \"1\" }}\n step p2 = r {{ q: step.p1.a }} }}\n    branch two {{ step p3 = r {{ q: \"3\" }}\n step p4 = r {{ q: step.p3.a }} }}\n  }}\n  step last = r {{ q: step.p4.a }}\n}}",
        r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }"#
    );
    let plan = plan(&source);
    store.put_plan(&plan).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let client = flow_tests::postgres::client().await.expect("connects");
            let mut killed = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rows = client
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                        &[&application],
                    )
                    .await
                    .expect("terminates");
                killed += rows.len() as u64;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            killed
        })
    };
    let mut completed = 0;
    for n in 0..20 {
        let id = format!("run-{n}");
        // Outside the journal, a call that met a terminated connection
        // fails (flowd answers 503 store_unavailable): asked again.
        let mut row = None;
        for _ in 0..200 {
            let _ = store
                .create_run(&id, "", &new_run(&plan.hash, &json!({})), None)
                .await;
            row = store.run(&id).await.ok().flatten();
            if row.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let row = row.expect("the run is stored");
        // A drive whose claim or first read met a terminated connection
        // is an error of the store's (flowd retries those runs): again.
        // Each drive reads the store a few times outside the journal, and
        // every backend is terminated each 15 ms: some drives in a row
        // meet one (50 tries were too few once in CI).
        let mut outcome = Err(flow_runtime::runner::DriveError::Lost);
        let mut ended_in_store = false;
        for _ in 0..500 {
            outcome = flow_runtime::runner::drive(
                &store,
                &plan,
                "w",
                &row.id,
                flow_runtime::runner::Invocation::Resume,
                json!({}),
                Arc::new(OfflineProvider::default()),
                None,
                None,
                None,
                None,
            )
            .await;
            if outcome.is_ok() {
                break;
            }
            // A commit of the run's end whose outcome was unknown is
            // answered with the error (runtime/src/postgres/writer.rs);
            // applied, the run has completed, and each drive after finds
            // it no longer this process's.
            if matches!(outcome, Err(flow_runtime::runner::DriveError::Lost))
                && matches!(store.run(&id).await, Ok(Some(row)) if row.status == RunStatus::Completed)
            {
                ended_in_store = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if ended_in_store || matches!(outcome, Ok(Outcome::Completed { .. })) {
            completed += 1;
            // Read once the storm is over for this run: reads fail too.
            let mut records = None;
            for _ in 0..100 {
                if let Ok(found) = store.step_records(&id).await {
                    records = Some(found);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let paths: std::collections::BTreeSet<String> = records
                .expect("the records read")
                .into_iter()
                .map(|r| r.path)
                .collect();
            for path in [
                "each[0]/per",
                "each[1]/per",
                "each[2]/per",
                "each[3]/per",
                "par/one/p1",
                "par/one/p2",
                "par/two/p3",
                "par/two/p4",
                "last",
            ] {
                assert!(
                    paths.contains(path),
                    "{id} completed without {path}: {paths:?}"
                );
            }
        } else {
            panic!("{id} did not complete: {outcome:?}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let killed = killer.await.unwrap();
    assert!(killed > 0, "connections were terminated");
    assert!(completed > 0);
}
