//! The shared store: PostgreSQL, for several processes (flowd workers on
//! several machines) that run workflows from one database.
//!
//! It keeps the invariants of `crate::store` as the SQLite store does, with
//! what a database over the network needs instead of a file:
//!
//! * **Where.** A URL, `postgres://user@host:5432/db?schema=NAME`. `schema`
//!   is this store's, not PostgreSQL's: it is taken out of the URL, created
//!   if missing, and set as every connection's `search_path`, so that one
//!   database holds several stores (each test its own). Without it the
//!   tables go to the first schema of the server's `search_path`. The
//!   connections do not use TLS: the database is on loopback or a private
//!   network.
//! * **Migrations** are numbered in `flow_migrations`, and applied in one
//!   transaction under an advisory lock on the schema's name, so that
//!   processes starting together neither race nor apply one twice.
//! * **Durable step records, committed in groups.** `Journal::record` queues
//!   the record for one writer task, which takes every record waiting, inserts
//!   them in one statement (one commit, one WAL flush under the server's
//!   default `synchronous_commit = on`) and then answers each caller. New
//!   runs' rows (`create_run`) go through the same writer, in the same
//!   commits, and the heartbeats' lease renewals through a batcher of their
//!   own (`lease.rs`): each was a commit of its own, together two thirds of
//!   B9's commits on PostgreSQL. A gate
//!   reached is a notification to each of its approvers, stored in that same
//!   commit, so that no parked run waits unannounced. Should the batch fail
//!   (a new run's id taken, say), each write is applied alone, so that
//!   only the faulty one fails.
//! * **Decisions apply once.** `decide` locks the step record
//!   (`SELECT ... FOR UPDATE`) and applies `approval::decide_record` to what it
//!   read: of concurrent decisions, the first to lock it decides and the
//!   others find it no longer pending. A run's own write of the record (an
//!   expired gate) is an upsert that changes only a pending record, so it
//!   too either applies before a decision or finds it decided.
//! * **Owners hold leases, not pids.** The processes sharing the database
//!   are on several machines, so whether an owner is alive cannot be asked
//!   of the operating system, as the SQLite store does. A process owns a run
//!   it created or claimed until `lease_until`: `create_run` and `claim_run`
//!   set it to the database's `now()` plus the lease (10 s by default), and
//!   the journal's heartbeat, which the runner sends each second while the
//!   run executes, renews it. A run left `running` whose lease has run out
//!   (its owner died, or lost the database for longer than the lease) is
//!   listed by `orphaned_runs` and may be claimed by another process; its
//!   old owner's heartbeat and `finish_run` then change nothing, as for a
//!   cancelled run, and the step it had in flight runs again (at least
//!   once, as after a crash: steps with effects carry keys). Times of
//!   leases are the database's clock only, so the machines' clocks need not
//!   agree. Each store instance is an owner of its own (host, pid and a
//!   random id), so two instances in one process act as two processes.
//! * **Writes are fenced.** Each claim starts a new `epoch` of the run, and
//!   a journal acts only in the epoch it opened in: its records, KB writes
//!   and handoffs are written in a transaction that first takes a share
//!   lock on the run's row where `owner` and `epoch` are still its own (a
//!   claim, which updates that row, waits for the commit and then loads the
//!   records; or it comes first and the write is refused), and its
//!   heartbeat renews the lease only in its epoch. Before each attempt of a
//!   step, `Journal::admit` checks the lease: without a query while this
//!   process's monotonic clock says it is live (nine tenths of the lease
//!   since the last renewal was sent), otherwise by renewing it. A process
//!   stopped past its lease (SIGSTOP, a long pause) thus starts nothing and
//!   writes nothing of a run another process took over; it drops the run.
//!   A model call asks once more as its body goes out (`fenced_body.rs`),
//!   so a stop after `admit` does not send it either.
//! * **The outbox is shared.** `to_mail` hands each notification that is due
//!   to one process at a time: it claims what it returns for `MAIL_CLAIM`
//!   (`FOR UPDATE SKIP LOCKED`, so that two mailers take different rows);
//!   `mailed` records the attempt and lets the claim go. An entry not marked
//!   by then, its process having died, is offered again.
//! * **JSON is stored as text.** Records, inputs and outcomes are read and
//!   written whole, never queried inside, and `jsonb` refuses the `\u0000`
//!   escape that a model's output may contain.
//! * **KB documents are searchable.** Each has a `tsvector` of its title and
//!   content (the `simple` configuration: no stemming, as documents come in
//!   any language, like SQLite's FTS5 tokenizer) with a GIN index, for the
//!   search that retrieval will run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use flow_plan::{Durability, Plan};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use crate::approval::{DecideError, Decision, PendingApproval, decide_record, gate_due_ms};
use crate::error::with_causes;
use crate::journal::{Hold, StepRecord, StepStatus};
use crate::services::{Handoff, KbDocument, KbWrite};
use crate::store::record::EncodedWrite;
use crate::store::{
    ApprovalStore, DELETE_AFTER_CANCEL_MS, Deletion, Deployment, DueEvents, EVENT_CLAIM, EventNext,
    EventStore, EventsOf, JournalBackend, JournalWrite, KbQuery, KbStore, MAX_REDRIVES, MailNext,
    NO_ACCOUNT, NewNotification, NewRun, Notification, NotificationKind, NotificationQuery,
    NotificationStore, Outgoing, PendingGates, PlanStore, RunEvent, RunHandle, RunLog, RunQuery,
    RunRow, RunStatus, RunStore, StoreError, StoreFuture, StoreJournal,
};
use crate::store::{RunChange, record};
use crate::store::{sql_limit, sql_ms, status_condition};
use crate::time::now_stored_ms as now_ms;
use crate::tls::{TlsMode, TlsSettings};

mod kb;
mod lease;
mod location;
mod migrations;
mod writer;

use kb::{kb_row, write_document};
use lease::*;
pub use location::check_location;
use location::*;
use migrations::*;
use writer::*;

/// How long a run stays its owner's without a heartbeat
/// (`RunLog::heartbeat`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// How long an outbox entry handed out by `to_mail` stays with that
/// process: long enough to mail a batch through retries and timeouts.
const MAIL_CLAIM: Duration = Duration::from_secs(120);

/// The columns `run_row` reads, in its order.
const RUN_COLUMNS: &str = "id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives";

/// The columns `notification_row` reads, less the read mark.
const NOTIFICATION_COLUMNS: &str =
    "id, account, kind, audience, run_id, step_path, subject, message, created_ms";

/// What a store can be tuned by; the defaults suit flowd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// How long an owner holds a run without renewing it (tests shorten it).
    pub lease: Duration,
    /// The most connections the store opens.
    pub pool_size: usize,
}

impl Default for PostgresOptions {
    fn default() -> PostgresOptions {
        PostgresOptions {
            lease: DEFAULT_LEASE,
            pool_size: 16,
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> StoreError {
        StoreError::Database(format!("postgres: {}", with_causes(&error)))
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> StoreError {
        StoreError::Database(format!("postgres: {}", with_causes(&error)))
    }
}

pub struct PostgresStore {
    pool: Pool,
    /// The group-commit writer of step records.
    appends: mpsc::UnboundedSender<Append>,
    /// The batcher of the heartbeats' lease renewals.
    renewals: mpsc::UnboundedSender<Renewal>,
    /// This store instance as the owner of the runs it executes.
    owner: String,
    lease: Duration,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

fn to_json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Damaged(e.to_string()))
}

/// A duration as PostgreSQL's milliseconds, for `now() + $n * interval '1 millisecond'`.
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Adds `change` to the end of run `id`'s history.
async fn append_history(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
    change: &RunChange,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE runs SET history = (history::jsonb || jsonb_build_array($2::text::jsonb))::text
         WHERE id = $1",
        &[&id, &change.to_json()],
    )
    .await?;
    Ok(())
}

impl PostgresStore {
    /// Connects to the database at `location` (see the module doc for
    /// `schema=`), migrating it if needed, with the default options.
    pub async fn connect(location: &str) -> Result<Arc<PostgresStore>, StoreError> {
        PostgresStore::connect_with(location, PostgresOptions::default()).await
    }

    pub async fn connect_with(
        location: &str,
        options: PostgresOptions,
    ) -> Result<Arc<PostgresStore>, StoreError> {
        let (mut config, schema, tls) = parse_location(location)?;
        if let Some(schema) = &schema {
            let options = match config.get_options() {
                Some(given) => format!("{given} -csearch_path={schema}"),
                None => format!("-csearch_path={schema}"),
            };
            config.options(options);
        }
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls.mode {
            TlsMode::Disable => Manager::from_config(config, NoTls, manager_config),
            _ => {
                let tls = tls
                    .client_config()
                    .map_err(|message| StoreError::Unusable(format!("postgres: {message}")))?;
                Manager::from_config(
                    config,
                    crate::tls::postgres::MakeRustls::new(tls),
                    manager_config,
                )
            }
        };
        // Bounded waits: a database that does not answer fails a call
        // rather than hanging it.
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(Duration::from_secs(10)))
            .wait_timeout(Some(Duration::from_secs(30)))
            .build()
            .map_err(|e| StoreError::Unusable(format!("postgres: {e}")))?;
        migrate(&pool, schema.as_deref()).await?;
        let client = pool.get().await?;
        let id: String = client
            .query_one("SELECT gen_random_uuid()::text", &[])
            .await?
            .get(0);
        drop(client);
        let (appends, queue) = mpsc::unbounded_channel();
        let owner = format!("{}:{}:{id}", host_name(), std::process::id());
        tokio::spawn(write_batches(
            pool.clone(),
            owner.clone(),
            options.lease,
            queue,
        ));
        let (renewals, queue) = mpsc::unbounded_channel();
        tokio::spawn(renew_batches(
            pool.clone(),
            owner.clone(),
            options.lease,
            queue,
        ));
        Ok(Arc::new(PostgresStore {
            pool,
            appends,
            renewals,
            owner,
            lease: options.lease,
        }))
    }

    /// This store instance as an owner of runs.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Runs one statement on a pooled connection; the rows it returns. A
    /// read is made again on another connection when its own was lost (a
    /// backend terminated, a failover): the pool hands out connections
    /// whose end it has not seen yet, and a read changes nothing. A few
    /// times, then the error is the caller's (flowd: 503).
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        const TRIES: u32 = 3;
        let mut tried = 0;
        loop {
            let client = self.client().await?;
            let read = async {
                let statement = client.prepare_cached(sql).await?;
                client.query(&statement, params).await
            };
            match read.await {
                Err(error) if tried + 1 < TRIES && writer::connection_lost(&error) => tried += 1,
                read => return Ok(read?),
            }
        }
    }

    /// Runs one statement on a pooled connection; how many rows it changed.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await?;
        Ok(client.execute(&statement, params).await?)
    }

    async fn runs_where(
        &self,
        condition: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<RunRow>, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE {condition}");
        self.query(&sql, params)
            .await?
            .iter()
            .map(run_row)
            .collect()
    }

    /// Queues `write` for the writer's next commit; resolves once it is
    /// durable, or with `LeaseLost` when the fence refused it (the run is no
    /// longer this process's in its journal's epoch).
    fn append(&self, run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()> {
        let applied = self.queue(Queued::Journal {
            run: Arc::clone(run),
            encoded: EncodedWrite::new(write),
        });
        Box::pin(async move {
            match applied.await? {
                true => Ok(()),
                false => Err(StoreError::LeaseLost),
            }
        })
    }

    /// Queues `what` for the writer's next commit; resolves once that is
    /// durable, with whether it applied.
    fn queue(&self, what: Queued) -> StoreFuture<'static, bool> {
        let (reply, answer) = oneshot::channel();
        let queued = self.appends.send(Append { what, reply });
        Box::pin(async move {
            queued.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
        })
    }

    async fn step_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.query(
            "SELECT record FROM step_runs WHERE run_id = $1 ORDER BY seq",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|row| record::decode(row.get(0)))
        .collect()
    }

    async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self.runs_where("id = $1", &[&id]).await?.pop())
    }

    async fn undeploy(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<usize, StoreError> {
        let version = version.map(|v| v as i32);
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let hashes: Vec<String> = tx
            .query(
                "DELETE FROM deployments
                 WHERE account = $1 AND workflow = $2 AND ($3::INTEGER IS NULL OR version = $3)
                 RETURNING plan_hash",
                &[&account, &workflow, &version],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let mut unique = hashes.clone();
        unique.sort();
        unique.dedup();
        forget_plans(&tx, &unique).await?;
        tx.commit().await?;
        Ok(hashes.len())
    }

    async fn delete_run(&self, account: &str, id: &str) -> Result<Deletion, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT status, updated_ms, plan_hash FROM runs
                 WHERE id = $1 AND account = $2 FOR UPDATE",
                &[&id, &account],
            )
            .await?;
        let Some(row) = row else {
            return Ok(Deletion::Unknown);
        };
        let status = RunStatus::parse(row.get(0))
            .ok_or_else(|| StoreError::Damaged(format!("run {id} has an unknown status")))?;
        let updated_ms: i64 = row.get(1);
        let plan_hash: String = row.get(2);
        let deletable = match status {
            RunStatus::Cancelled => updated_ms < now_ms() - DELETE_AFTER_CANCEL_MS,
            status => status.has_ended(),
        };
        if !deletable {
            return Ok(Deletion::NotEnded(status));
        }
        delete_run_rows(&tx, &[id.to_string()]).await?;
        forget_plans(&tx, &[plan_hash]).await?;
        tx.commit().await?;
        Ok(Deletion::Deleted)
    }

    async fn delete_ended_runs(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let cancelled_before = before_ms.min(now_ms() - DELETE_AFTER_CANCEL_MS);
        let rows = tx
            .query(
                "SELECT id, plan_hash FROM runs
                 WHERE (status IN ('completed', 'failed') AND updated_ms < $1)
                    OR (status = 'cancelled' AND updated_ms < $2)
                 LIMIT $3 FOR UPDATE SKIP LOCKED",
                &[&before_ms, &cancelled_before, &sql_limit(limit)],
            )
            .await?;
        let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        let mut hashes: Vec<String> = rows.iter().map(|row| row.get(1)).collect();
        hashes.sort();
        hashes.dedup();
        delete_run_rows(&tx, &ids).await?;
        forget_plans(&tx, &hashes).await?;
        tx.commit().await?;
        Ok(ids.len())
    }

    async fn delete_document(
        &self,
        account: &str,
        collection: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let deleted = self
            .client()
            .await?
            .execute(
                "DELETE FROM kb_documents WHERE account = $1 AND collection = $2 AND title = $3",
                &[&account, &collection, &title],
            )
            .await?;
        Ok(deleted == 1)
    }

    async fn decide(
        &self,
        run_id: &str,
        path: &str,
        decision: &Decision,
    ) -> Result<Result<(), DecideError>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let run = tx
            .query_opt(
                "SELECT status, redrives FROM runs WHERE id = $1",
                &[&run_id],
            )
            .await?
            .map(|row| (row.get::<_, String>(0), row.get::<_, i32>(1)));
        let run_status = run
            .as_ref()
            .and_then(|(status, _)| RunStatus::parse(status));
        let round = run.map_or(0, |(_, round)| round.max(0) as u32);
        if !matches!(
            run_status,
            Some(RunStatus::PendingApproval | RunStatus::Running)
        ) {
            return Ok(Err(DecideError::RunEnded {
                run_id: run_id.to_string(),
                status: run_status.map_or("unknown", RunStatus::as_str).into(),
            }));
        }
        // The lock makes concurrent decisions on this gate take turns: each
        // reads the record as the previous one left it.
        let statement = tx
            .prepare_cached(
                "SELECT record FROM step_runs WHERE run_id = $1 AND path = $2 FOR UPDATE",
            )
            .await?;
        let record = tx
            .query_opt(&statement, &[&run_id, &path])
            .await?
            .and_then(|row| record::decode(row.get(0)).ok());
        let decided = match decide_record(record.as_ref(), path, decision, now_ms() as u64, round) {
            Ok(decided) => decided,
            Err(refused) => return Ok(Err(refused)),
        };
        let statement = tx
            .prepare_cached(
                "UPDATE step_runs SET status = $3, record = $4, due_ms = NULL
                 WHERE run_id = $1 AND path = $2",
            )
            .await?;
        tx.execute(
            &statement,
            &[
                &run_id,
                &path,
                &decided.status.as_str(),
                &record::encode(&decided),
            ],
        )
        .await?;
        // This process's to claim, in the same commit, under a lease that
        // runs out if it dies first (see the SQLite store's
        // `apply_decision`).
        tx.execute(
            "UPDATE runs SET status = 'running', owner = $2, updated_ms = $3,
                 lease_until = now() + $4 * interval '1 millisecond'
             WHERE id = $1 AND status = 'pending_approval'",
            &[&run_id, &self.owner, &now_ms(), &millis(self.lease)],
        )
        .await?;
        tx.commit().await?;
        Ok(Ok(()))
    }

    async fn deploy(
        &self,
        account: &str,
        workflow: &str,
        plan_hash: &str,
    ) -> Result<Deployment, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Deploys of one workflow take turns, so that each reads the latest
        // version the previous one wrote.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('flow deploy ' || $1 || '/' || $2, 0))",
            &[&account, &workflow],
        )
        .await?;
        let latest = tx
            .query_opt(
                "SELECT version, plan_hash, created_ms FROM deployments
                 WHERE account = $1 AND workflow = $2 ORDER BY version DESC LIMIT 1",
                &[&account, &workflow],
            )
            .await?
            .map(|row| (row.get::<_, i32>(0), row.get::<_, String>(1), row.get(2)));
        if let Some((version, hash, created_ms)) = &latest
            && hash == plan_hash
        {
            return Ok(Deployment {
                workflow: workflow.to_string(),
                version: *version as u32,
                plan_hash: hash.clone(),
                created_ms: *created_ms,
            });
        }
        let version: i32 = tx
            .query_one(
                "INSERT INTO workflow_versions (account, workflow, last_version) VALUES ($1, $2, 1)
                 ON CONFLICT (account, workflow) DO UPDATE SET last_version = workflow_versions.last_version + 1
                 RETURNING last_version",
                &[&account, &workflow],
            )
            .await?
            .get(0);
        let created_ms = now_ms();
        tx.execute(
            "INSERT INTO deployments (account, workflow, version, plan_hash, created_ms)
             VALUES ($1, $2, $3, $4, $5)",
            &[&account, &workflow, &version, &plan_hash, &created_ms],
        )
        .await?;
        tx.commit().await?;
        Ok(Deployment {
            workflow: workflow.to_string(),
            version: version as u32,
            plan_hash: plan_hash.to_string(),
            created_ms,
        })
    }

    async fn notify(&self, note: &NewNotification<'_>) -> Result<bool, StoreError> {
        let client = self.client().await?;
        insert_notification(&client, note).await
    }

    async fn mark_read(
        &self,
        account: &str,
        reader: &str,
        ids: &[i64],
    ) -> Result<usize, StoreError> {
        let found: Vec<i64> = self
            .query(
                "WITH found AS (SELECT id FROM notifications WHERE account = $1 AND id = ANY($3)),
                      marked AS (
                          INSERT INTO notification_reads (notification_id, reader, read_ms)
                          SELECT id, $2, $4 FROM found
                          ON CONFLICT DO NOTHING)
                 SELECT id FROM found",
                &[&account, &reader, &ids, &now_ms()],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        Ok(ids.iter().filter(|id| found.contains(id)).count())
    }

    async fn to_mail(&self, now_ms: u64, limit: usize) -> Result<Vec<Outgoing>, StoreError> {
        let sql = format!(
            // Found, locked and ranked as `due_events` finds its events,
            // each account's in the order they came due (see the SQLite
            // store's).
            "WITH RECURSIVE accounts(account) AS (
                 (SELECT account FROM notifications WHERE mail IS NULL
                  ORDER BY account LIMIT 1)
                 UNION ALL
                 SELECT (SELECT n.account FROM notifications n
                         WHERE n.mail IS NULL AND n.account > a.account
                         ORDER BY n.account LIMIT 1)
                 FROM accounts a WHERE a.account IS NOT NULL),
             ranked AS (
                 SELECT m.id, ROW_NUMBER() OVER (PARTITION BY a.account ORDER BY m.due, m.id)
                            AS place
                 FROM accounts a
                 CROSS JOIN LATERAL (
                     SELECT n.id, COALESCE(n.mail_next_ms, n.created_ms) AS due
                     FROM notifications n
                     WHERE n.account = a.account AND n.mail IS NULL
                       AND COALESCE(n.mail_next_ms, n.created_ms) <= $1
                       AND (n.mail_until IS NULL OR n.mail_until < now())
                     ORDER BY COALESCE(n.mail_next_ms, n.created_ms), n.id LIMIT $2
                     FOR UPDATE OF n SKIP LOCKED) m),
             due AS (SELECT id, place FROM ranked ORDER BY place, id LIMIT $2)
             UPDATE notifications n SET mail_owner = $3,
                 mail_until = now() + $4 * interval '1 millisecond'
             FROM due WHERE n.id = due.id
             RETURNING {}, false, n.mail_attempts,
                 ARRAY(SELECT recipient FROM notification_sends s
                       WHERE s.notification_id = n.id ORDER BY recipient),
                 due.place",
            NOTIFICATION_COLUMNS
                .split(", ")
                .map(|column| format!("n.{column}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let now = sql_ms(now_ms);
        let mut due = self
            .query(
                &sql,
                &[&now, &sql_limit(limit), &self.owner, &millis(MAIL_CLAIM)],
            )
            .await?
            .iter()
            .map(|row| {
                let outgoing = Outgoing {
                    notification: notification_row(row)?,
                    attempts: row.get::<_, i32>(10) as u32,
                    sent_to: row.get(11),
                };
                Ok((row.get::<_, i64>(12), outgoing))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        due.sort_by_key(|(place, outgoing)| (*place, outgoing.notification.id));
        Ok(due.into_iter().map(|(_, outgoing)| outgoing).collect())
    }

    async fn mailed(&self, id: i64, reached: &[String], next: MailNext) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO notification_sends (notification_id, recipient, sent_ms)
             SELECT $1, recipient, $3 FROM unnest($2::text[]) AS recipient
             ON CONFLICT DO NOTHING",
            &[&id, &reached, &now_ms()],
        )
        .await?;
        match next {
            MailNext::Done(state) => {
                tx.execute(
                    "UPDATE notifications SET mail = $2, mail_owner = NULL, mail_until = NULL
                     WHERE id = $1",
                    &[&id, &state.as_str()],
                )
                .await?
            }
            MailNext::Retry(at_ms) => {
                tx.execute(
                    "UPDATE notifications SET mail_attempts = mail_attempts + 1,
                         mail_next_ms = $2, mail_owner = NULL, mail_until = NULL
                     WHERE id = $1",
                    &[&id, &sql_ms(at_ms)],
                )
                .await?
            }
        };
        tx.commit().await?;
        Ok(())
    }
}

impl PostgresStore {
    async fn keep_events_of(&self, accounts: &[(String, EventsOf)]) -> Result<(), StoreError> {
        let (names, every_run): (Vec<&str>, Vec<bool>) = accounts
            .iter()
            .map(|(account, of)| (account.as_str(), *of == EventsOf::EveryRun))
            .unzip();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "DELETE FROM event_accounts WHERE account <> ALL($1)",
            &[&names],
        )
        .await?;
        tx.execute(
            "INSERT INTO event_accounts (account, every_run)
             SELECT * FROM unnest($1::text[], $2::boolean[])
             ON CONFLICT (account) DO UPDATE SET every_run = EXCLUDED.every_run",
            &[&names, &every_run],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn due_events(&self, due: &DueEvents<'_>) -> Result<Vec<RunEvent>, StoreError> {
        let now = sql_ms(due.now_ms);
        let (accounts, held): (Vec<&str>, Vec<i64>) = due
            .in_flight
            .iter()
            .map(|(account, held)| (account.as_str(), sql_limit(*held)))
            .unzip();
        // Accounts with no room left: their events are not even locked.
        let full: Vec<&str> = due
            .in_flight
            .iter()
            .filter(|(_, held)| *held >= due.per_account)
            .map(|(account, _)| account.as_str())
            .collect();
        // No account gives more than its share, nor more than all asked.
        let most_of_one = due.per_account_bound().min(sql_limit(due.limit));
        let mut events = self
            .query(
                // `place`: where the event would stand among its account's
                // in flight, were it taken. Each account's events that came
                // due first are found by a seek into its own range (the
                // accounts one seek each, `WITH RECURSIVE`), not by ranking
                // every due event, and locked there, where the lock checks
                // again that each is still free (`FOR UPDATE` takes no
                // window); those locked and not taken are free again when
                // the statement ends. Joined back to the table instead,
                // the ranked events took a scan of every event: the
                // planner cannot tell how few the accounts are. The bounds
                // are parameters, not computed per account in SQL: a
                // computed `LIMIT` made the planner expect every row.
                "WITH RECURSIVE accounts(account) AS (
                     (SELECT account FROM run_events ORDER BY account LIMIT 1)
                     UNION ALL
                     SELECT (SELECT e.account FROM run_events e WHERE e.account > a.account
                             ORDER BY e.account LIMIT 1)
                     FROM accounts a WHERE a.account IS NOT NULL),
                 ranked AS (
                     SELECT d.id, d.next_ms,
                            ROW_NUMBER() OVER (PARTITION BY a.account ORDER BY d.next_ms, d.id)
                                + COALESCE(held.n, 0) AS place
                     FROM accounts a
                     CROSS JOIN LATERAL (
                         SELECT e.id, e.next_ms FROM run_events e
                         WHERE e.account = a.account AND e.next_ms <= $1
                           AND (e.claimed_until IS NULL OR e.claimed_until < now())
                         ORDER BY e.next_ms, e.id LIMIT $8
                         FOR UPDATE OF e SKIP LOCKED) d
                     LEFT JOIN unnest($4::text[], $5::bigint[]) AS held(account, n)
                         ON held.account = a.account
                     WHERE a.account <> ALL($7::text[])),
                 due AS (
                     SELECT id FROM ranked WHERE place <= $6
                     ORDER BY place, next_ms, id LIMIT $2)
                 UPDATE run_events e SET claimed_until = now() + $3 * interval '1 millisecond'
                 FROM due WHERE e.id = due.id
                 RETURNING e.id, e.account, e.run_id, e.workflow, e.event, e.outcome,
                           e.created_ms, e.attempts, e.reached",
                &[
                    &now,
                    &(sql_limit(due.limit)),
                    &millis(EVENT_CLAIM),
                    &accounts,
                    &held,
                    &due.per_account_bound(),
                    &full,
                    &most_of_one,
                ],
            )
            .await?
            .iter()
            .map(|row| RunEvent {
                id: row.get(0),
                account: row.get(1),
                run_id: row.get(2),
                workflow: row.get(3),
                event: row.get(4),
                outcome: row
                    .get::<_, Option<&str>>(5)
                    .and_then(|text| serde_json::from_str(text).ok()),
                created_ms: row.get(6),
                attempts: row.get::<_, i32>(7) as u32,
                reached: row.get(8),
            })
            .collect::<Vec<_>>();
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    async fn event_attempted(
        &self,
        id: i64,
        reached: &[String],
        next: EventNext,
    ) -> Result<(), StoreError> {
        match next {
            EventNext::Done => {
                self.execute("DELETE FROM run_events WHERE id = $1", &[&id])
                    .await?
            }
            EventNext::Retry(at_ms) => {
                self.execute(
                    "UPDATE run_events SET attempts = attempts + 1, next_ms = $2,
                         claimed_until = NULL,
                         reached = ARRAY(SELECT DISTINCT unnest(reached || $3::text[]) ORDER BY 1)
                     WHERE id = $1",
                    &[&id, &sql_ms(at_ms), &reached],
                )
                .await?
            }
        };
        Ok(())
    }
}

impl EventStore for PostgresStore {
    fn keep_events_of<'a>(&'a self, accounts: &'a [(String, EventsOf)]) -> StoreFuture<'a, ()> {
        Box::pin(self.keep_events_of(accounts))
    }

    fn due_events<'a>(&'a self, due: &'a DueEvents<'a>) -> StoreFuture<'a, Vec<RunEvent>> {
        Box::pin(self.due_events(due))
    }

    fn event_attempted<'a>(
        &'a self,
        id: i64,
        reached: &'a [String],
        next: EventNext,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.event_attempted(id, reached, next))
    }

    fn note_delivery<'a>(&'a self, run_id: &'a str, change: &'a RunChange) -> StoreFuture<'a, ()> {
        Box::pin(PostgresStore::note_delivery(self, run_id, change))
    }
}

fn run_row(row: &tokio_postgres::Row) -> Result<RunRow, StoreError> {
    let status: String = row.get(3);
    let outcome: Option<String> = row.get(5);
    Ok(RunRow {
        id: row.get(0),
        workflow: row.get(1),
        plan_hash: row.get(2),
        status: RunStatus::parse(&status)
            .ok_or_else(|| StoreError::Damaged(format!("unknown run status `{status}`")))?,
        input: serde_json::from_str(row.get(4)).unwrap_or(Value::Null),
        outcome: outcome.and_then(|o| serde_json::from_str(&o).ok()),
        created_ms: row.get(6),
        updated_ms: row.get(7),
        active_ms: row.get(8),
        account: row.get(9),
        redrives: row.get::<_, i32>(10).max(0) as u32,
    })
}

fn notification_row(row: &tokio_postgres::Row) -> Result<Notification, StoreError> {
    let kind: String = row.get(2);
    Ok(Notification {
        id: row.get(0),
        account: row.get(1),
        kind: NotificationKind::parse(&kind)
            .ok_or_else(|| StoreError::Damaged(format!("unknown notification kind `{kind}`")))?,
        audience: row.get(3),
        run_id: row.get(4),
        step_path: row.get(5),
        subject: row.get(6),
        message: row.get(7),
        created_ms: row.get(8),
        read: row.get(9),
    })
}

/// Inserts a notification unless one with its key exists; true if inserted.
async fn insert_notification(
    client: &impl deadpool_postgres::GenericClient,
    note: &NewNotification<'_>,
) -> Result<bool, StoreError> {
    let changed = client
        .execute(
            "INSERT INTO notifications
                 (account, kind, audience, run_id, step_path, subject, message, key, created_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (account, key) DO NOTHING",
            &[
                &note.account,
                &note.kind.as_str(),
                &note.audience,
                &note.run_id,
                &note.step_path,
                &note.subject,
                &note.message,
                &note.key,
                &now_ms(),
            ],
        )
        .await?;
    Ok(changed == 1)
}

/// Deletes the runs `ids`' rows: their notifications (with their reads and
/// sends), their events not yet delivered, their journals and themselves.
async fn delete_run_rows(
    tx: &deadpool_postgres::Transaction<'_>,
    ids: &[String],
) -> Result<(), StoreError> {
    for sql in [
        "DELETE FROM notification_reads WHERE notification_id IN (SELECT id FROM notifications WHERE run_id = ANY($1))",
        "DELETE FROM notification_sends WHERE notification_id IN (SELECT id FROM notifications WHERE run_id = ANY($1))",
        "DELETE FROM notifications WHERE run_id = ANY($1)",
        "DELETE FROM run_events WHERE run_id = ANY($1)",
        "DELETE FROM step_runs WHERE run_id = ANY($1)",
        "DELETE FROM runs WHERE id = ANY($1)",
    ] {
        tx.execute(sql, &[&ids]).await?;
    }
    Ok(())
}

/// Deletes the plans of `hashes` that no deployment and no run uses.
async fn forget_plans(
    tx: &deadpool_postgres::Transaction<'_>,
    hashes: &[String],
) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM plans p WHERE hash = ANY($1)
           AND NOT EXISTS (SELECT 1 FROM deployments WHERE plan_hash = p.hash)
           AND NOT EXISTS (SELECT 1 FROM runs WHERE plan_hash = p.hash)",
        &[&hashes],
    )
    .await?;
    Ok(())
}

impl PlanStore for PostgresStore {
    fn put_plan<'a>(&'a self, plan: &'a Plan) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.execute(
                "INSERT INTO plans (hash, json, delivers) VALUES ($1, $2, $3)
                 ON CONFLICT (hash) DO UPDATE SET json = excluded.json, delivers = excluded.delivers
                 WHERE plans.json IS DISTINCT FROM excluded.json",
                &[&plan.hash, &to_json(plan)?, &plan.delivers()],
            )
            .await?;
            Ok(())
        })
    }

    fn plan<'a>(&'a self, hash: &'a str) -> StoreFuture<'a, Plan> {
        Box::pin(async move {
            let rows = self
                .query("SELECT json FROM plans WHERE hash = $1", &[&hash])
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Missing(format!("no plan {hash} in the store")))?;
            Plan::from_json(row.get(0)).map_err(|e| StoreError::Damaged(e.to_string()))
        })
    }

    fn deploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
    ) -> StoreFuture<'a, Deployment> {
        Box::pin(self.deploy(account, workflow, plan_hash))
    }

    fn undeploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, usize> {
        Box::pin(self.undeploy(account, workflow, version))
    }

    fn deployments<'a>(&'a self, account: &'a str) -> StoreFuture<'a, Vec<Deployment>> {
        Box::pin(async move {
            Ok(self
                .query(
                    "SELECT workflow, version, plan_hash, created_ms FROM deployments
                     WHERE account = $1 ORDER BY workflow, version",
                    &[&account],
                )
                .await?
                .iter()
                .map(deployment_row)
                .collect())
        })
    }

    fn deployment<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, Option<Deployment>> {
        Box::pin(async move {
            let version = version.map(|version| version as i32);
            Ok(self
                .query(
                    "SELECT workflow, version, plan_hash, created_ms FROM deployments
                     WHERE account = $1 AND workflow = $2 AND ($3::int IS NULL OR version = $3)
                     ORDER BY version DESC LIMIT 1",
                    &[&account, &workflow, &version],
                )
                .await?
                .first()
                .map(deployment_row))
        })
    }
}

/// A `Deployment` of a row of `workflow, version, plan_hash, created_ms`.
fn deployment_row(row: &tokio_postgres::Row) -> Deployment {
    Deployment {
        workflow: row.get(0),
        version: row.get::<_, i32>(1) as u32,
        plan_hash: row.get(2),
        created_ms: row.get(3),
    }
}

impl RunStore for PostgresStore {
    /// Stored in the writer's next commit, with the journals' writes: a
    /// commit of its own for each run started over HTTP was a third of a
    /// B9 run's commits on PostgreSQL. Queued when called, not when
    /// awaited, as the journal's writes are.
    fn create_run<'a>(
        &'a self,
        id: &'a str,
        account: &'a str,
        run: &'a NewRun,
        idempotency_key: Option<&'a str>,
    ) -> StoreFuture<'a, bool> {
        self.queue(Queued::Create(CreatedRun {
            id: id.to_string(),
            account: account.to_string(),
            workflow: run.workflow.clone(),
            plan_hash: run.plan_hash.clone(),
            input: run.input.to_string(),
            idempotency_key: idempotency_key.map(str::to_string),
            history: run.history(),
        }))
    }

    fn run_by_key<'a>(&'a self, account: &'a str, key: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        Box::pin(async move {
            Ok(self
                .runs_where("account = $1 AND idempotency_key = $2", &[&account, &key])
                .await?
                .pop())
        })
    }

    /// Takes the run if its status is one of `from` and no other owner's
    /// lease on it is live: a run left `running` by an owner whose lease ran
    /// out is taken over.
    fn claim_run<'a>(&'a self, id: &'a str, from: &'a [RunStatus]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let from: Vec<&str> = from.iter().map(|status| status.as_str()).collect();
            let changed = self
                .execute(
                    "UPDATE runs SET status = 'running', owner = $3, updated_ms = $5,
                         lease_until = now() + $4 * interval '1 millisecond', epoch = epoch + 1
                     WHERE id = $1 AND status = ANY($2)
                       AND NOT (status = 'running' AND owner IS NOT NULL AND owner <> $3
                                AND lease_until > now())",
                    &[&id, &from, &self.owner, &millis(self.lease), &now_ms()],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn finish_run<'a>(
        &'a self,
        id: &'a str,
        status: RunStatus,
        outcome: &'a Value,
        active: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let changed = self
                .execute(
                    "UPDATE runs SET status = $2, outcome = $3, updated_ms = $4,
                         active_ms = active_ms + $5, owner = NULL, lease_until = NULL
                     WHERE id = $1 AND owner = $6",
                    &[
                        &id,
                        &status.as_str(),
                        &outcome.to_string(),
                        &now_ms(),
                        &(active.as_millis() as i64),
                        &self.owner,
                    ],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        Box::pin(self.run(id))
    }

    fn account_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        // Large values live in TOAST tables and are read only when selected.
        Box::pin(async move {
            Ok(self
                .runs_where("id = $1 AND account = $2", &[&id, &account])
                .await?
                .pop())
        })
    }

    fn runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        Box::pin(self.runs_where("true ORDER BY created_ms, id", &[]))
    }

    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        Box::pin(self.runs_where("status = 'running' ORDER BY created_ms, id", &[]))
    }

    fn orphaned_runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        Box::pin(async move {
            // This process's own too: a run it gave up while the store
            // was cut off kept it as owner, and was found by nobody while
            // the process lived (a chaos audit). Those it drives renew
            // their leases, and the caller leaves them alone.
            self.runs_where(
                "status = 'running' AND (owner IS NULL OR lease_until <= now())
                 ORDER BY created_ms, id",
                &[],
            )
            .await
        })
    }

    /// Through the writer, after every write queued before it: the records
    /// of the runs' journals, dropped as their tasks stopped, are written
    /// while the runs are still this process's.
    fn release_runs(&self) -> StoreFuture<'_, ()> {
        let released = self.queue(Queued::Release);
        Box::pin(async move { released.await.map(drop) })
    }

    fn step_records<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        Box::pin(self.step_records(run_id))
    }

    fn cancel_run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let at_ms = now_ms();
            let changed = self
                .execute(
                    "UPDATE runs SET status = 'cancelled', owner = NULL, lease_until = NULL,
                         updated_ms = $2,
                         history = (history::jsonb || jsonb_build_array($3::text::jsonb))::text
                     WHERE id = $1 AND status IN ('running', 'pending_approval')",
                    &[&id, &at_ms, &RunChange::Cancelled { at_ms }.to_json()],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn redrive_run<'a>(
        &'a self,
        id: &'a str,
        to_plan: Option<&'a str>,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let at_ms = now_ms();
            // The plan it was on, read in the same statement (before it).
            let row = tx
                .query_opt(
                    "UPDATE runs r SET status = 'running', outcome = NULL, owner = $2, updated_ms = $3,
                         active_ms = 0, redrives = r.redrives + 1, epoch = r.epoch + 1,
                         lease_until = now() + $4 * interval '1 millisecond',
                         plan_hash = COALESCE($6, r.plan_hash)
                     FROM runs old
                     WHERE r.id = $1 AND old.id = r.id
                       AND r.status IN ('failed', 'cancelled') AND r.redrives < $5
                     RETURNING r.redrives, old.plan_hash",
                    &[
                        &id,
                        &self.owner,
                        &at_ms,
                        &millis(self.lease),
                        &(MAX_REDRIVES as i32),
                        &to_plan,
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let round = row.get::<_, i32>(0).max(0) as u32;
            let from_plan: String = row.get(1);
            let mut changes = vec![RunChange::Redriven { at_ms, round }];
            if let Some(to_plan) = to_plan.filter(|to| *to != from_plan) {
                changes.push(RunChange::Moved {
                    at_ms,
                    from_plan,
                    to_plan: to_plan.to_string(),
                });
            }
            for change in &changes {
                append_history(&tx, id, change).await?;
            }
            tx.execute(
                "UPDATE step_runs SET status = 'redriven' WHERE run_id = $1 AND status = 'failed'",
                &[&id],
            )
            .await?;
            tx.commit().await?;
            Ok(Some(round))
        })
    }

    fn move_run<'a>(
        &'a self,
        id: &'a str,
        from_plan: &'a str,
        to_plan: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let at_ms = now_ms();
            let moved = tx
                .execute(
                    "UPDATE runs SET plan_hash = $3, updated_ms = $4
                     WHERE id = $1 AND plan_hash = $2 AND status = 'pending_approval'",
                    &[&id, &from_plan, &to_plan, &at_ms],
                )
                .await?
                == 1;
            if moved {
                let change = RunChange::Moved {
                    at_ms,
                    from_plan: from_plan.to_string(),
                    to_plan: to_plan.to_string(),
                };
                append_history(&tx, id, &change).await?;
            }
            tx.commit().await?;
            Ok(moved)
        })
    }

    fn stored_bytes<'a>(&'a self, account: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let bytes: i64 = self
                .query(
                    "SELECT
                       (SELECT COALESCE(SUM(octet_length(json)), 0) FROM plans
                         WHERE hash IN (SELECT plan_hash FROM deployments WHERE account = $1))
                     + (SELECT COALESCE(SUM(octet_length(input) + COALESCE(octet_length(outcome), 0)), 0)
                         FROM runs WHERE account = $1)
                     + (SELECT COALESCE(SUM(octet_length(s.record)), 0)
                         FROM step_runs s JOIN runs r ON r.id = s.run_id WHERE r.account = $1)
                     + (SELECT COALESCE(SUM(octet_length(content) + COALESCE(octet_length(metadata), 0)), 0)
                         FROM kb_documents WHERE account = $1)
                     + (SELECT COALESCE(SUM(octet_length(message)), 0) FROM notifications WHERE account = $1)",
                    &[&account],
                )
                .await?
                .first()
                .map_or(0, |row| row.get::<_, i64>(0));
            Ok(bytes.max(0) as u64)
        })
    }

    fn run_history<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<RunChange>> {
        Box::pin(async move {
            let history: Option<String> = self
                .query("SELECT history FROM runs WHERE id = $1", &[&id])
                .await?
                .first()
                .map(|row| row.get(0));
            Ok(history.map_or_else(Vec::new, |text| RunChange::list_from_text(&text)))
        })
    }

    fn delete_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Deletion> {
        Box::pin(self.delete_run(account, id))
    }

    fn delete_ended_runs(&self, before_ms: i64, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(self.delete_ended_runs(before_ms, limit))
    }

    fn account_runs<'a>(
        &'a self,
        account: &'a str,
        query: &'a RunQuery,
    ) -> StoreFuture<'a, Vec<RunRow>> {
        Box::pin(async move {
            let (before_ms, before_id) = query.before.clone().unzip();
            self.runs_where(
                &format!(
                    "account = $1 AND ($2::text IS NULL OR workflow = $2) AND {}
                       AND ($4::bigint IS NULL OR (created_ms, id) < ($4, $5::text))
                     ORDER BY created_ms DESC, id DESC LIMIT $3",
                    status_condition(query.status)
                ),
                &[
                    &account,
                    &query.workflow,
                    &sql_limit(query.limit),
                    &before_ms,
                    &before_id,
                ],
            )
            .await
        })
    }

    fn open_journal<'a>(
        self: Arc<Self>,
        run_id: &'a str,
        durability: Durability,
    ) -> StoreFuture<'a, Arc<dyn RunLog>> {
        Box::pin(async move {
            let journal = PostgresJournal::open(&self, run_id, durability).await?;
            Ok(journal as Arc<dyn RunLog>)
        })
    }

    fn fresh_journal(
        self: Arc<Self>,
        run_id: &str,
        account: &str,
        start: Option<NewRun>,
        held_from: std::time::Instant,
        durability: Durability,
    ) -> Arc<dyn RunLog> {
        Arc::new(StoreJournal::fresh(
            self, run_id, account, start, held_from, durability,
        ))
    }
}

impl ApprovalStore for PostgresStore {
    fn expired_gates(&self, now_ms: u64) -> StoreFuture<'_, Vec<RunRow>> {
        Box::pin(async move {
            let now = sql_ms(now_ms);
            self.runs_where(
                "status = 'pending_approval' AND id IN (
                     SELECT run_id FROM step_runs
                     WHERE status = 'pending' AND due_ms IS NOT NULL AND due_ms <= $1)
                 ORDER BY created_ms, id",
                &[&now],
            )
            .await
        })
    }

    fn decide<'a>(
        &'a self,
        run_id: &'a str,
        path: &'a str,
        decision: &'a Decision,
    ) -> StoreFuture<'a, Result<(), DecideError>> {
        Box::pin(self.decide(run_id, path, decision))
    }

    fn pending_approvals(&self) -> StoreFuture<'_, Vec<PendingGates>> {
        Box::pin(async move {
            Ok(self
                .query(
                    "SELECT r.account, r.workflow, COUNT(*) FROM step_runs s JOIN runs r ON r.id = s.run_id
                     WHERE s.status = 'pending' AND r.status = 'pending_approval'
                     GROUP BY r.account, r.workflow ORDER BY r.account, r.workflow",
                    &[],
                )
                .await?
                .iter()
                .map(|row| PendingGates {
                    account: row.get(0),
                    workflow: row.get(1),
                    gates: row.get::<_, i64>(2) as u64,
                })
                .collect())
        })
    }
}

impl NotificationStore for PostgresStore {
    fn notify<'a>(&'a self, notification: &'a NewNotification<'a>) -> StoreFuture<'a, bool> {
        Box::pin(self.notify(notification))
    }

    fn notifications<'a>(
        &'a self,
        account: &'a str,
        audiences: &'a [String],
        reader: &'a str,
        query: &'a NotificationQuery,
    ) -> StoreFuture<'a, Vec<Notification>> {
        Box::pin(async move {
            self.query(
                "SELECT n.id, n.account, n.kind, n.audience, n.run_id, n.step_path, n.subject,
                        n.message, n.created_ms, r.reader IS NOT NULL
                 FROM notifications n
                 LEFT JOIN notification_reads r ON r.notification_id = n.id AND r.reader = $3
                 WHERE n.account = $1 AND n.audience = ANY($2)
                   AND (NOT $4 OR r.reader IS NULL)
                 ORDER BY n.id DESC
                 LIMIT $5",
                &[
                    &account,
                    &audiences,
                    &reader,
                    &query.unread_only,
                    &sql_limit(query.limit),
                ],
            )
            .await?
            .iter()
            .map(notification_row)
            .collect()
        })
    }

    fn account_notifications<'a>(
        &'a self,
        account: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Notification>> {
        Box::pin(async move {
            self.query(
                "SELECT id, account, kind, audience, run_id, step_path, subject, message,
                        created_ms, false
                 FROM notifications WHERE account = $1 ORDER BY id DESC LIMIT $2",
                &[&account, &sql_limit(limit)],
            )
            .await?
            .iter()
            .map(notification_row)
            .collect()
        })
    }

    fn mark_read<'a>(
        &'a self,
        account: &'a str,
        reader: &'a str,
        ids: &'a [i64],
    ) -> StoreFuture<'a, usize> {
        Box::pin(self.mark_read(account, reader, ids))
    }

    /// Hands out what is due to this process: each entry goes to one
    /// process at a time (see the module doc).
    fn to_mail(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<Outgoing>> {
        Box::pin(self.to_mail(now_ms, limit))
    }

    fn mailed<'a>(&'a self, id: i64, reached: &'a [String], next: MailNext) -> StoreFuture<'a, ()> {
        Box::pin(self.mailed(id, reached, next))
    }
}

/// One run's journal on PostgreSQL: the stores' shared journal over this
/// store, fenced by the epoch it opened in (see the module doc).
pub type PostgresJournal = StoreJournal<PostgresStore>;

impl PostgresJournal {
    /// Opens a run's journal, in the epoch the run is in now. With
    /// `Durability::Approval`, step records are persisted only by `flush`.
    pub async fn open(
        store: &Arc<PostgresStore>,
        run_id: &str,
        durability: Durability,
    ) -> Result<Arc<PostgresJournal>, StoreError> {
        let read_at = Instant::now();
        // What is left of the lease, not a whole one from now: the claim
        // that gave the run to this process came before this read, maybe
        // long before (a process stopped between the two), and the lease
        // counts from the claim.
        let row = store
            .query(
                "SELECT account, owner, epoch,
                        GREATEST(0, EXTRACT(EPOCH FROM lease_until - now()) * 1000)::int8
                 FROM runs WHERE id = $1",
                &[&run_id],
            )
            .await?
            .pop();
        let (account, owner, epoch, left_ms) = match row {
            Some(row) => (
                row.get(0),
                row.get::<_, Option<String>>(1),
                row.get(2),
                row.get::<_, Option<i64>>(3).unwrap_or(0),
            ),
            None => (NO_ACCOUNT.to_string(), None, 0, 0),
        };
        let records = store.step_records(run_id).await?;
        let run = RunHandle {
            id: run_id.to_string(),
            account,
            epoch,
        };
        let held = owner.as_deref() == Some(store.owner.as_str());
        let left = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)).min(store.lease);
        let hold = Hold::new(held, Some(read_at + left * 9 / 10));
        Ok(Arc::new(StoreJournal::new(
            Arc::clone(store),
            run,
            hold,
            records,
            durability,
        )))
    }
}

impl PostgresStore {
    /// In `tx`: fails with `LeaseLost` unless `run` is still this process's
    /// in its journal's epoch, holding a share lock on its row until `tx`
    /// ends, so that no claim comes between.
    async fn fence(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        run: &RunHandle,
    ) -> Result<(), StoreError> {
        let live = tx
            .query_opt(
                "SELECT 1 FROM runs WHERE id = $1 AND owner = $2 AND epoch = $3 FOR SHARE",
                &[&run.id, &self.owner, &run.epoch],
            )
            .await?;
        match live {
            Some(_) => Ok(()),
            None => Err(StoreError::LeaseLost),
        }
    }

    async fn kb_context(
        &self,
        run: &RunHandle,
        ids: &[String],
        department: Option<&str>,
        terms: &[String],
        limit: usize,
    ) -> Result<Vec<KbDocument>, StoreError> {
        let client = self.client().await?;
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut found: Vec<KbDocument> = Vec::new();
        if !terms.is_empty() {
            // Plain words joined by `|`: to_tsquery reads no syntax from them.
            let query = terms.join(" | ");
            found = client
                .query(
                    "SELECT collection, title, version, content FROM kb_documents
                     WHERE account = $1
                       AND (collection = ANY($2) OR collection || '/' || title = ANY($2)
                            OR department = $5)
                       AND search @@ to_tsquery('simple', $3)
                     ORDER BY ts_rank(search, to_tsquery('simple', $3)) DESC, collection, title
                     LIMIT $4",
                    &[&run.account, &ids, &query, &sql_limit(limit), &department],
                )
                .await?
                .iter()
                .map(kb_row)
                .collect();
        }
        if found.len() < limit {
            let others = client
                .query(
                    "SELECT collection, title, version, content FROM kb_documents
                     WHERE account = $1
                       AND (collection = ANY($2) OR collection || '/' || title = ANY($2)
                            OR department = $4)
                     ORDER BY collection, title
                     LIMIT $3",
                    &[&run.account, &ids, &sql_limit(limit), &department],
                )
                .await?
                .iter()
                .map(kb_row)
                .collect();
            found = crate::kb::merged(&found, others);
            found.truncate(limit);
        }
        Ok(found)
    }

    async fn kb_write(&self, run: &RunHandle, write: &KbWrite) -> Result<Value, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        self.fence(&tx, run).await?;
        let result = write_document(&tx, &run.account, write).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// A document written outside any run (a destination's), so unfenced.
    async fn account_document(&self, account: &str, write: &KbWrite) -> Result<Value, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let result = write_document(&tx, account, write).await?;
        tx.commit().await?;
        Ok(result)
    }

    async fn note_delivery(&self, run_id: &str, change: &RunChange) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        append_history(&tx, run_id, change).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn handoff(&self, run: &RunHandle, handoff: &Handoff) -> Result<(), StoreError> {
        let note = NewNotification {
            account: &run.account,
            kind: NotificationKind::Handoff,
            audience: &handoff.department,
            run_id: &handoff.run_id,
            step_path: None,
            subject: handoff.subject.as_deref(),
            message: &handoff.message,
            key: handoff.key.as_deref(),
        };
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        self.fence(&tx, run).await?;
        insert_notification(&tx, &note).await?;
        tx.commit().await?;
        Ok(())
    }
}

impl JournalBackend for PostgresStore {
    fn lease(&self) -> Option<Duration> {
        Some(self.lease)
    }

    fn write(&self, run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()> {
        PostgresStore::append(self, run, write)
    }

    /// Renewed with the other runs' heartbeats, in one statement (see
    /// `lease`).
    fn renew<'a>(&'a self, run: &'a RunHandle, active: Duration) -> StoreFuture<'a, bool> {
        let (reply, answer) = oneshot::channel();
        let queued = self.renewals.send(Renewal {
            run: run.clone(),
            active_ms: active.as_millis() as i64,
            reply,
        });
        Box::pin(async move {
            queued.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
        })
    }

    fn kb_write<'a>(&'a self, run: &'a RunHandle, write: &'a KbWrite) -> StoreFuture<'a, Value> {
        Box::pin(PostgresStore::kb_write(self, run, write))
    }

    fn kb_context<'a>(
        &'a self,
        run: &'a RunHandle,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> StoreFuture<'a, Vec<KbDocument>> {
        Box::pin(PostgresStore::kb_context(
            self, run, ids, department, terms, limit,
        ))
    }

    fn handoff<'a>(&'a self, run: &'a RunHandle, handoff: &'a Handoff) -> StoreFuture<'a, ()> {
        Box::pin(PostgresStore::handoff(self, run, handoff))
    }
}

#[cfg(test)]
mod tests {
    use super::split_location;
    use crate::tls::TlsMode;

    /// The URL tokio-postgres is given and the schema, of `location`.
    fn split(location: &str) -> (String, Option<String>) {
        let location = split_location(location).unwrap();
        (location.url, location.schema)
    }

    #[test]
    fn the_schema_parameter_is_taken_out_of_the_url() {
        assert_eq!(
            split("postgres://u@h/db?schema=flow_a&connect_timeout=5"),
            (
                "postgres://u@h/db?connect_timeout=5".to_string(),
                Some("flow_a".to_string())
            )
        );
        assert_eq!(
            split("postgres://u@h/db?schema=flow_a"),
            ("postgres://u@h/db".to_string(), Some("flow_a".to_string()))
        );
        assert_eq!(
            split("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), None)
        );
        assert!(split_location("postgres://u@h/db?schema=Flow;drop").is_err());
        assert!(split_location("postgres://u@h/db?schema=").is_err());
    }

    /// libpq's TLS words, which tokio-postgres partly lacks, are read here.
    #[test]
    fn the_tls_parameters_are_taken_out_of_the_url() {
        let location = split_location(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(location.url, "postgres://u@h/db?application_name=x");
        assert_eq!(location.tls.mode, TlsMode::VerifyFull);
        assert_eq!(location.tls.root_cert, Some("/ca.pem".into()));
        assert_eq!(
            split_location("postgres://u@h/db").unwrap().tls.mode,
            TlsMode::Disable
        );
        assert!(split_location("postgres://u@h/db?sslmode=verify").is_err());
    }
}
