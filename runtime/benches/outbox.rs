//! The outboxes with a backlog: what one call of `EventStore::due_events`
//! (the webhook deliverer asks after every attempt) and of
//! `NotificationStore::to_mail` costs when one account has a backlog of
//! 1,000 to 100,000 due events and unmailed notifications and five others
//! have one each, and of `to_mail` again once the backlog's notifications
//! all wait for a retry (a mail server down). Flat is the goal: each call
//! seeks into each account's range of what is due, where ranking every due
//! row, or walking those not due yet, cost in proportion to the backlog.
//!
//! `cargo bench -p flow-runtime --bench outbox [-- --quick]`; PostgreSQL
//! (127.0.0.1:5432, database `test`) is measured when it answers.

use std::sync::Arc;
use std::time::Instant;

use flow_runtime::postgres::PostgresStore;
use flow_runtime::sqlite::SqliteStore;
use flow_runtime::store::{DueEvents, Store};
use flow_tests::TempDir;
use flow_tests::postgres::{TestSchema, client, server_url};

/// Calls timed per figure.
const CALLS: usize = 21;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let backlogs: &[i64] = if quick {
        &[1_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    println!(
        "| store | backlog of one account | `due_events` p50 / max | `to_mail` p50 / max | `to_mail`, the backlog waiting for a retry |"
    );
    println!("|---|---|---|---|---|");
    runtime.block_on(async {
        for &backlog in backlogs {
            let dir = TempDir::new("outbox-bench");
            let path = dir.path().join("s.db");
            let store: Arc<dyn Store> = SqliteStore::open(&path).expect("opens");
            let rows = rusqlite::Connection::open(&path).expect("opens");
            rows.execute_batch(&fill("", backlog)).expect("fills");
            let release = || {
                rows.execute_batch(
                    "UPDATE run_events SET claimed_until = 0 WHERE claimed_until <> 0",
                )
                .expect("releases");
            };
            let retry_later = || rows.execute_batch(&retry_later("")).expect("updates");
            report(
                "SQLite",
                backlog,
                &measure(&store, release, retry_later).await,
            );
        }
        let Ok(client) = client().await else {
            println!(
                "\nPostgreSQL does not answer at {}: not measured",
                server_url()
            );
            return;
        };
        for &backlog in backlogs {
            let schema = TestSchema::new();
            let store: Arc<dyn Store> = PostgresStore::connect(&schema.url())
                .await
                .expect("connects");
            let name = schema.name();
            client
                .batch_execute(&fill(&format!("{name}."), backlog))
                .await
                .expect("fills");
            client
                .batch_execute(&format!(
                    "ANALYZE {name}.run_events; ANALYZE {name}.notifications"
                ))
                .await
                .expect("analyzes");
            let release = format!(
                "UPDATE {name}.run_events SET claimed_until = NULL
                     WHERE claimed_until IS NOT NULL;
                 UPDATE {name}.notifications SET mail_owner = NULL, mail_until = NULL
                     WHERE mail_until IS NOT NULL"
            );
            let execute = |sql: &str| {
                tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(client.batch_execute(sql))
                })
                .expect("updates");
            };
            let retry_later = retry_later(&format!("{name}."));
            report(
                "PostgreSQL",
                backlog,
                &measure(&store, || execute(&release), || execute(&retry_later)).await,
            );
        }
    });
}

/// SQL that fills the outboxes: `backlog` rows of account `slow`, due
/// long ago, and one row of each of five other accounts.
fn fill(schema: &str, backlog: i64) -> String {
    let mut sql = String::from("BEGIN;");
    let rows = (0..backlog)
        .map(|i| ("slow".to_string(), i))
        .chain((0..5).map(|i| (format!("quick{i}"), backlog + i)));
    for (account, i) in rows {
        sql.push_str(&format!(
            "INSERT INTO {schema}run_events (account, run_id, workflow, event, created_ms, next_ms)
             VALUES ('{account}', 'r{i}', 'w', 'completed', {i}, {i});
             INSERT INTO {schema}notifications (account, kind, audience, run_id, message, created_ms)
             VALUES ('{account}', 'approval', 'ops', 'r{i}', 'm', {i});"
        ));
    }
    sql.push_str("COMMIT;");
    sql
}

/// SQL that puts every notification of the account with the backlog off
/// until a retry, as a mail server down for a while leaves them.
fn retry_later(schema: &str) -> String {
    let later = flow_runtime::time::now_ms() + 3_600_000;
    format!("UPDATE {schema}notifications SET mail_next_ms = {later} WHERE account = 'slow'")
}

/// Milliseconds of each call, sorted: `due_events`', `to_mail`'s, and
/// `to_mail`'s once `retry_later` has put the backlog off; `release` frees
/// what a call claimed (only those rows: rewriting every row would bloat
/// PostgreSQL's table and measure that), so that each call finds the same
/// rows.
async fn measure(
    store: &Arc<dyn Store>,
    release: impl Fn(),
    retry_later: impl FnOnce(),
) -> [Vec<f64>; 3] {
    let now = flow_runtime::time::now_ms();
    // The slow account holds three quarters of the deliverer, as it would
    // with a hanging endpoint: the others' events are what is asked for.
    let held = [("slow".to_string(), 48)];
    let due = DueEvents {
        now_ms: now,
        limit: 16,
        per_account: 16,
        in_flight: &held,
    };
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..CALLS {
        release();
        let started = Instant::now();
        let events = store.due_events(&due).await.expect("answers");
        times[0].push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(events.len(), 5, "each other account's event");
        release();
        let started = Instant::now();
        let mail = store.to_mail(now, 64).await.expect("answers");
        times[1].push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(mail.len(), 64);
    }
    release();
    retry_later();
    for _ in 0..CALLS {
        release();
        let started = Instant::now();
        let mail = store.to_mail(now, 64).await.expect("answers");
        times[2].push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(mail.len(), 5, "each other account's notification");
    }
    for figures in &mut times {
        figures.sort_by(f64::total_cmp);
    }
    times
}

fn report(store: &str, backlog: i64, [due, mail, waiting]: &[Vec<f64>; 3]) {
    let at = |figures: &[f64]| {
        format!(
            "{:.2} / {:.2} ms",
            figures[figures.len() / 2],
            figures[figures.len() - 1]
        )
    };
    println!(
        "| {store} | {backlog} | {} | {} | {} |",
        at(due),
        at(mail),
        at(waiting)
    );
}
