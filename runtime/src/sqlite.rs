//! The embedded store: SQLite in WAL mode with `synchronous=FULL`.
//!
//! One writer thread owns the write connection. Step records from every run
//! in the process queue to it; it takes all that are waiting, writes them in
//! one transaction and commits once (one fsync), then answers each caller. A
//! step's record is therefore durable before the run goes on to a dependent
//! step, at the cost of one fsync per batch rather than per step.
//!
//! Reads for a replay happen once per run (`RunJournal::open` loads the run's
//! records); later lookups are answered from that copy, which the run's own
//! writes keep current.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};

use flow_plan::Plan;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::interp::{
    BoxFuture, Effects, ErrorKind, Handoff, Journal, KbWrite, StepError, StepRecord, StepStatus,
};
use crate::interp::{DecideError, Decision, decide_record};
use crate::store::{Deployment, RunLog, RunRow, RunStatus, Store, StoreError, StoreFuture};

impl rusqlite::types::ToSql for RunStatus {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl rusqlite::types::FromSql for RunStatus {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let name = value.as_str()?;
        RunStatus::parse(name).ok_or_else(|| {
            rusqlite::types::FromSqlError::Other(format!("unknown run status `{name}`").into())
        })
    }
}

/// Schema migrations, applied in order; `PRAGMA user_version` counts them.
const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE plans (
        hash TEXT PRIMARY KEY,
        json TEXT NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow TEXT NOT NULL,
        plan_hash TEXT NOT NULL REFERENCES plans(hash),
        status TEXT NOT NULL,
        input TEXT NOT NULL,
        outcome TEXT,
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE INDEX runs_by_status ON runs(status);
    CREATE TABLE step_runs (
        run_id TEXT NOT NULL REFERENCES runs(id),
        path TEXT NOT NULL,
        status TEXT NOT NULL,
        record TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (run_id, path)
    );
    CREATE TABLE kb_documents (
        collection TEXT NOT NULL,
        title TEXT NOT NULL,
        version INTEGER NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT,
        PRIMARY KEY (collection, title)
    );
    CREATE VIRTUAL TABLE kb_search USING fts5(collection, title, content);
    CREATE TABLE kb_keys (
        key TEXT PRIMARY KEY,
        result TEXT NOT NULL
    );
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        department TEXT NOT NULL,
        subject TEXT,
        message TEXT NOT NULL,
        key TEXT UNIQUE,
        created_ms INTEGER NOT NULL
    );
"#,
    // The active time a run has used, for the workflow's timeout across resumes.
    "ALTER TABLE runs ADD COLUMN active_ms INTEGER NOT NULL DEFAULT 0;",
    // Which process is executing a run (see `claim_run`).
    "ALTER TABLE runs ADD COLUMN owner TEXT;
     CREATE INDEX step_runs_by_seq ON step_runs(seq);",
    // Whose a run is (flowd's accounts; runs of the local CLI have none), and
    // the workflows each account has deployed, by version.
    "ALTER TABLE runs ADD COLUMN account TEXT NOT NULL DEFAULT '';
     CREATE INDEX runs_by_account ON runs(account, created_ms);
     CREATE TABLE deployments (
         account TEXT NOT NULL,
         workflow TEXT NOT NULL,
         version INTEGER NOT NULL,
         plan_hash TEXT NOT NULL REFERENCES plans(hash),
         created_ms INTEGER NOT NULL,
         PRIMARY KEY (account, workflow, version)
     );",
];

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> StoreError {
        StoreError(error.to_string())
    }
}

fn store_error(error: StoreError) -> StepError {
    StepError::new(ErrorKind::Server, format!("store: {error}"))
}

type Reply = oneshot::Sender<Result<(), StoreError>>;

/// A decision on an approval, applied by the writer.
struct Decide {
    run_id: String,
    path: String,
    decision: Decision,
}

/// The writer's queue: one item's worth of work each, answered after the
/// commit that made it durable (or with why it could not apply).
enum Write {
    Step {
        run_id: String,
        record: Box<StepRecord>,
        reply: Reply,
    },
    Decide {
        decision: Decide,
        reply: Reply,
    },
    /// A run's row written with the journal's commits: one fsync serves many
    /// run starts and ends. Answers the number of rows changed.
    Statement {
        sql: &'static str,
        params: Vec<rusqlite::types::Value>,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
}

impl Write {
    fn reply(self, result: Result<usize, StoreError>) {
        // A caller that went away no longer needs the answer.
        match self {
            Write::Step { reply, .. } | Write::Decide { reply, .. } => {
                let _ = reply.send(result.map(|_| ()));
            }
            Write::Statement { reply, .. } => {
                let _ = reply.send(result);
            }
        }
    }
}

pub struct SqliteStore {
    queue: Mutex<Sender<Write>>,
    /// For the writes that are not the writer's: claims, deployments,
    /// cancels, effects. They are few per run.
    conn: Mutex<Connection>,
    /// Idle read connections. In WAL mode a reader sees every committed
    /// write and never waits for a writer, so reads (the API's above all)
    /// do not queue behind `conn`.
    readers: Mutex<Vec<Connection>>,
    path: std::path::PathBuf,
}

/// A read connection, back in the pool when dropped.
struct Reader<'a> {
    store: &'a SqliteStore,
    conn: Option<Connection>,
}

impl std::ops::Deref for Reader<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a reader holds its connection until dropped")
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        const IDLE: usize = 8;
        let mut idle = lock(&self.store.readers);
        if let Some(conn) = self.conn.take()
            && idle.len() < IDLE
        {
            idle.push(conn);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every write transaction begins `IMMEDIATE`: in WAL mode a transaction that
/// reads first and then writes cannot wait for another writer (SQLite answers
/// "database is locked" at once), while one that takes the write lock first
/// waits up to the busy timeout.
fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    // First, so that the pragmas below wait for another process too.
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// Runs `body` in a `BEGIN IMMEDIATE` transaction on `conn`: committed when
/// it succeeds, rolled back when it fails.
fn in_immediate<T>(
    conn: &Connection,
    body: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match body() {
        Ok(value) => {
            conn.execute_batch("COMMIT")?;
            Ok(value)
        }
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

/// This process, as the owner of the runs it executes: its pid and start time.
fn owner() -> &'static str {
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWNER.get_or_init(|| format!("{}:{}", std::process::id(), now_ms()))
}

/// Whether the process that owns a run is still alive, on this machine. The
/// embedded store is local to one machine, so a pid is enough; flowd's
/// shared stores will use leases instead.
fn owner_alive(owner: &str) -> bool {
    if owner == self::owner() {
        return true;
    }
    let pid = owner
        .split(':')
        .next()
        .and_then(|pid| pid.parse::<u32>().ok());
    // A container starts its process with the same pid every time: an owner
    // with this process's pid but another start time is a previous life.
    pid.is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn status_name(status: StepStatus) -> &'static str {
    match status {
        StepStatus::Completed => "completed",
        StepStatus::Failed => "failed",
        StepStatus::Pending => "pending",
    }
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Arc<SqliteStore>, StoreError> {
        let conn = open(path)?;
        // Several processes may open a new store at once: the version is read
        // and the migrations applied under one write lock.
        in_immediate(&conn, || {
            let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
            if version as usize > MIGRATIONS.len() {
                return Err(StoreError(format!(
                    "{} was written by a newer flow (schema version {version}, this one knows {})",
                    path.display(),
                    MIGRATIONS.len()
                )));
            }
            for migration in MIGRATIONS.iter().skip(version as usize) {
                conn.execute_batch(migration)?;
            }
            conn.pragma_update(None, "user_version", MIGRATIONS.len() as i64)?;
            Ok(())
        })?;
        let writer = open(path)?;
        let (sender, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("flow-journal-writer".into())
            .spawn(move || write_batches(writer, receiver))
            .map_err(|e| StoreError(format!("cannot start the journal writer: {e}")))?;
        Ok(Arc::new(SqliteStore {
            queue: Mutex::new(sender),
            conn: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            path: path.to_path_buf(),
        }))
    }

    /// A read connection from the pool, or a new one.
    fn reader(&self) -> Result<Reader<'_>, StoreError> {
        let idle = lock(&self.readers).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open(&self.path)?,
        };
        Ok(Reader {
            store: self,
            conn: Some(conn),
        })
    }
}

impl SqliteStore {
    /// Keeps a plan (once per hash) so that every live run's plan stays available.
    pub fn put_plan(&self, plan: &Plan) -> Result<(), StoreError> {
        lock(&self.conn).execute(
            "INSERT OR IGNORE INTO plans (hash, json) VALUES (?1, ?2)",
            params![
                plan.hash,
                serde_json::to_string(plan).map_err(|e| StoreError(e.to_string()))?
            ],
        )?;
        Ok(())
    }

    pub fn plan(&self, hash: &str) -> Result<Plan, StoreError> {
        let json: String = self
            .reader()?
            .query_row("SELECT json FROM plans WHERE hash = ?1", [hash], |row| {
                row.get(0)
            })
            .optional()?
            .ok_or_else(|| StoreError(format!("no plan {hash} in the store")))?;
        Plan::from_json(&json).map_err(|e| StoreError(e.to_string()))
    }

    pub fn create_run(
        &self,
        id: &str,
        account: &str,
        workflow: &str,
        plan_hash: &str,
        input: &Value,
    ) -> StoreFuture<'static, ()> {
        let now = now_ms();
        let written = self.statement(
            "INSERT INTO runs (id, workflow, plan_hash, status, input, created_ms, updated_ms, owner, account)
             VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?5, ?6, ?7)",
            vec![
                id.to_string().into(),
                workflow.to_string().into(),
                plan_hash.to_string().into(),
                input.to_string().into(),
                now.into(),
                owner().to_string().into(),
                account.to_string().into(),
            ],
        );
        Box::pin(async move { written.await.map(|_| ()) })
    }

    /// Queues a statement for the journal writer's next commit.
    fn statement(
        &self,
        sql: &'static str,
        params: Vec<rusqlite::types::Value>,
    ) -> StoreFuture<'static, usize> {
        let (reply, answer) = oneshot::channel();
        let queued = lock(&self.queue).send(Write::Statement { sql, params, reply });
        Box::pin(async move {
            queued.map_err(|_| StoreError("the journal writer has stopped".into()))?;
            answer
                .await
                .map_err(|_| StoreError("the journal writer has stopped".into()))?
        })
    }

    /// Takes the run for this process if its status is one of `from`; a run
    /// that another live process is executing is not taken. Only the owner
    /// resumes a run and records how it ended, so two processes never run the
    /// same run at once.
    pub fn claim_run(&self, id: &str, from: &[RunStatus]) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let row: Option<(RunStatus, Option<String>)> = conn
                .query_row(
                    "SELECT status, owner FROM runs WHERE id = ?1",
                    [id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let Some((status, current)) = row else {
                return Ok(false);
            };
            let live_elsewhere = status == RunStatus::Running
                && current
                    .as_deref()
                    .is_some_and(|o| o != owner() && owner_alive(o));
            if !from.contains(&status) || live_elsewhere {
                return Ok(false);
            }
            conn.execute(
                "UPDATE runs SET status = 'running', owner = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, owner(), now_ms()],
            )?;
            Ok(true)
        })
    }

    /// Adds active time to a run this process owns, while it executes, so that
    /// a crash loses at most the time since the last call.
    pub fn add_active(&self, id: &str, active: std::time::Duration) -> StoreFuture<'static, ()> {
        let written = self.statement(
            "UPDATE runs SET active_ms = active_ms + ?2 WHERE id = ?1 AND owner = ?3",
            vec![
                id.to_string().into(),
                (active.as_millis() as i64).into(),
                owner().to_string().into(),
            ],
        );
        Box::pin(async move { written.await.map(|_| ()) })
    }

    /// Records how an invocation of the run ended and the active time it used.
    pub fn finish_run(
        &self,
        id: &str,
        status: RunStatus,
        outcome: &Value,
        active: std::time::Duration,
    ) -> StoreFuture<'static, bool> {
        let written = self.statement(
            "UPDATE runs SET status = ?2, outcome = ?3, updated_ms = ?4, active_ms = active_ms + ?5, owner = NULL
             WHERE id = ?1 AND owner = ?6",
            vec![
                id.to_string().into(),
                status.as_str().to_string().into(),
                outcome.to_string().into(),
                now_ms().into(),
                (active.as_millis() as i64).into(),
                owner().to_string().into(),
            ],
        );
        Box::pin(async move { written.await.map(|changed| changed == 1) })
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self.reader()?
            .query_row(
                "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account FROM runs WHERE id = ?1",
                [id],
                run_row,
            )
            .optional()?)
    }

    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare(
            "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account FROM runs ORDER BY created_ms, id",
        )?;
        let rows = statement
            .query_map([], run_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn step_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let conn = self.reader()?;
        let mut statement =
            conn.prepare("SELECT record FROM step_runs WHERE run_id = ?1 ORDER BY seq")?;
        let records = statement
            .query_map([run_id], |row| row.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        records
            .iter()
            .map(|json| {
                serde_json::from_str(json)
                    .map_err(|e| StoreError(format!("a damaged step record: {e}")))
            })
            .collect()
    }

    /// Decides the approval pending at `path` of run `run_id`, exactly once:
    /// decisions go through the journal writer, which applies them one after
    /// another (a decided record is no longer pending) and commits them in
    /// groups, so that many decisions share an fsync.
    pub fn decide<'a>(
        &'a self,
        run_id: &'a str,
        path: &'a str,
        decision: &'a Decision,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (reply, answer) = oneshot::channel();
        let decision = Decide {
            run_id: run_id.to_string(),
            path: path.to_string(),
            decision: decision.clone(),
        };
        let queued = lock(&self.queue).send(Write::Decide { decision, reply });
        Box::pin(async move {
            queued.map_err(|_| StoreError("the journal writer has stopped".into()))?;
            answer
                .await
                .map_err(|_| StoreError("the journal writer has stopped".into()))?
        })
    }

    pub fn cancel_run(&self, id: &str) -> Result<bool, StoreError> {
        let changed = lock(&self.conn).execute(
            "UPDATE runs SET status = 'cancelled', owner = NULL, updated_ms = ?2
             WHERE id = ?1 AND status IN ('running', 'pending_approval')",
            params![id, now_ms()],
        )?;
        Ok(changed == 1)
    }

    pub fn deploy(
        &self,
        account: &str,
        workflow: &str,
        plan_hash: &str,
    ) -> Result<Deployment, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let latest: Option<(u32, String, i64)> = conn
                .query_row(
                    "SELECT version, plan_hash, created_ms FROM deployments
                     WHERE account = ?1 AND workflow = ?2 ORDER BY version DESC LIMIT 1",
                    params![account, workflow],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            if let Some((version, hash, created_ms)) = &latest
                && hash == plan_hash
            {
                return Ok(Deployment {
                    workflow: workflow.to_string(),
                    version: *version,
                    plan_hash: hash.clone(),
                    created_ms: *created_ms,
                });
            }
            let version = latest.map_or(1, |(version, ..)| version + 1);
            let created_ms = now_ms();
            conn.execute(
                "INSERT INTO deployments (account, workflow, version, plan_hash, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![account, workflow, version, plan_hash, created_ms],
            )?;
            Ok(Deployment {
                workflow: workflow.to_string(),
                version,
                plan_hash: plan_hash.to_string(),
                created_ms,
            })
        })
    }

    pub fn deployments(&self, account: &str) -> Result<Vec<Deployment>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare(
            "SELECT workflow, version, plan_hash, created_ms FROM deployments
             WHERE account = ?1 ORDER BY workflow, version",
        )?;
        let rows = statement
            .query_map([account], |row| {
                Ok(Deployment {
                    workflow: row.get(0)?,
                    version: row.get(1)?,
                    plan_hash: row.get(2)?,
                    created_ms: row.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Notifications recorded by handoffs, newest last.
    pub fn notifications(&self) -> Result<Vec<Handoff>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare(
            "SELECT run_id, department, message, subject, key FROM notifications ORDER BY id",
        )?;
        let rows = statement
            .query_map([], |row| {
                Ok(Handoff {
                    run_id: row.get(0)?,
                    department: row.get(1)?,
                    message: row.get(2)?,
                    subject: row.get(3)?,
                    key: row.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

/// The trait over the inherent methods. SQLite answers at once (its calls
/// take a local lock and, for writes other than the journal's, one commit),
/// so each future is ready when returned.
impl Store for SqliteStore {
    fn put_plan<'a>(&'a self, plan: &'a Plan) -> StoreFuture<'a, ()> {
        ready(self.put_plan(plan))
    }

    fn plan<'a>(&'a self, hash: &'a str) -> StoreFuture<'a, Plan> {
        ready(self.plan(hash))
    }

    fn create_run<'a>(
        &'a self,
        id: &'a str,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
        input: &'a Value,
    ) -> StoreFuture<'a, ()> {
        self.create_run(id, account, workflow, plan_hash, input)
    }

    fn claim_run<'a>(&'a self, id: &'a str, from: &'a [RunStatus]) -> StoreFuture<'a, bool> {
        ready(self.claim_run(id, from))
    }

    fn add_active<'a>(&'a self, id: &'a str, active: std::time::Duration) -> StoreFuture<'a, ()> {
        self.add_active(id, active)
    }

    fn finish_run<'a>(
        &'a self,
        id: &'a str,
        status: RunStatus,
        outcome: &'a Value,
        active: std::time::Duration,
    ) -> StoreFuture<'a, bool> {
        self.finish_run(id, status, outcome, active)
    }

    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        ready(self.run(id))
    }

    fn runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        ready(self.runs())
    }

    fn step_records<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        ready(self.step_records(run_id))
    }

    fn decide<'a>(
        &'a self,
        run_id: &'a str,
        path: &'a str,
        decision: &'a Decision,
    ) -> StoreFuture<'a, ()> {
        self.decide(run_id, path, decision)
    }

    fn cancel_run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        ready(self.cancel_run(id))
    }

    fn deploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
    ) -> StoreFuture<'a, Deployment> {
        ready(self.deploy(account, workflow, plan_hash))
    }

    fn deployments<'a>(&'a self, account: &'a str) -> StoreFuture<'a, Vec<Deployment>> {
        ready(self.deployments(account))
    }

    fn notifications(&self) -> StoreFuture<'_, Vec<Handoff>> {
        ready(self.notifications())
    }

    fn open_journal<'a>(
        self: Arc<Self>,
        run_id: &'a str,
        durability: flow_plan::Durability,
    ) -> StoreFuture<'a, Arc<dyn RunLog>> {
        let journal = RunJournal::open(&self, run_id, durability);
        ready(journal.map(|journal| journal as Arc<dyn RunLog>))
    }
}

fn ready<'a, T: Send + 'a>(result: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(result))
}

impl SqliteStore {
    fn append(
        &self,
        run_id: &str,
        record: StepRecord,
    ) -> BoxFuture<'static, Result<(), StepError>> {
        let (reply, answer) = oneshot::channel();
        let sent = lock(&self.queue).send(Write::Step {
            run_id: run_id.to_string(),
            record: Box::new(record),
            reply,
        });
        Box::pin(async move {
            if sent.is_err() {
                return Err(store_error(StoreError(
                    "the journal writer has stopped".into(),
                )));
            }
            match answer.await {
                Ok(result) => result.map_err(store_error),
                Err(_) => Err(store_error(StoreError(
                    "the journal writer has stopped".into(),
                ))),
            }
        })
    }
}

fn run_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    let input: String = row.get(4)?;
    let outcome: Option<String> = row.get(5)?;
    Ok(RunRow {
        id: row.get(0)?,
        workflow: row.get(1)?,
        plan_hash: row.get(2)?,
        status: row.get(3)?,
        input: serde_json::from_str(&input).unwrap_or(Value::Null),
        outcome: outcome.and_then(|o| serde_json::from_str(&o).ok()),
        created_ms: row.get(6)?,
        updated_ms: row.get(7)?,
        active_ms: row.get(8)?,
        account: row.get(9)?,
    })
}

/// The writer thread: group commit of step records until every sender is gone.
fn write_batches(mut conn: Connection, queue: Receiver<Write>) {
    const MAX_BATCH: usize = 4096;
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        match write_batch(&mut conn, &batch) {
            Ok(results) => {
                for (write, result) in batch.into_iter().zip(results) {
                    write.reply(result);
                }
            }
            Err(error) => {
                let error = StoreError::from(error);
                for write in batch {
                    write.reply(Err(error.clone()));
                }
            }
        }
    }
}

/// Writes a batch in one transaction. A database error fails the whole batch;
/// a decision that cannot apply (not pending, not an approver) or a statement
/// that breaks a constraint fails alone.
fn write_batch(
    conn: &mut Connection,
    batch: &[Write],
) -> rusqlite::Result<Vec<Result<usize, StoreError>>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut results = Vec::with_capacity(batch.len());
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO step_runs (run_id, path, status, record, seq)
             VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(seq), 0) + 1 FROM step_runs))
             ON CONFLICT (run_id, path) DO UPDATE SET status = excluded.status, record = excluded.record
             WHERE step_runs.status = 'pending'",
        )?;
        for write in batch {
            match write {
                Write::Step { run_id, record, .. } => {
                    let json = serde_json::to_string(record).unwrap_or_default();
                    insert.execute(params![
                        run_id,
                        record.path,
                        status_name(record.status),
                        json
                    ])?;
                    results.push(Ok(1));
                }
                Write::Decide { decision, .. } => {
                    results.push(apply_decision(&tx, decision)?.map(|()| 1));
                }
                // A statement that fails (a run id taken twice) fails alone:
                // SQLite undoes that statement and the transaction goes on.
                Write::Statement { sql, params, .. } => {
                    let result = tx.execute(sql, rusqlite::params_from_iter(params.iter()));
                    // Some errors (disk full, I/O) roll the whole transaction
                    // back, not just the statement: then the batch fails.
                    match result {
                        Err(error) if tx.is_autocommit() => return Err(error),
                        result => results.push(result.map_err(StoreError::from)),
                    }
                }
            }
        }
    }
    tx.commit()?;
    Ok(results)
}

fn apply_decision(
    tx: &rusqlite::Transaction<'_>,
    decide: &Decide,
) -> rusqlite::Result<Result<(), StoreError>> {
    let Decide {
        run_id,
        path,
        decision,
    } = decide;
    let run_status: Option<RunStatus> = tx
        .query_row("SELECT status FROM runs WHERE id = ?1", [run_id], |row| {
            row.get(0)
        })
        .optional()?;
    if !matches!(
        run_status,
        Some(RunStatus::PendingApproval | RunStatus::Running)
    ) {
        let error = DecideError::RunEnded {
            run_id: run_id.clone(),
            status: run_status.map_or("unknown", RunStatus::as_str).into(),
        };
        return Ok(Err(StoreError(error.to_string())));
    }
    let record: Option<String> = tx
        .query_row(
            "SELECT record FROM step_runs WHERE run_id = ?1 AND path = ?2",
            params![run_id, path],
            |row| row.get(0),
        )
        .optional()?;
    let record = record.and_then(|json| serde_json::from_str::<StepRecord>(&json).ok());
    let decided = match decide_record(record.as_ref(), path, decision, now_ms() as u64) {
        Ok(decided) => decided,
        Err(error) => return Ok(Err(StoreError(error.to_string()))),
    };
    tx.execute(
        "UPDATE step_runs SET status = ?3, record = ?4 WHERE run_id = ?1 AND path = ?2",
        params![
            run_id,
            path,
            status_name(decided.status),
            serde_json::to_string(&decided).unwrap_or_default()
        ],
    )?;
    Ok(Ok(()))
}

/// One run's view of the store: its journal (loaded once for replay) and the
/// store's effects.
pub struct RunJournal {
    store: Arc<SqliteStore>,
    run_id: String,
    records: Mutex<HashMap<String, StepRecord>>,
    /// `durability approval`: records wait here until `flush`, at a pause or
    /// at the end of the run, instead of being committed one batch at a time.
    deferred: Option<Mutex<Vec<StepRecord>>>,
}

impl RunJournal {
    /// Opens a run's journal. With `Durability::Approval`, step records are
    /// persisted only by `flush`: a crash loses the progress since the last
    /// pause, which the workflow chose in exchange for fewer commits.
    pub fn open(
        store: &Arc<SqliteStore>,
        run_id: &str,
        durability: flow_plan::Durability,
    ) -> Result<Arc<RunJournal>, StoreError> {
        let records = store
            .step_records(run_id)?
            .into_iter()
            .map(|record| (record.path.clone(), record))
            .collect();
        Ok(Arc::new(RunJournal {
            store: Arc::clone(store),
            run_id: run_id.to_string(),
            records: Mutex::new(records),
            deferred: (durability == flow_plan::Durability::Approval)
                .then(|| Mutex::new(Vec::new())),
        }))
    }
}

impl RunLog for RunJournal {
    fn flush(&self) -> BoxFuture<'_, Result<(), StepError>> {
        let writes: Vec<_> = match &self.deferred {
            Some(deferred) => std::mem::take(&mut *lock(deferred))
                .into_iter()
                .map(|record| self.store.append(&self.run_id, record))
                .collect(),
            None => Vec::new(),
        };
        Box::pin(async move {
            for write in writes {
                write.await?;
            }
            Ok(())
        })
    }
}

impl Journal for RunJournal {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        lock(&self.records).get(path).cloned()
    }

    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        lock(&self.records).insert(record.path.clone(), record.clone());
        match &self.deferred {
            Some(deferred) => {
                lock(deferred).push(record);
                Box::pin(async { Ok(()) })
            }
            None => self.store.append(&self.run_id, record),
        }
    }
}

impl Effects for RunJournal {
    fn kb_write<'a>(&'a self, write: &'a KbWrite) -> BoxFuture<'a, Result<Value, StepError>> {
        let result = (|| -> Result<Value, StoreError> {
            let mut conn = lock(&self.store.conn);
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(key) = &write.key {
                let first: Option<String> = tx
                    .query_row("SELECT result FROM kb_keys WHERE key = ?1", [key], |row| row.get(0))
                    .optional()?;
                if let Some(first) = first {
                    return serde_json::from_str(&first).map_err(|e| StoreError(e.to_string()));
                }
            }
            let version: i64 = tx.query_row(
                "INSERT INTO kb_documents (collection, title, version, content, metadata) VALUES (?1, ?2, 1, ?3, ?4)
                 ON CONFLICT (collection, title) DO UPDATE SET version = version + 1, content = excluded.content, metadata = excluded.metadata
                 RETURNING version",
                params![write.collection, write.title, write.content, write.metadata.as_ref().map(Value::to_string)],
                |row| row.get(0),
            )?;
            tx.execute(
                "DELETE FROM kb_search WHERE collection = ?1 AND title = ?2",
                params![write.collection, write.title],
            )?;
            tx.execute(
                "INSERT INTO kb_search (collection, title, content) VALUES (?1, ?2, ?3)",
                params![write.collection, write.title, write.content],
            )?;
            let result = json!({ "id": format!("{}/{}", write.collection, write.title), "version": version });
            if let Some(key) = &write.key {
                tx.execute(
                    "INSERT INTO kb_keys (key, result) VALUES (?1, ?2)",
                    params![key, result.to_string()],
                )?;
            }
            tx.commit()?;
            Ok(result)
        })()
        .map_err(store_error);
        Box::pin(async move { result })
    }

    fn handoff<'a>(&'a self, handoff: &'a Handoff) -> BoxFuture<'a, Result<(), StepError>> {
        let result = lock(&self.store.conn)
            .execute(
                "INSERT OR IGNORE INTO notifications (run_id, department, subject, message, key, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![handoff.run_id, handoff.department, handoff.subject, handoff.message, handoff.key, now_ms()],
            )
            .map(|_| ())
            .map_err(|e| store_error(e.into()));
        Box::pin(async move { result })
    }
}
