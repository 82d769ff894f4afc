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

use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use flow_plan::{Plan, StepKind};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::approval::{DecideError, Decision, PendingApproval, decide_record, gate_due_ms};
use crate::journal::{StepRecord, StepStatus};
use crate::services::{Handoff, KbDocument, KbWrite};
use crate::store::record::EncodedWrite;
use crate::store::{
    ApprovalStore, DELETE_AFTER_CANCEL_MS, Deletion, Deployment, DueEvents, EVENT_CLAIM, EventNext,
    EventStore, EventsOf, JournalBackend, JournalWrite, KbQuery, KbStore, MAX_REDRIVES, MailNext,
    NO_ACCOUNT, NewNotification, NewRun, Notification, NotificationKind, NotificationQuery,
    NotificationStore, Outgoing, PendingGates, PlanStore, RunEnd, RunEvent, RunHandle, RunLog,
    RunQuery, RunRow, RunStatus, RunStore, StoreError, StoreFuture, StoreJournal,
};
use crate::store::{RunChange, lock, record, sql_limit, sql_ms, status_condition};
use crate::time::now_stored_ms as now_ms;

mod kb;
mod migrations;
mod writer;

use migrations::MIGRATIONS;
use writer::*;

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

/// Adds `change` to the end of run `id`'s history.
fn append_history(conn: &Connection, id: &str, change: &RunChange) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE runs SET history = json_insert(history, '$[#]', json(?2)) WHERE id = ?1",
        params![id, change.to_json()],
    )?;
    Ok(())
}

/// Whether a run with `status`, last changed at `updated_ms`, may be deleted.
fn deletable(status: RunStatus, updated_ms: i64) -> bool {
    match status {
        RunStatus::Cancelled => updated_ms < now_ms() - DELETE_AFTER_CANCEL_MS,
        status => status.has_ended(),
    }
}

/// Deletes run `id`'s rows: its notifications (with their reads and
/// sends), its events not yet delivered, its journal and itself.
fn delete_run_rows(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    for sql in [
        "DELETE FROM notification_reads WHERE notification_id IN (SELECT id FROM notifications WHERE run_id = ?1)",
        "DELETE FROM notification_sends WHERE notification_id IN (SELECT id FROM notifications WHERE run_id = ?1)",
        "DELETE FROM notifications WHERE run_id = ?1",
        "DELETE FROM run_events WHERE run_id = ?1",
        "DELETE FROM step_runs WHERE run_id = ?1",
        "DELETE FROM runs WHERE id = ?1",
    ] {
        conn.prepare_cached(sql)?.execute([id])?;
    }
    Ok(())
}

/// Deletes plan `hash` if no deployment and no run uses it any more.
fn forget_plan(conn: &Connection, hash: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM plans WHERE hash = ?1
           AND NOT EXISTS (SELECT 1 FROM deployments WHERE plan_hash = ?1)
           AND NOT EXISTS (SELECT 1 FROM runs WHERE plan_hash = ?1)",
    )?
    .execute([hash])?;
    Ok(())
}

/// A notification, once per key.
const NOTIFY: &str = "INSERT OR IGNORE INTO notifications
     (account, kind, audience, run_id, step_path, subject, message, key, created_ms)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// Run `?2` if account `?1` owns it. Ownership is read from the covering
/// index: reading the row's `account` would walk the pages of its input and
/// outcome first, so that another account's large run took measurably
/// longer to be refused than a made-up id.
const ACCOUNT_RUN: &str = "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives FROM runs
     WHERE id = (SELECT id FROM runs INDEXED BY runs_by_account_id WHERE account = ?1 AND id = ?2)";

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> StoreError {
        // SQLite's own words ("database is locked") say neither who holds
        // the lock nor that nothing was lost.
        if writer::is_busy(&error) {
            return StoreError::Database(format!(
                "{error}: another process has held the database's write lock for 10 s (a `flow` command or flowd on the same file, a backup, a process stopped mid-write); nothing was changed, try again once it is released"
            ));
        }
        StoreError::Database(error.to_string())
    }
}

/// The async runtime of a process whose store is SQLite: one worker fewer
/// than the machine's cores (at least one), since the journal writer is a
/// thread of its own, busy about half the time under load; as many as
/// `TOKIO_WORKER_THREADS` says when it is set (tokio reads it). With a
/// worker per core, three threads took turns on two cores: B9 on SQLite
/// gave 75,000 - 97,000 steps/s and 13.9 - 19.4 us of flowd's CPU per
/// step, against 108,000 - 115,000 and 11.9 - 12.5 us with one worker
/// (docs/benchmarks.md, "One core for the journal writer").
pub fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime
        .enable_all()
        .thread_stack_size(flow_plan::limits::STACK_BYTES);
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        runtime.worker_threads(cores.saturating_sub(1).max(1));
    }
    runtime.build()
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
    access: Access,
}

/// How a store's connections open its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// To read and write it, made and migrated if need be: every process
    /// that runs or decides.
    ReadWrite,
    /// To read it as it is, for a user who may read the file but not write
    /// it or the folder that holds it (where SQLite keeps the `-wal` and
    /// `-shm` files): `flow runs`, `show`, `approvals` on a store a service
    /// user owns. Every write is refused ("attempt to write a readonly
    /// database").
    ReadOnly,
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

/// A connection to the store at `path` that `access` allows.
///
/// Every write transaction begins `IMMEDIATE`: in WAL mode a transaction that
/// reads first and then writes cannot wait for another writer (SQLite answers
/// "database is locked" at once), while one that takes the write lock first
/// waits up to the busy timeout.
fn open_for(path: &Path, access: Access) -> Result<Connection, rusqlite::Error> {
    let conn = match access {
        Access::ReadWrite => Connection::open(path)?,
        Access::ReadOnly => open_read_only(path)?,
    };
    // First, so that the pragmas below wait for another process too.
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    if access == Access::ReadWrite {
        conn.pragma_update(None, "journal_mode", "WAL")?;
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// The store at `path` has schema `version`, which a newer flow wrote.
fn newer_store(path: &Path, version: i64) -> StoreError {
    StoreError::Unusable(format!(
        "{} was written by a newer flow (schema version {version}, this one knows {})",
        path.display(),
        MIGRATIONS.len()
    ))
}

/// What of the store at `path` this user may not write as SQLite writes
/// one in WAL mode, if anything: its file, and the folder that holds it
/// (where its `-wal` and `-shm` are made) unless both are there and
/// writable, said so that the reader knows which to mend. Asked of the
/// kernel for the effective user before SQLite touches anything: SQLite
/// opens a file it may not write read only without a word, and then made
/// a `-wal` and `-shm` of this user's in a folder it may write, which the
/// store's owner could no longer write (the review of the read-only
/// store). Nothing is opened to ask, as closing a file of the store
/// would release this process's SQLite locks on it.
fn unwritable(path: &Path) -> Option<String> {
    use rustix::fs::{Access as Asked, AtFlags, CWD, accessat};
    let writable = |path: &Path| accessat(CWD, path, Asked::WRITE_OK, AtFlags::EACCESS).is_ok();
    if !path.exists() {
        return None;
    }
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    if !writable(path) {
        return Some(format!("this user may not write {}", path.display()));
    }
    if writable(folder) || (writable(&beside(path, "-wal")) && writable(&beside(path, "-shm"))) {
        return None;
    }
    // Named in full: "the folder ." says little.
    let folder = std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf());
    Some(format!(
        "this user may not write the folder {}, where SQLite makes the store's `-wal` and `-shm` beside {}",
        folder.display(),
        path.display()
    ))
}

/// The file SQLite keeps beside the store at `path`: its `-wal` or `-shm`.
fn beside(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut beside = path.as_os_str().to_owned();
    beside.push(suffix);
    beside.into()
}

/// Whether SQLite refused `error`'s open or write because this user may
/// not write the file, or make files beside it.
fn refuses_writing(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    )
}

/// A connection that reads the store at `path` and never writes it or
/// makes a file beside it. While a process writes the store, its `-wal`
/// and `-shm` are beside it and it is read through them (`mode=ro`;
/// SQLite keeps the index of a `-shm` it may not write in its own memory).
/// Otherwise the last writer folded its `-wal` in and removed it, and
/// `immutable` reads the file alone, without locks; so it does where the
/// writer ended between the look and the open (its first read refused).
/// A writer that starts while an immutable read goes on may make it fail
/// or read rows of before and after it together: SQLite promises nothing
/// of a file that changes, so a command that reads so may be run again.
fn open_read_only(path: &Path) -> Result<Connection, rusqlite::Error> {
    let open = |query: &str| {
        Connection::open_with_flags(
            format!("{}?{query}", file_uri(path)),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                | rusqlite::OpenFlags::SQLITE_OPEN_URI
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    };
    let there = |suffix: &str| beside(path, suffix).exists();
    if there("-wal") && there("-shm") {
        let conn = open("mode=ro")?;
        match conn.pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0)) {
            Ok(_) => return Ok(conn),
            Err(error) if refuses_writing(&error) && !there("-wal") => {}
            Err(error) => return Err(error),
        }
    }
    open("mode=ro&immutable=1")
}

/// `path` as a `file:` URI: absolute (a path that began `//` read as an
/// authority), every byte but the unreserved ones and `/` escaped, so
/// that `?`, `#`, `%` and a name that is not UTF-8 stay the path's.
fn file_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut uri = String::from("file://");
    for &byte in absolute.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri
}

/// Runs `body` in a `BEGIN IMMEDIATE` transaction on `conn`: committed when
/// it succeeds, rolled back when it fails.
fn in_immediate<T>(
    conn: &Connection,
    body: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    committed(conn, body)
}

/// `in_immediate`, the write lock waited for as the journal's writer waits
/// for it (`writer::waiting_out_locks`), for a write nothing else waits on:
/// flowd's start failed with "database is locked" while another process
/// held the lock past the busy timeout (a backup, a stopped peer), where
/// the runs' writes waited. Not for calls on a server's async workers,
/// which it would hold for as long.
fn in_immediate_waiting<T>(
    conn: &Connection,
    body: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    writer::waiting_out_locks("a write", || conn.execute_batch("BEGIN IMMEDIATE"))?;
    committed(conn, body)
}

/// Commits what `body` wrote in the transaction `conn` has open, or rolls
/// it back.
fn committed<T>(
    conn: &Connection,
    body: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    match body() {
        // A COMMIT that fails (a full disk, another process's lock past
        // the busy timeout) may leave the transaction open, and with it
        // the write lock that this process's journal writer waits for.
        Ok(value) => match conn.execute_batch("COMMIT") {
            Ok(()) => Ok(value),
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(error.into())
            }
        },
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

/// This process, as the owner of the runs it executes: its pid and start
/// time, then, where Linux's /proc tells them, when the kernel started it
/// (clock ticks since boot), the boot's id and its pid namespace, by
/// which another process tells a live owner from one whose pid was reused.
fn owner() -> &'static str {
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWNER.get_or_init(|| {
        let mut owner = format!("{}:{}", std::process::id(), now_ms());
        let this = Kernel::now();
        if let (Some(started), Some(boot), Some(namespace)) = (
            process_state("self").and_then(|(_, started)| started),
            &this.boot,
            &this.namespace,
        ) {
            owner.push_str(&format!(":{started}:{boot}:{namespace}"));
        }
        owner
    })
}

/// Whether the process that owns a run is still alive, on this machine. The
/// embedded store is local to one machine, so a pid is enough; the
/// PostgreSQL store, shared across machines, uses leases instead.
fn owner_alive(owner: &str) -> bool {
    if owner == self::owner() {
        return true;
    }
    let mut fields = owner.split(':');
    let Some(pid) = fields.next().and_then(|pid| pid.parse::<u32>().ok()) else {
        return false;
    };
    // A container starts its process with the same pid every time: an owner
    // with this process's pid but another start time is a previous life.
    if pid == std::process::id() {
        return false;
    }
    let _started_ms = fields.next();
    let started = fields.next().and_then(|ticks| ticks.parse::<u64>().ok());
    let (boot, namespace) = (fields.next(), fields.next());
    let this = Kernel::now();
    // Every process of another boot is gone, whatever has its pid now.
    if let (Some(boot), Some(now)) = (boot, this.boot.as_deref())
        && boot != now
    {
        return false;
    }
    let Some((alive, now_started)) = process_state(&pid.to_string()) else {
        return false;
    };
    // In this pid namespace, a process with the owner's pid that started at
    // another time is another process. In another namespace the pid means
    // nothing here, and the owner is taken to be alive, as before.
    let same_namespace = namespace.is_some() && namespace == this.namespace.as_deref();
    match (started, now_started) {
        (Some(started), Some(now_started)) if same_namespace => alive && started == now_started,
        _ => alive,
    }
}

/// This machine's boot id and this process's pid namespace, as /proc
/// tells them.
struct Kernel {
    boot: Option<String>,
    namespace: Option<String>,
}

impl Kernel {
    /// Read once: neither changes while the process lives, and a sweep
    /// asks for every run left `running`.
    fn now() -> &'static Kernel {
        static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        KERNEL.get_or_init(Kernel::read)
    }

    fn read() -> Kernel {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_string())
            .filter(|id| !id.is_empty() && !id.contains(':'));
        // `pid:[4026531836]`: the inode's number.
        let namespace = std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|link| {
                let link = link.to_string_lossy().into_owned();
                let number = link.strip_prefix("pid:[")?.strip_suffix(']')?;
                number.parse::<u64>().ok().map(|n| n.to_string())
            });
        Kernel { boot, namespace }
    }
}

/// Whether process `pid` (or `self`) exists and is not a zombie, and when
/// the kernel started it (clock ticks since boot), from /proc. A process
/// killed with SIGKILL keeps its /proc entry until its parent reaps it,
/// and a flowd restarted meanwhile must not wait for that to take its runs
/// back. `None`: no such process.
fn process_state(pid: &str) -> Option<(bool, Option<u64>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which may hold spaces and
    // parentheses: it is after the last `)`; the start time is the 22nd
    // field, the 20th after the name.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let alive = !fields.next()?.starts_with(['Z', 'X']);
    let started = fields.nth(18).and_then(|ticks| ticks.parse::<u64>().ok());
    Some((alive, started))
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Arc<SqliteStore>, StoreError> {
        if path.is_dir() {
            return Err(StoreError::Unusable(format!(
                "{} is a folder, not a store's file",
                path.display()
            )));
        }
        if let Some(unwritable) = unwritable(path) {
            return Err(StoreError::Unusable(format!(
                "{unwritable}; the commands that only read a store read it as it is"
            )));
        }
        let conn = open_for(path, Access::ReadWrite)?;
        Self::open_with(path, Access::ReadWrite, conn)
    }

    /// Opens the store at `path` for a command that only reads it: as
    /// `open` does where this user may write it, else to read only
    /// (`Access::ReadOnly`).
    pub fn open_to_read(path: &Path) -> Result<Arc<SqliteStore>, StoreError> {
        if path.is_file() && unwritable(path).is_some() {
            let conn = open_for(path, Access::ReadOnly)?;
            return Self::open_with(path, Access::ReadOnly, conn);
        }
        Self::open(path)
    }

    /// The store at `path`, whose first connection `conn` is open.
    fn open_with(
        path: &Path,
        access: Access,
        conn: Connection,
    ) -> Result<Arc<SqliteStore>, StoreError> {
        // A store at this version takes no write to open: `flow run` on a
        // file another process held the write lock of failed to start
        // ("database is locked") where its writes would have waited.
        let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
        if version as usize != MIGRATIONS.len() {
            if version as usize > MIGRATIONS.len() {
                return Err(newer_store(path, version));
            }
            if access == Access::ReadOnly {
                return Err(StoreError::Unusable(format!(
                    "{} has schema version {version} and this flow reads version {}; this user may not write it, so it cannot be brought to it here (a `flow` command of its owner's does)",
                    path.display(),
                    MIGRATIONS.len()
                )));
            }
            Self::migrate(&conn, path)?;
        }
        let writer = open_for(path, access)?;
        // The writer runs the same few statements in every batch: each is
        // parsed once (a prepare per row was an eighth of its CPU in B9).
        writer.set_prepared_statement_cache_capacity(64);
        let (sender, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("flow-journal-writer".into())
            .spawn(move || write_batches(writer, receiver))
            .map_err(|e| StoreError::Unusable(format!("cannot start the journal writer: {e}")))?;
        Ok(Arc::new(SqliteStore {
            queue: Mutex::new(sender),
            conn: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            path: path.to_path_buf(),
            access,
        }))
    }

    /// Brings the store at `path` to this version's schema.
    fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
        // Several processes may open a new store at once: the version is read
        // and the migrations applied under one write lock.
        in_immediate(conn, || {
            let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
            if version as usize > MIGRATIONS.len() {
                return Err(newer_store(path, version));
            }
            for migration in MIGRATIONS.iter().skip(version as usize) {
                conn.execute_batch(migration)?;
            }
            conn.pragma_update(None, "user_version", MIGRATIONS.len() as i64)?;
            Ok(())
        })
    }

    /// A read connection from the pool, or a new one.
    fn reader(&self) -> Result<Reader<'_>, StoreError> {
        let idle = lock(&self.readers).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open_for(&self.path, self.access)?,
        };
        Ok(Reader {
            store: self,
            conn: Some(conn),
        })
    }
}

impl SqliteStore {
    /// Keeps a plan (once per hash) so that every live run's plan stays
    /// available; a stored copy that differs is mended (see `PlanStore`).
    pub fn put_plan(&self, plan: &Plan) -> Result<(), StoreError> {
        let json = serde_json::to_string(plan).map_err(|e| StoreError::Damaged(e.to_string()))?;
        // Kept as it is: nothing to write (a run of a file run before then
        // starts while another process holds the write lock).
        let kept: Option<bool> = lock(&self.conn)
            .query_row(
                "SELECT json IS ?2 FROM plans WHERE hash = ?1",
                params![plan.hash, json],
                |row| row.get(0),
            )
            .optional()?;
        if kept == Some(true) {
            return Ok(());
        }
        // The connection is taken for each attempt, not held across the
        // waits: flowd's other store calls share it.
        writer::waiting_out_locks("the plan's write", || {
            lock(&self.conn).execute(
                "INSERT INTO plans (hash, json, delivers) VALUES (?1, ?2, ?3)
                 ON CONFLICT (hash) DO UPDATE SET json = excluded.json, delivers = excluded.delivers
                 WHERE plans.json IS NOT excluded.json",
                params![plan.hash, json, plan.delivers()],
            )
        })?;
        Ok(())
    }

    pub fn plan(&self, hash: &str) -> Result<Plan, StoreError> {
        let json: String = self
            .reader()?
            .query_row("SELECT json FROM plans WHERE hash = ?1", [hash], |row| {
                row.get(0)
            })
            .optional()?
            .ok_or_else(|| StoreError::Missing(format!("no plan {hash} in the store")))?;
        Plan::from_json(&json).map_err(|e| StoreError::Damaged(e.to_string()))
    }

    pub fn create_run(
        &self,
        id: &str,
        account: &str,
        run: &NewRun,
        idempotency_key: Option<&str>,
    ) -> StoreFuture<'static, bool> {
        let now = now_ms();
        let written = self.statement(
            "INSERT INTO runs (id, workflow, plan_hash, status, input, created_ms, updated_ms, owner, account, idempotency_key, history)
             VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (account, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING",
            vec![
                id.to_string().into(),
                run.workflow.clone().into(),
                run.plan_hash.clone().into(),
                run.input.to_string().into(),
                now.into(),
                owner().to_string().into(),
                account.to_string().into(),
                idempotency_key.map(str::to_string).into(),
                run.history().into(),
            ],
        );
        Box::pin(async move { written.await.map(|changed| changed == 1) })
    }

    /// Queues a statement for the journal writer's next commit.
    fn statement(
        &self,
        sql: &'static str,
        params: Vec<rusqlite::types::Value>,
    ) -> StoreFuture<'static, usize> {
        self.fenced_statement(None, sql, params)
    }

    /// Queues a statement for the journal writer's next commit, to apply
    /// only while run `fenced_by` is this process's.
    fn fenced_statement(
        &self,
        fenced_by: Option<Fence>,
        sql: &'static str,
        params: Vec<rusqlite::types::Value>,
    ) -> StoreFuture<'static, usize> {
        let (reply, answer) = oneshot::channel();
        let queued = lock(&self.queue).send(Write::Statement {
            fenced_by,
            sql,
            params,
            reply,
        });
        Box::pin(async move {
            queued.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
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
    /// a crash loses at most the time since the last call; false when the
    /// process no longer owns it (cancelled).
    fn add_active(
        &self,
        run: &RunHandle,
        active: std::time::Duration,
    ) -> StoreFuture<'static, bool> {
        let written = self.statement(
            "UPDATE runs SET active_ms = active_ms + ?2 WHERE id = ?1 AND owner = ?3 AND redrives = ?4",
            vec![
                run.id.clone().into(),
                (active.as_millis() as i64).into(),
                owner().to_string().into(),
                run.epoch.into(),
            ],
        );
        Box::pin(async move { written.await.map(|changed| changed == 1) })
    }

    /// Records how an invocation of the run ended and the active time it used.
    pub fn finish_run(
        &self,
        id: &str,
        status: RunStatus,
        outcome: &Value,
        active: std::time::Duration,
    ) -> StoreFuture<'static, bool> {
        let end = RunEnd {
            status,
            outcome: outcome.clone(),
            active,
        };
        let written = self.statement(FINISH_RUN, finish_params(id, &end).to_vec());
        Box::pin(async move { written.await.map(|changed| changed == 1) })
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self.reader()?
            .query_row(
                "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives FROM runs WHERE id = ?1",
                [id],
                run_row,
            )
            .optional()?)
    }

    pub fn account_run(&self, account: &str, id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self
            .reader()?
            .query_row(ACCOUNT_RUN, [account, id], run_row)
            .optional()?)
    }

    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare(
            "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives FROM runs ORDER BY created_ms, id",
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
        records.iter().map(|json| record::decode(json)).collect()
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
    ) -> StoreFuture<'a, Result<(), DecideError>> {
        let (reply, answer) = oneshot::channel();
        let decision = Decide {
            run_id: run_id.to_string(),
            path: path.to_string(),
            decision: decision.clone(),
        };
        let queued = lock(&self.queue).send(Write::Decide { decision, reply });
        Box::pin(async move {
            queued.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
        })
    }

    pub fn cancel_run(&self, id: &str) -> Result<bool, StoreError> {
        let at_ms = now_ms();
        let changed = lock(&self.conn).execute(
            "UPDATE runs SET status = 'cancelled', owner = NULL, updated_ms = ?2,
                 history = json_insert(history, '$[#]', json(?3))
             WHERE id = ?1 AND status IN ('running', 'pending_approval')",
            params![id, at_ms, RunChange::Cancelled { at_ms }.to_json()],
        )?;
        Ok(changed == 1)
    }

    pub fn redrive_run(&self, id: &str, to_plan: Option<&str>) -> Result<Option<u32>, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let from_plan: Option<String> = conn
                .query_row(
                    "SELECT plan_hash FROM runs
                     WHERE id = ?1 AND status IN ('failed', 'cancelled') AND redrives < ?2",
                    params![id, MAX_REDRIVES],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(from_plan) = from_plan else {
                return Ok(None);
            };
            let at_ms = now_ms();
            let round: u32 = conn.query_row(
                "UPDATE runs SET status = 'running', outcome = NULL, owner = ?2, updated_ms = ?3,
                     active_ms = 0, redrives = redrives + 1
                 WHERE id = ?1 RETURNING redrives",
                params![id, owner(), at_ms],
                |row| row.get(0),
            )?;
            let mut changes = vec![RunChange::Redriven { at_ms, round }];
            if let Some(to_plan) = to_plan.filter(|to| *to != from_plan) {
                conn.execute(
                    "UPDATE runs SET plan_hash = ?2 WHERE id = ?1",
                    params![id, to_plan],
                )?;
                changes.push(RunChange::Moved {
                    at_ms,
                    from_plan,
                    to_plan: to_plan.to_string(),
                });
            }
            for change in &changes {
                append_history(&conn, id, change)?;
            }
            conn.execute(
                "UPDATE step_runs SET status = 'redriven' WHERE run_id = ?1 AND status = 'failed'",
                [id],
            )?;
            Ok(Some(round))
        })
    }

    pub fn move_run(&self, id: &str, from_plan: &str, to_plan: &str) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let at_ms = now_ms();
            let moved = conn.execute(
                "UPDATE runs SET plan_hash = ?3, updated_ms = ?4
                 WHERE id = ?1 AND plan_hash = ?2 AND status = 'pending_approval'",
                params![id, from_plan, to_plan, at_ms],
            )? == 1;
            if moved {
                let change = RunChange::Moved {
                    at_ms,
                    from_plan: from_plan.to_string(),
                    to_plan: to_plan.to_string(),
                };
                append_history(&conn, id, &change)?;
            }
            Ok(moved)
        })
    }

    pub fn stored_bytes(&self, account: &str) -> Result<u64, StoreError> {
        let bytes: i64 = self.reader()?.query_row(
            "SELECT
               (SELECT COALESCE(SUM(length(CAST(json AS BLOB))), 0) FROM plans
                 WHERE hash IN (SELECT plan_hash FROM deployments WHERE account = ?1))
             + (SELECT COALESCE(SUM(length(CAST(input AS BLOB)) + COALESCE(length(CAST(outcome AS BLOB)), 0)), 0)
                 FROM runs WHERE account = ?1)
             + (SELECT COALESCE(SUM(length(CAST(s.record AS BLOB))), 0)
                 FROM step_runs s JOIN runs r ON r.id = s.run_id WHERE r.account = ?1)
             + (SELECT COALESCE(SUM(length(CAST(content AS BLOB)) + COALESCE(length(CAST(metadata AS BLOB)), 0)), 0)
                 FROM kb_documents WHERE account = ?1)
             + (SELECT COALESCE(SUM(length(CAST(message AS BLOB))), 0) FROM notifications WHERE account = ?1)",
            [account],
            |row| row.get(0),
        )?;
        Ok(bytes.max(0) as u64)
    }

    pub fn run_history(&self, id: &str) -> Result<Vec<RunChange>, StoreError> {
        let history: Option<String> = self
            .reader()?
            .query_row("SELECT history FROM runs WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .optional()?;
        Ok(history.map_or_else(Vec::new, |text| RunChange::list_from_text(&text)))
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
            let version: u32 = conn.query_row(
                "INSERT INTO workflow_versions (account, workflow, last_version) VALUES (?1, ?2, 1)
                 ON CONFLICT (account, workflow) DO UPDATE SET last_version = last_version + 1
                 RETURNING last_version",
                params![account, workflow],
                |row| row.get(0),
            )?;
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

    pub fn undeploy(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<usize, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let hashes: Vec<String> = conn
                .prepare(
                    "SELECT DISTINCT plan_hash FROM deployments
                     WHERE account = ?1 AND workflow = ?2 AND (?3 IS NULL OR version = ?3)",
                )?
                .query_map(params![account, workflow, version], |row| row.get(0))?
                .collect::<Result<_, _>>()?;
            let retired = conn.execute(
                "DELETE FROM deployments
                 WHERE account = ?1 AND workflow = ?2 AND (?3 IS NULL OR version = ?3)",
                params![account, workflow, version],
            )?;
            for hash in &hashes {
                forget_plan(&conn, hash)?;
            }
            Ok(retired)
        })
    }

    pub fn delete_run(&self, account: &str, id: &str) -> Result<Deletion, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let row: Option<(RunStatus, i64, String)> = conn
                .query_row(
                    "SELECT status, updated_ms, plan_hash FROM runs WHERE id = ?1 AND account = ?2",
                    params![id, account],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            let Some((status, updated_ms, hash)) = row else {
                return Ok(Deletion::Unknown);
            };
            if !deletable(status, updated_ms) {
                return Ok(Deletion::NotEnded(status));
            }
            delete_run_rows(&conn, id)?;
            forget_plan(&conn, &hash)?;
            Ok(Deletion::Deleted)
        })
    }

    pub fn delete_ended_runs(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let ended: Vec<(String, String)> = conn
                .prepare(
                    "SELECT id, plan_hash FROM runs
                     WHERE (status IN ('completed', 'failed') AND updated_ms < ?1)
                        OR (status = 'cancelled' AND updated_ms < MIN(?1, ?2))
                     LIMIT ?3",
                )?
                .query_map(
                    params![
                        before_ms,
                        now_ms() - DELETE_AFTER_CANCEL_MS,
                        sql_limit(limit)
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )?
                .collect::<Result<_, _>>()?;
            for (id, _) in &ended {
                delete_run_rows(&conn, id)?;
            }
            let mut hashes: Vec<&String> = ended.iter().map(|(_, hash)| hash).collect();
            hashes.sort();
            hashes.dedup();
            for hash in hashes {
                forget_plan(&conn, hash)?;
            }
            Ok(ended.len())
        })
    }

    pub fn delete_document(
        &self,
        account: &str,
        collection: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let search_id: Option<Option<i64>> = conn
                .query_row(
                    "DELETE FROM kb_documents WHERE account = ?1 AND collection = ?2 AND title = ?3
                     RETURNING search_id",
                    params![account, collection, title],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(search_id) = search_id else {
                return Ok(false);
            };
            if let Some(search_id) = search_id {
                conn.execute("DELETE FROM kb_search WHERE rowid = ?1", [search_id])?;
            }
            Ok(true)
        })
    }

    pub fn deployments(&self, account: &str) -> Result<Vec<Deployment>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare(
            "SELECT workflow, version, plan_hash, created_ms FROM deployments
             WHERE account = ?1 ORDER BY workflow, version",
        )?;
        let rows = statement
            .query_map([account], deployment_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn deployment(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<Option<Deployment>, StoreError> {
        Ok(self
            .reader()?
            .prepare_cached(
                "SELECT workflow, version, plan_hash, created_ms FROM deployments
                 WHERE account = ?1 AND workflow = ?2 AND (?3 IS NULL OR version = ?3)
                 ORDER BY version DESC LIMIT 1",
            )?
            .query_row(
                rusqlite::params![account, workflow, version],
                deployment_row,
            )
            .optional()?)
    }

    pub fn run_by_key(&self, account: &str, key: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self.reader()?
            .query_row(
                "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives
                 FROM runs WHERE account = ?1 AND idempotency_key = ?2",
                [account, key],
                run_row,
            )
            .optional()?)
    }

    pub fn account_runs(&self, account: &str, query: &RunQuery) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(&account_runs_sql(query.status))?;
        let (before_ms, before_id) = query.before.clone().unzip();
        let rows = statement
            .query_map(
                params![
                    account,
                    query.workflow,
                    sql_limit(query.limit),
                    before_ms,
                    before_id
                ],
                run_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn unfinished_runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives
             FROM runs WHERE status = 'running' ORDER BY created_ms, id",
        )?;
        let rows = statement
            .query_map([], run_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn orphaned_runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives, owner
             FROM runs WHERE status = 'running' ORDER BY created_ms, id",
        )?;
        let rows = statement
            .query_map([], |row| {
                Ok((run_row(row)?, row.get::<_, Option<String>>(11)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows
            .into_iter()
            .filter(|(_, owner)| owner.as_deref().is_none_or(|owner| !owner_alive(owner)))
            .map(|(row, _)| row)
            .collect())
    }

    pub fn expired_gates(&self, now_ms: u64) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives
             FROM runs
             WHERE status = 'pending_approval' AND id IN (
                 SELECT run_id FROM step_runs
                 WHERE status = 'pending' AND due_ms IS NOT NULL AND due_ms <= ?1)
             ORDER BY created_ms, id",
        )?;
        let rows = statement
            .query_map([sql_ms(now_ms)], run_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn pending_approvals(&self) -> Result<Vec<PendingGates>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            "SELECT r.account, r.workflow, COUNT(*) FROM step_runs s JOIN runs r ON r.id = s.run_id
             WHERE s.status = 'pending' AND r.status = 'pending_approval'
             GROUP BY r.account, r.workflow ORDER BY r.account, r.workflow",
        )?;
        let rows = statement
            .query_map([], |row| {
                Ok(PendingGates {
                    account: row.get(0)?,
                    workflow: row.get(1)?,
                    gates: row.get::<_, i64>(2)? as u64,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn notify(&self, note: &NewNotification<'_>) -> Result<bool, StoreError> {
        let changed = lock(&self.conn).execute(
            NOTIFY,
            params![
                note.account,
                note.kind.as_str(),
                note.audience,
                note.run_id,
                note.step_path,
                note.subject,
                note.message,
                note.key,
                now_ms()
            ],
        )?;
        Ok(changed == 1)
    }

    pub fn notifications(
        &self,
        account: &str,
        audiences: &[String],
        reader: &str,
        query: &NotificationQuery,
    ) -> Result<Vec<Notification>, StoreError> {
        let conn = self.reader()?;
        // The audiences as a JSON array: one statement for any number of them.
        let audiences =
            serde_json::to_string(audiences).map_err(|e| StoreError::Damaged(e.to_string()))?;
        let mut statement = conn.prepare_cached(
            "SELECT n.id, n.account, n.kind, n.audience, n.run_id, n.step_path, n.subject, n.message,
                    n.created_ms, r.reader IS NOT NULL
             FROM notifications n
             LEFT JOIN notification_reads r ON r.notification_id = n.id AND r.reader = ?3
             WHERE n.account = ?1 AND n.audience IN (SELECT value FROM json_each(?2))
               AND (?4 = 0 OR r.reader IS NULL)
             ORDER BY n.id DESC
             LIMIT ?5",
        )?;
        let rows = statement
            .query_map(
                params![
                    account,
                    audiences,
                    reader,
                    query.unread_only,
                    sql_limit(query.limit)
                ],
                notification_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn account_notifications(
        &self,
        account: &str,
        limit: usize,
    ) -> Result<Vec<Notification>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            "SELECT id, account, kind, audience, run_id, step_path, subject, message, created_ms, 0
             FROM notifications WHERE account = ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = statement
            .query_map(params![account, sql_limit(limit)], notification_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn mark_read(&self, account: &str, reader: &str, ids: &[i64]) -> Result<usize, StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let mut marked = 0;
            for id in ids {
                let exists: bool = conn.query_row(
                    "SELECT EXISTS (SELECT 1 FROM notifications WHERE id = ?1 AND account = ?2)",
                    params![id, account],
                    |row| row.get(0),
                )?;
                if exists {
                    conn.execute(
                        "INSERT OR IGNORE INTO notification_reads (notification_id, reader, read_ms)
                         VALUES (?1, ?2, ?3)",
                        params![id, reader, now_ms()],
                    )?;
                    marked += 1;
                }
            }
            Ok(marked)
        })
    }

    pub fn to_mail(&self, now_ms: u64, limit: usize) -> Result<Vec<Outgoing>, StoreError> {
        let conn = self.reader()?;
        let mut statement = conn.prepare_cached(
            // Each account's notifications in the order they came due,
            // found by a seek into its own range of `notifications_to_mail`
            // that ends at the first not due yet (the accounts one seek
            // each, `WITH RECURSIVE`): the work is the accounts and what is
            // taken, not the backlog of the account with most, nor those
            // waiting for a retry.
            "WITH RECURSIVE accounts(account) AS (
                 SELECT (SELECT account FROM notifications WHERE mail IS NULL
                         ORDER BY account LIMIT 1)
                 UNION ALL
                 SELECT (SELECT n.account FROM notifications n
                         WHERE n.mail IS NULL AND n.account > accounts.account
                         ORDER BY n.account LIMIT 1)
                 FROM accounts WHERE accounts.account IS NOT NULL)
             SELECT id, account, kind, audience, run_id, step_path, subject, message, created_ms, 0,
                    mail_attempts
             FROM (SELECT n.id, n.account, n.kind, n.audience, n.run_id, n.step_path, n.subject,
                          n.message, n.created_ms, n.mail_attempts,
                          ROW_NUMBER() OVER (
                              PARTITION BY n.account
                              ORDER BY COALESCE(n.mail_next_ms, n.created_ms), n.id) AS place
                   FROM accounts a JOIN notifications n ON n.id IN (
                       SELECT m.id FROM notifications m
                       WHERE m.account = a.account AND m.mail IS NULL
                         AND COALESCE(m.mail_next_ms, m.created_ms) <= ?1
                       ORDER BY COALESCE(m.mail_next_ms, m.created_ms), m.id LIMIT ?2))
             ORDER BY place, id LIMIT ?2",
        )?;
        let rows = statement
            .query_map(params![sql_ms(now_ms), sql_limit(limit)], |row| {
                Ok((notification_row(row)?, row.get::<_, i64>(10)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut sends = conn.prepare_cached(
            "SELECT recipient FROM notification_sends WHERE notification_id = ?1 ORDER BY recipient",
        )?;
        let mut outgoing = Vec::with_capacity(rows.len());
        for (notification, attempts) in rows {
            let sent_to = sends
                .query_map([notification.id], |row| row.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            outgoing.push(Outgoing {
                notification,
                attempts: attempts as u32,
                sent_to,
            });
        }
        Ok(outgoing)
    }

    pub fn mailed(&self, id: i64, reached: &[String], next: MailNext) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        in_immediate(&conn, || {
            let now = now_ms();
            for recipient in reached {
                conn.execute(
                    "INSERT OR IGNORE INTO notification_sends (notification_id, recipient, sent_ms)
                     VALUES (?1, ?2, ?3)",
                    params![id, recipient, now],
                )?;
            }
            match next {
                MailNext::Done(state) => conn.execute(
                    "UPDATE notifications SET mail = ?2 WHERE id = ?1",
                    params![id, state.as_str()],
                )?,
                MailNext::Retry(at_ms) => conn.execute(
                    "UPDATE notifications SET mail_attempts = mail_attempts + 1, mail_next_ms = ?2
                     WHERE id = ?1",
                    params![id, sql_ms(at_ms)],
                )?,
            };
            Ok(())
        })
    }
}

impl SqliteStore {
    /// Hands `write`'s document of `account` to the writer thread, which
    /// commits it with the journal's records, if run `fenced_by` is still
    /// this process's then.
    fn queue_document(
        &self,
        fenced_by: Option<&RunHandle>,
        account: &str,
        write: &KbWrite,
    ) -> StoreFuture<'static, Value> {
        let (reply, answer) = oneshot::channel();
        let queued = lock(&self.queue).send(Write::Document {
            fenced_by: fenced_by.map(Fence::of),
            account: account.to_string(),
            write: Box::new(write.clone()),
            reply,
        });
        Box::pin(async move {
            queued.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
        })
    }

    pub fn keep_events_of(&self, accounts: &[(String, EventsOf)]) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        in_immediate_waiting(&conn, || {
            // Called as flowd starts: a deliverer that died (kill -9) left
            // its claims, which would hold its events back for
            // `EVENT_CLAIM`. One flowd delivers from one file, so they are
            // released now.
            conn.execute("UPDATE run_events SET claimed_until = 0", [])?;
            conn.execute("DELETE FROM event_accounts", [])?;
            for (account, of) in accounts {
                conn.execute(
                    "INSERT OR REPLACE INTO event_accounts (account, every_run) VALUES (?1, ?2)",
                    params![account, *of == EventsOf::EveryRun],
                )?;
            }
            Ok(())
        })
    }

    pub fn due_events(&self, due: &DueEvents<'_>) -> Result<Vec<RunEvent>, StoreError> {
        let now = sql_ms(due.now_ms);
        let in_flight: serde_json::Map<String, Value> = due
            .in_flight
            .iter()
            .map(|(account, held)| (account.clone(), Value::from(*held)))
            .collect();
        let in_flight = Value::Object(in_flight).to_string();
        let claimed_until = now.saturating_add(EVENT_CLAIM.as_millis() as i64);
        let conn = lock(&self.conn);
        // A claim need not wait for the disk: flowd releases every claim as
        // it starts, so one lost in a crash costs nothing, and in WAL mode
        // the next synchronous commit makes it durable with its own. An
        // fsync here, on the async runtime's thread with the shared
        // connection held, slowed every run of a busy flowd (B9).
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let claimed = in_immediate(&conn, || {
            let mut statement = conn.prepare_cached(
                // `place`: where the event would stand among its account's
                // in flight, were it taken. Each account's events that came
                // due first are found by a seek into its own range of
                // `run_events_due` (the accounts one seek each, `WITH
                // RECURSIVE`): the work is the accounts and what is taken,
                // not the backlog of an account whose endpoint is slow,
                // which this transaction would make every commit wait for.
                "UPDATE run_events SET claimed_until = ?2
                 WHERE id IN (
                     WITH RECURSIVE accounts(account) AS (
                         SELECT (SELECT account FROM run_events ORDER BY account LIMIT 1)
                         UNION ALL
                         SELECT (SELECT e.account FROM run_events e
                                 WHERE e.account > accounts.account
                                 ORDER BY e.account LIMIT 1)
                         FROM accounts WHERE accounts.account IS NOT NULL)
                     SELECT id FROM (
                         SELECT e.id AS id, e.next_ms AS next_ms,
                                ROW_NUMBER() OVER (PARTITION BY e.account ORDER BY e.next_ms, e.id)
                                    + COALESCE(held.value, 0) AS place
                         FROM accounts a
                         JOIN run_events e ON e.id IN (
                             SELECT d.id FROM run_events d
                             WHERE d.account = a.account AND d.next_ms <= ?1
                               AND d.claimed_until <= ?1
                             ORDER BY d.next_ms, d.id LIMIT ?5)
                         LEFT JOIN json_each(?4) AS held ON held.key = e.account)
                     WHERE place <= ?5
                     ORDER BY place, next_ms, id LIMIT ?3)
                 RETURNING id, account, run_id, workflow, event, outcome, created_ms, attempts,
                           reached",
            )?;
            let rows = statement
                .query_map(
                    params![
                        now,
                        claimed_until,
                        sql_limit(due.limit),
                        in_flight,
                        due.per_account_bound()
                    ],
                    |row| {
                        Ok((
                            RunEvent {
                                id: row.get(0)?,
                                account: row.get(1)?,
                                run_id: row.get(2)?,
                                workflow: row.get(3)?,
                                event: row.get(4)?,
                                outcome: None,
                                created_ms: row.get(6)?,
                                attempts: row.get::<_, i64>(7)? as u32,
                                reached: Vec::new(),
                            },
                            row.get::<_, Option<String>>(5)?,
                            row.get::<_, String>(8)?,
                        ))
                    },
                )?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        });
        conn.pragma_update(None, "synchronous", "FULL")?;
        let mut events = claimed?
            .into_iter()
            .map(|(mut event, outcome, reached)| {
                event.outcome = outcome.and_then(|text| serde_json::from_str(&text).ok());
                event.reached = serde_json::from_str(&reached)
                    .map_err(|e| StoreError::Damaged(format!("event {}: {e}", event.id)))?;
                Ok(event)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    /// Records an attempt at event `id`: deleted when done, else its next
    /// try and the endpoints it reached so far (kept sorted, once each).
    /// Written with the journal's commits: one fsync of its own per event,
    /// on the async runtime's thread, held the runs back (B9).
    pub fn event_attempted(
        &self,
        id: i64,
        reached: &[String],
        next: EventNext,
    ) -> StoreFuture<'static, ()> {
        let written = match next {
            EventNext::Done => {
                self.statement("DELETE FROM run_events WHERE id = ?1", vec![id.into()])
            }
            // Its run may have been deleted meanwhile, and it with it: then
            // nothing changes.
            EventNext::Retry(at_ms) => self.statement(
                "UPDATE run_events SET attempts = attempts + 1, next_ms = ?2, claimed_until = 0,
                     reached = (SELECT json_group_array(value) FROM (
                         SELECT value FROM json_each(run_events.reached)
                         UNION SELECT value FROM json_each(?3) ORDER BY value))
                 WHERE id = ?1",
                vec![
                    id.into(),
                    sql_ms(at_ms).into(),
                    serde_json::Value::from(reached.to_vec()).to_string().into(),
                ],
            ),
        };
        Box::pin(async move { written.await.map(|_| ()) })
    }
}

impl EventStore for SqliteStore {
    fn keep_events_of<'a>(&'a self, accounts: &'a [(String, EventsOf)]) -> StoreFuture<'a, ()> {
        ready(self.keep_events_of(accounts))
    }

    fn due_events<'a>(&'a self, due: &'a DueEvents<'a>) -> StoreFuture<'a, Vec<RunEvent>> {
        ready(self.due_events(due))
    }

    fn event_attempted<'a>(
        &'a self,
        id: i64,
        reached: &'a [String],
        next: EventNext,
    ) -> StoreFuture<'a, ()> {
        SqliteStore::event_attempted(self, id, reached, next)
    }

    fn note_delivery<'a>(&'a self, run_id: &'a str, change: &'a RunChange) -> StoreFuture<'a, ()> {
        let conn = lock(&self.conn);
        ready(in_immediate(&conn, || {
            append_history(&conn, run_id, change)
        }))
    }
}

/// The trait over the inherent methods. SQLite answers at once (its calls
/// take a local lock and, for writes other than the journal's, one commit),
/// so each future is ready when returned.
/// A `Deployment` of a row of `workflow, version, plan_hash, created_ms`.
fn deployment_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Deployment> {
    Ok(Deployment {
        workflow: row.get(0)?,
        version: row.get(1)?,
        plan_hash: row.get(2)?,
        created_ms: row.get(3)?,
    })
}

/// `account_runs`' statement: `?1` the account, `?2` the workflow or
/// null, `?3` the limit, `?4` and `?5` the time and id to list before.
fn account_runs_sql(status: Option<RunStatus>) -> String {
    format!(
        "SELECT id, workflow, plan_hash, status, input, outcome, created_ms, updated_ms, active_ms, account, redrives
         FROM runs
         WHERE account = ?1 AND (?2 IS NULL OR workflow = ?2) AND {}
           AND (?4 IS NULL OR (created_ms, id) < (?4, ?5))
         ORDER BY created_ms DESC, id DESC
         LIMIT ?3",
        status_condition(status)
    )
}

impl PlanStore for SqliteStore {
    fn put_plan<'a>(&'a self, plan: &'a Plan) -> StoreFuture<'a, ()> {
        ready(self.put_plan(plan))
    }

    fn plan<'a>(&'a self, hash: &'a str) -> StoreFuture<'a, Plan> {
        ready(self.plan(hash))
    }

    fn deploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
    ) -> StoreFuture<'a, Deployment> {
        ready(self.deploy(account, workflow, plan_hash))
    }

    fn undeploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, usize> {
        ready(self.undeploy(account, workflow, version))
    }

    fn deployments<'a>(&'a self, account: &'a str) -> StoreFuture<'a, Vec<Deployment>> {
        ready(self.deployments(account))
    }

    fn deployment<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, Option<Deployment>> {
        ready(self.deployment(account, workflow, version))
    }
}

impl RunStore for SqliteStore {
    fn create_run<'a>(
        &'a self,
        id: &'a str,
        account: &'a str,
        run: &'a NewRun,
        idempotency_key: Option<&'a str>,
    ) -> StoreFuture<'a, bool> {
        self.create_run(id, account, run, idempotency_key)
    }

    fn claim_run<'a>(&'a self, id: &'a str, from: &'a [RunStatus]) -> StoreFuture<'a, bool> {
        ready(self.claim_run(id, from))
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

    fn account_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        ready(self.account_run(account, id))
    }

    fn runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        ready(self.runs())
    }

    fn step_records<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        ready(self.step_records(run_id))
    }

    fn cancel_run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        ready(self.cancel_run(id))
    }

    fn redrive_run<'a>(
        &'a self,
        id: &'a str,
        to_plan: Option<&'a str>,
    ) -> StoreFuture<'a, Option<u32>> {
        ready(self.redrive_run(id, to_plan))
    }

    fn move_run<'a>(
        &'a self,
        id: &'a str,
        from_plan: &'a str,
        to_plan: &'a str,
    ) -> StoreFuture<'a, bool> {
        ready(self.move_run(id, from_plan, to_plan))
    }

    fn run_history<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<RunChange>> {
        ready(self.run_history(id))
    }

    fn stored_bytes<'a>(&'a self, account: &'a str) -> StoreFuture<'a, u64> {
        ready(self.stored_bytes(account))
    }

    fn delete_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Deletion> {
        ready(self.delete_run(account, id))
    }

    fn delete_ended_runs(&self, before_ms: i64, limit: usize) -> StoreFuture<'_, usize> {
        ready(self.delete_ended_runs(before_ms, limit))
    }

    fn run_by_key<'a>(&'a self, account: &'a str, key: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        ready(self.run_by_key(account, key))
    }

    fn account_runs<'a>(
        &'a self,
        account: &'a str,
        query: &'a RunQuery,
    ) -> StoreFuture<'a, Vec<RunRow>> {
        ready(self.account_runs(account, query))
    }

    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        ready(self.unfinished_runs())
    }

    fn orphaned_runs(&self) -> StoreFuture<'_, Vec<RunRow>> {
        ready(self.orphaned_runs())
    }

    /// The runs stay this process's: its exit frees them (`owner_alive`),
    /// and its writer has no fence that would refuse what it still has
    /// queued were they given up before. What it waits for is the writer:
    /// a statement queued after the journals' last writes (sent as their
    /// runs' tasks stopped), answered once they are committed, before the
    /// process exits and takes the writer thread with it.
    fn release_runs(&self) -> StoreFuture<'_, ()> {
        let committed = self.statement("UPDATE runs SET owner = owner WHERE 0", Vec::new());
        Box::pin(async move { committed.await.map(drop) })
    }

    fn open_journal<'a>(
        self: Arc<Self>,
        run_id: &'a str,
        durability: flow_plan::Durability,
    ) -> StoreFuture<'a, Arc<dyn RunLog>> {
        let journal = RunJournal::open(&self, run_id, durability);
        ready(journal.map(|journal| journal as Arc<dyn RunLog>))
    }

    fn fresh_journal(
        self: Arc<Self>,
        run_id: &str,
        account: &str,
        start: Option<NewRun>,
        held_from: std::time::Instant,
        durability: flow_plan::Durability,
    ) -> Arc<dyn RunLog> {
        Arc::new(StoreJournal::fresh(
            self, run_id, account, start, held_from, durability,
        ))
    }
}

impl ApprovalStore for SqliteStore {
    fn decide<'a>(
        &'a self,
        run_id: &'a str,
        path: &'a str,
        decision: &'a Decision,
    ) -> StoreFuture<'a, Result<(), DecideError>> {
        self.decide(run_id, path, decision)
    }

    fn expired_gates(&self, now_ms: u64) -> StoreFuture<'_, Vec<RunRow>> {
        ready(self.expired_gates(now_ms))
    }

    fn pending_approvals(&self) -> StoreFuture<'_, Vec<PendingGates>> {
        ready(self.pending_approvals())
    }
}

impl NotificationStore for SqliteStore {
    fn notify<'a>(&'a self, notification: &'a NewNotification<'a>) -> StoreFuture<'a, bool> {
        ready(self.notify(notification))
    }

    fn notifications<'a>(
        &'a self,
        account: &'a str,
        audiences: &'a [String],
        reader: &'a str,
        query: &'a NotificationQuery,
    ) -> StoreFuture<'a, Vec<Notification>> {
        ready(self.notifications(account, audiences, reader, query))
    }

    fn account_notifications<'a>(
        &'a self,
        account: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Notification>> {
        ready(self.account_notifications(account, limit))
    }

    fn mark_read<'a>(
        &'a self,
        account: &'a str,
        reader: &'a str,
        ids: &'a [i64],
    ) -> StoreFuture<'a, usize> {
        ready(self.mark_read(account, reader, ids))
    }

    fn to_mail(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<Outgoing>> {
        ready(self.to_mail(now_ms, limit))
    }

    fn mailed<'a>(&'a self, id: i64, reached: &'a [String], next: MailNext) -> StoreFuture<'a, ()> {
        ready(self.mailed(id, reached, next))
    }
}

fn ready<'a, T: Send + 'a>(result: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(result))
}

impl SqliteStore {
    fn write_journal(&self, run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()> {
        let write = Box::new(EncodedWrite::new(write));
        let (reply, answer) = oneshot::channel();
        let sent = lock(&self.queue).send(Write::Journal {
            run: Arc::clone(run),
            write,
            reply,
        });
        Box::pin(async move {
            sent.map_err(|_| StoreError::WriterStopped)?;
            answer.await.map_err(|_| StoreError::WriterStopped)?
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
        redrives: row.get(10)?,
    })
}

fn notification_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Notification> {
    let kind: String = row.get(2)?;
    Ok(Notification {
        id: row.get(0)?,
        account: row.get(1)?,
        kind: NotificationKind::parse(&kind).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                2,
                rusqlite::types::Type::Text,
                format!("unknown notification kind `{kind}`").into(),
            )
        })?,
        audience: row.get(3)?,
        run_id: row.get(4)?,
        step_path: row.get(5)?,
        subject: row.get(6)?,
        message: row.get(7)?,
        created_ms: row.get(8)?,
        read: row.get(9)?,
    })
}

/// How long a confirmation that a run is this process's holds before its
/// next attempt asks again (`JournalBackend::lease`): three of the
/// runner's heartbeats, which renew it each second (steps' writes confirm
/// it between), so that a process going about its run never finds its
/// hold run out between two of them (a call's body refused as it went out).
const CONFIRMED_FOR: std::time::Duration = std::time::Duration::from_secs(3);

/// One run's journal on SQLite: the stores' shared journal over this
/// store's writer.
pub type RunJournal = StoreJournal<SqliteStore>;

impl RunJournal {
    /// Opens a run's journal. With `Durability::Approval`, step records are
    /// persisted only by `flush`: a crash loses the progress since the last
    /// pause, which the workflow chose in exchange for fewer commits.
    pub fn open(
        store: &Arc<SqliteStore>,
        run_id: &str,
        durability: flow_plan::Durability,
    ) -> Result<Arc<RunJournal>, StoreError> {
        let read_at = std::time::Instant::now();
        let row = store.run(run_id)?;
        // The invocation's epoch is the run's redrive: a redrive in this
        // same process (flowd) leaves the owner as it was, and the epoch is
        // what fences the writes its earlier invocation still has queued.
        let epoch = row.as_ref().map_or(0, |row| i64::from(row.redrives));
        let account = row.map_or_else(|| NO_ACCOUNT.to_string(), |row| row.account);
        let records = store.step_records(run_id)?;
        let run = RunHandle {
            id: run_id.to_string(),
            account,
            epoch,
        };
        let hold = StoreJournal::hold_from(&**store, true, read_at);
        Ok(Arc::new(StoreJournal::new(
            Arc::clone(store),
            run,
            hold,
            records,
            durability,
        )))
    }
}

/// A run here is its process's while that process lives (see the module
/// doc): no lease expires in the store, and a renewal or a write fails only
/// for a run another process took (cancelled, redriven, recovered). Each
/// such write (records, a step's KB document or handoff, the end) is
/// fenced by the run's owner and redrive in the writer's transaction, so
/// a write that commits confirms the hold; an attempt with nothing to
/// write asks once a second has passed since the last confirmation (a
/// process resumed after SIGSTOP, or a step after a long retry wait).
impl JournalBackend for SqliteStore {
    fn lease(&self) -> Option<std::time::Duration> {
        Some(CONFIRMED_FOR)
    }

    fn writes_renew(&self) -> bool {
        true
    }

    fn write(&self, run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()> {
        self.write_journal(run, write)
    }

    fn renew<'a>(
        &'a self,
        run: &'a RunHandle,
        active: std::time::Duration,
    ) -> StoreFuture<'a, bool> {
        self.add_active(run, active)
    }

    fn kb_write<'a>(&'a self, run: &'a RunHandle, write: &'a KbWrite) -> StoreFuture<'a, Value> {
        self.queue_document(Some(run), &run.account, write)
    }

    fn kb_context<'a>(
        &'a self,
        run: &'a RunHandle,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> StoreFuture<'a, Vec<KbDocument>> {
        ready(SqliteStore::kb_context(
            self,
            &run.account,
            ids,
            department,
            terms,
            limit,
        ))
    }

    fn handoff<'a>(&'a self, run: &'a RunHandle, handoff: &'a Handoff) -> StoreFuture<'a, ()> {
        // With the journal's commits, as a KB write, for the same reason,
        // and fenced by the run as its records are.
        let written = self.fenced_statement(
            Some(Fence::of(run)),
            NOTIFY,
            vec![
                run.account.clone().into(),
                NotificationKind::Handoff.as_str().to_string().into(),
                handoff.department.clone().into(),
                handoff.run_id.clone().into(),
                rusqlite::types::Value::Null,
                handoff.subject.clone().into(),
                handoff.message.clone().into(),
                handoff.key.clone().into(),
                now_ms().into(),
            ],
        );
        Box::pin(async move { written.await.map(|_| ()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::Effects as _;

    /// Regression: another process holding SQLite's write lock past the
    /// busy timeout failed the writer's batch, and each run whose record it
    /// held failed with "database is locked". The batch waits for the lock.
    #[test]
    fn the_writer_waits_out_a_lock_held_past_the_busy_timeout() {
        let (_dir, conn, holder) = locked_by_another("sqlite-locked");
        let (queue, writes) = mpsc::channel();
        let writer = std::thread::spawn(move || write_batches(conn, writes));
        let (reply, answer) = oneshot::channel();
        queue
            .send(Write::Statement {
                fenced_by: None,
                sql: "UPDATE runs SET status = 'failed' WHERE id = 'none'",
                params: Vec::new(),
                reply,
            })
            .unwrap();
        // Many busy timeouts of the writer's.
        std::thread::sleep(std::time::Duration::from_millis(300));
        holder.execute_batch("COMMIT").unwrap();
        assert_eq!(answer.blocking_recv().unwrap().unwrap(), 0);
        drop(queue);
        writer.join().unwrap();
    }

    /// A store's file whose write lock another connection (`holder`) has
    /// taken, and a connection of the store's kind to it that gives up
    /// waiting after 20 ms, so that a test sees many busy timeouts.
    fn locked_by_another(name: &str) -> (flow_tests::TempDir, Connection, Connection) {
        let dir = flow_tests::TempDir::new(name);
        let path = dir.path().join("flow.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn = open_for(&path, Access::ReadWrite).unwrap();
        conn.busy_timeout(std::time::Duration::from_millis(20))
            .unwrap();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        (dir, conn, holder)
    }

    /// Regression: flowd's start (`keep_events_of`) failed with "database
    /// is locked" once another process had held the write lock for a busy
    /// timeout; it waits, as the journal's writes do.
    #[test]
    fn a_write_transaction_waits_out_a_lock_held_past_the_busy_timeout() {
        let (_dir, conn, holder) = locked_by_another("sqlite-immediate-locked");
        let released = std::thread::spawn(move || {
            // Many busy timeouts of the waiting connection's.
            std::thread::sleep(std::time::Duration::from_millis(300));
            holder.execute_batch("COMMIT").unwrap();
        });
        let changed = in_immediate_waiting(&conn, || {
            Ok(conn.execute("UPDATE runs SET status = 'failed' WHERE id = 'none'", [])?)
        });
        assert_eq!(changed.unwrap(), 0);
        released.join().unwrap();
    }

    /// Regression: `flow run` did not start while another process held the
    /// write lock past the busy timeout ("cannot open the store: database
    /// is locked", exit 2), though its writes would have waited: opening a
    /// store at this version, and keeping a plan kept already, write
    /// nothing.
    #[test]
    fn a_store_opens_and_keeps_a_kept_plan_while_another_holds_the_lock() {
        let dir = flow_tests::TempDir::new("sqlite-open-locked");
        let path = dir.path().join("flow.db");
        let checked = flow_compiler::check_source(
            "w.flow",
            "workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }",
        );
        let plan = flow_compiler::lower(&checked).unwrap();
        SqliteStore::open(&path).unwrap().put_plan(&plan).unwrap();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        // Each took the write lock, and failed after the busy timeout.
        let store = SqliteStore::open(&path).unwrap();
        store.put_plan(&plan).unwrap();
        holder.execute_batch("COMMIT").unwrap();
    }

    /// A user who may read a store but not write it, nor the folder that
    /// holds it, reads it (`flow runs` failed "attempt to write a readonly
    /// database"): through the `-wal` of a process that writes it
    /// meanwhile, and with nothing beside it once that one has ended.
    /// `Access::ReadOnly` is forced here, since a test run as root may
    /// write anything (tests/tests/flow.rs runs the commands as another
    /// user).
    #[tokio::test]
    async fn a_store_opened_to_read_only_reads_what_was_written() {
        let dir = flow_tests::TempDir::new("sqlite-read-only");
        let path = dir.path().join("flow.db");
        let beside = |suffix: &str| dir.path().join(format!("flow.db{suffix}"));
        let checked = flow_compiler::check_source(
            "w.flow",
            "workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }",
        );
        let plan = flow_compiler::lower(&checked).unwrap();
        let new_run = NewRun {
            workflow: "w".into(),
            plan_hash: plan.hash.clone(),
            input: json!({}),
            provider: None,
        };
        let read_only = || {
            SqliteStore::open_with(
                &path,
                Access::ReadOnly,
                open_for(&path, Access::ReadOnly).unwrap(),
            )
            .unwrap()
        };
        let ids = |store: &SqliteStore| -> Vec<String> {
            let mut ids: Vec<String> = store
                .runs()
                .unwrap()
                .into_iter()
                .map(|run| run.id)
                .collect();
            ids.sort();
            ids
        };

        let writer = SqliteStore::open(&path).unwrap();
        writer.put_plan(&plan).unwrap();
        assert!(
            writer
                .create_run("r1", "acme", &new_run, None)
                .await
                .unwrap()
        );
        assert!(beside("-wal").exists());
        let reader = read_only();
        assert_eq!(ids(&reader), ["r1"]);
        assert!(
            writer
                .create_run("r2", "acme", &new_run, None)
                .await
                .unwrap()
        );
        assert_eq!(ids(&reader), ["r1", "r2"]);
        let refused = reader.create_run("r3", "acme", &new_run, None).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|error| error.to_string().contains("readonly")),
            "{refused:?}"
        );
        drop(reader);
        drop(writer);

        // The last connection to close folds the `-wal` in and removes it.
        // The store closes on two threads at once, and each may see the
        // other still open: a connection opened and closed after both is
        // the last.
        let gone = std::time::Instant::now();
        while beside("-wal").exists() && gone.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            // One that has read the file: an unused one folds nothing in.
            let last = Connection::open(&path).unwrap();
            last.pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0))
                .unwrap();
            drop(last);
        }
        assert!(!beside("-wal").exists());
        let reader = read_only();
        assert_eq!(ids(&reader), ["r1", "r2"]);
        assert_eq!(
            reader.run("r2").unwrap().map(|run| run.workflow),
            Some("w".into())
        );
        assert!(!beside("-wal").exists() && !beside("-shm").exists());
    }

    /// A document written again replaces its row of the full-text index,
    /// found by rowid (not by a scan of the index), and keeps one row.
    #[tokio::test]
    async fn a_rewritten_document_keeps_one_row_of_the_full_text_index() {
        let dir = flow_tests::TempDir::new("sqlite-kb-rewrite");
        let store = SqliteStore::open(&dir.path().join("flow.db")).unwrap();
        // A step's document is written for a run this process holds.
        let checked = flow_compiler::check_source(
            "w.flow",
            "workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }",
        );
        let plan = flow_compiler::lower(&checked).unwrap();
        store.put_plan(&plan).unwrap();
        let new_run = NewRun {
            workflow: "w".into(),
            plan_hash: plan.hash.clone(),
            input: json!({}),
            provider: None,
        };
        assert!(
            store
                .create_run("r1", "acme", &new_run, None)
                .await
                .unwrap()
        );
        let run = RunHandle {
            id: "r1".to_string(),
            account: "acme".to_string(),
            epoch: 0,
        };
        let hold = StoreJournal::hold_from(&*store, true, std::time::Instant::now());
        let journal = StoreJournal::new(
            Arc::clone(&store),
            run,
            hold,
            Vec::new(),
            flow_plan::Durability::Full,
        );
        for (content, version) in [("first words", 1), ("second words", 2)] {
            let write = KbWrite {
                collection: "notes".into(),
                title: "T".into(),
                content: content.into(),
                metadata: None,
                key: None,
                department: None,
            };
            let written = journal.kb_write(&write).await.unwrap();
            assert_eq!(written["version"], version, "{written}");
        }
        let conn = store.reader().unwrap();
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM kb_search", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        let found: String = conn
            .query_row(
                "SELECT content FROM kb_search WHERE kb_search MATCH 'second'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(found, "second words");
    }

    /// Regression (issue 13): a flowd killed with SIGKILL and not yet reaped
    /// by its parent (a zombie) still had a /proc entry, so a restarted
    /// flowd took none of its runs back until the next orphan sweep. And
    /// (a chaos probe) an owner was taken to be alive while any process had
    /// its pid: after a reboot, or once the pid was reused, its runs stayed
    /// `running` for good.
    #[test]
    fn a_zombie_owner_and_a_reused_pid_are_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let owner = format!("{}:1", child.id());
        assert!(owner_alive(&owner), "a running process owns its runs");
        // The same pid, another process: another start time, or another
        // boot.
        let this = Kernel::now();
        let (_, started) = process_state(&child.id().to_string()).unwrap();
        let (started, boot, namespace) = (
            started.unwrap(),
            this.boot.as_deref().unwrap(),
            this.namespace.as_deref().unwrap(),
        );
        let as_recorded = format!("{}:1:{started}:{boot}:{namespace}", child.id());
        assert!(owner_alive(&as_recorded));
        let reused = format!("{}:1:{}:{boot}:{namespace}", child.id(), started + 1);
        assert!(!owner_alive(&reused), "a reused pid is not the owner");
        let rebooted = format!("{}:1:{started}:another-boot:{namespace}", child.id());
        assert!(!owner_alive(&rebooted), "no process outlives a boot");
        let elsewhere = format!("{}:1:{}:{boot}:1", child.id(), started + 1);
        assert!(
            owner_alive(&elsewhere),
            "another namespace's pid says nothing here"
        );
        child.kill().unwrap();
        // Killed, not waited for: a zombie until `wait` below.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while owner_alive(&owner) {
            assert!(
                std::time::Instant::now() < deadline,
                "a zombie counts as alive"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            Path::new(&format!("/proc/{}", child.id())).exists(),
            "still a zombie"
        );
        child.wait().unwrap();
    }

    /// Whether a run is an account's is read from an index alone: another
    /// account's run, however large its input, costs the lookup what a
    /// made-up id costs (no timing in tests: the plan is what guards it).
    #[test]
    fn an_account_run_lookup_reads_the_index_not_the_row() {
        let dir = flow_tests::TempDir::new("sqlite-account-run");
        let store = SqliteStore::open(&dir.path().join("flow.db")).unwrap();
        let plan = query_plan(&store, ACCOUNT_RUN, params!["acme", "run-x"]);
        assert!(
            plan.iter()
                .any(|step| step.contains("COVERING INDEX runs_by_account_id")),
            "{plan:?}"
        );
    }

    /// The steps of SQLite's plan for `sql` with `params`, as `EXPLAIN
    /// QUERY PLAN` words them.
    fn query_plan(store: &SqliteStore, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Vec<String> {
        store
            .reader()
            .unwrap()
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params, |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Regression: runs listed by status walked every run of the account
    /// (the index on status alone could not give them in time order), so
    /// `GET /v1/runs?status=running` grew with the account's history. The
    /// listing by a status reads one range of the index on status, account
    /// and time.
    #[test]
    fn runs_listed_by_status_read_one_range_of_an_index() {
        let dir = flow_tests::TempDir::new("sqlite-list-by-status");
        let store = SqliteStore::open(&dir.path().join("list.db")).unwrap();
        let plan = query_plan(
            &store,
            &account_runs_sql(Some(RunStatus::Running)),
            params!["acme", None::<String>, 10, None::<i64>, None::<String>],
        );
        assert!(
            plan.iter()
                .any(|step| step.contains("runs_by_status (status=? AND account=?)")),
            "{plan:?}"
        );
        // Only runs created in the same millisecond are sorted, by id.
        assert!(
            !plan
                .iter()
                .any(|step| step == "USE TEMP B-TREE FOR ORDER BY"),
            "{plan:?}"
        );
    }

    /// Regression guard for the migration that made `seq` the row id: a
    /// run's records keep their order through it (here rows stored out of
    /// `seq` order), and a record written after it comes last.
    #[test]
    fn records_keep_their_order_when_seq_becomes_the_row_id() {
        let dir = flow_tests::TempDir::new("sqlite-migrate-seq");
        let path = dir.path().join("seq.db");
        let before = MIGRATIONS
            .iter()
            .position(|migration| migration.contains("step_runs_by_row"))
            .expect("the migration that made seq the row id");
        let record = |path: &str| {
            json!({
                "path": path, "step_id": path, "kind": "recipe", "status": "completed",
                "input": {}, "output": null, "error": null, "attempts": [],
                "started_ms": 1, "ended_ms": 2
            })
        };
        {
            let conn = Connection::open(&path).unwrap();
            for migration in &MIGRATIONS[..before] {
                conn.execute_batch(migration).unwrap();
            }
            conn.pragma_update(None, "user_version", before as i64)
                .unwrap();
            conn.execute_batch(
                "INSERT INTO plans (hash, json) VALUES ('h', '{}');
                 INSERT INTO runs (id, workflow, plan_hash, status, input, created_ms, updated_ms)
                     VALUES ('r1', 'w', 'h', 'completed', '{}', 1, 1);",
            )
            .unwrap();
            for (step, seq) in [("second", 9), ("first", 4)] {
                conn.execute(
                    "INSERT INTO step_runs (run_id, path, status, record, seq) VALUES ('r1', ?1, 'completed', ?2, ?3)",
                    params![step, record(step).to_string(), seq],
                )
                .unwrap();
            }
        }
        let store = SqliteStore::open(&path).expect("migrates");
        lock(&store.conn)
            .execute(
                "INSERT INTO step_runs (run_id, path, status, record) VALUES ('r1', 'third', 'completed', ?1)",
                [record("third").to_string()],
            )
            .unwrap();
        let paths: Vec<String> = store
            .step_records("r1")
            .unwrap()
            .into_iter()
            .map(|record| record.path)
            .collect();
        assert_eq!(paths, ["first", "second", "third"]);
    }

    /// A store written before accounts owned knowledge and notifications
    /// (schema version 4), with data in every table the later migrations
    /// change, opens at the current version: each row keeps its data and
    /// gets the account it belongs to, and the pending gate its due time.
    #[test]
    fn a_populated_version_4_store_migrates_to_the_current_schema() {
        let dir = flow_tests::TempDir::new("sqlite-migrate-v4");
        let path = dir.path().join("v4.db");
        {
            let conn = Connection::open(&path).unwrap();
            for migration in &MIGRATIONS[..4] {
                conn.execute_batch(migration).unwrap();
            }
            conn.pragma_update(None, "user_version", 4).unwrap();
            let gate = json!({
                "path": "ok", "step_id": "ok", "kind": "approval", "status": "pending",
                "input": { "path": "ok", "step_id": "ok", "approvers": ["boss@acme.io"], "message": "go?",
                           "expires_ms": 1000, "on_reject": "fail", "on_expire": "reject" },
                "output": null, "error": null, "attempts": [], "started_ms": 5000, "ended_ms": 5000
            });
            conn.execute_batch(&format!(
                "INSERT INTO plans VALUES ('h', '{{}}');
                 INSERT INTO runs (id, workflow, plan_hash, status, input, created_ms, updated_ms, account)
                     VALUES ('r1', 'w', 'h', 'pending_approval', '{{}}', 1, 1, 'acme');
                 INSERT INTO step_runs (run_id, path, status, record, seq) VALUES ('r1', 'ok', 'pending', '{gate}', 1);
                 INSERT INTO kb_documents VALUES ('notes', 'T', 3, 'text', NULL);
                 INSERT INTO kb_search VALUES ('notes', 'T', 'text');
                 INSERT INTO kb_keys VALUES ('k1', '{{\"version\": 3}}');
                 INSERT INTO notifications (run_id, department, subject, message, key, created_ms)
                     VALUES ('r1', 'support', NULL, 'look', 'h1', 2);"
            ))
            .unwrap();
        }
        let store = SqliteStore::open(&path).expect("migrates");
        let conn = lock(&store.conn);
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version as usize, MIGRATIONS.len());
        let owner = |sql: &str| -> String { conn.query_row(sql, [], |row| row.get(0)).unwrap() };
        assert_eq!(owner("SELECT account FROM kb_documents"), "acme");
        assert_eq!(owner("SELECT account FROM kb_keys"), "acme");
        assert_eq!(owner("SELECT account FROM kb_search"), "acme");
        assert_eq!(owner("SELECT content FROM kb_documents"), "text");
        // The document and its row of the full-text index are linked.
        assert_eq!(
            owner("SELECT s.content FROM kb_search s JOIN kb_documents d ON d.search_id = s.rowid"),
            "text"
        );
        drop(conn);
        let notes = store
            .notifications(
                "acme",
                &["support".to_string()],
                "sam@acme.io",
                &NotificationQuery {
                    unread_only: false,
                    limit: 10,
                },
            )
            .unwrap();
        assert_eq!(notes.len(), 1, "the run's account: {notes:?}");
        assert_eq!(notes[0].message, "look");
        assert!(
            store.to_mail(u64::MAX, 10).unwrap().is_empty(),
            "old ones are not mailed now"
        );
        let due: Vec<String> = store
            .expired_gates(6_000)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(due, ["r1"], "the gate's due time was filled in");
        assert!(store.expired_gates(5_999).unwrap().is_empty());
    }
}
