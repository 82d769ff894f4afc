//! The writer thread: every write of the store goes through its queue and is
//! applied in batches, one transaction and one fsync each (group commit); each
//! item is answered after the commit that made it durable.

use super::*;

pub(super) type Reply = oneshot::Sender<Result<(), StoreError>>;

/// Why one write of a batch did not apply.
pub(super) enum WriteError {
    /// The database failed it.
    Store(StoreError),
    /// A decision the rules refuse (not pending, not an approver, ended run).
    Refused(DecideError),
}

/// A decision on an approval, applied by the writer.
pub(super) struct Decide {
    pub(super) run_id: String,
    pub(super) path: String,
    pub(super) decision: Decision,
}

/// The writer's queue: one item's worth of work each, answered after the
/// commit that made it durable (or with why it could not apply).
pub(super) enum Write {
    /// A run's journal write (`JournalBackend::write`): its row if new, its
    /// records, its end.
    Journal {
        run: Arc<RunHandle>,
        write: Box<EncodedWrite>,
        reply: Reply,
    },
    Decide {
        decision: Decide,
        reply: oneshot::Sender<Result<Result<(), DecideError>, StoreError>>,
    },
    /// A run's row written with the journal's commits: one fsync serves many
    /// run starts and ends. Answers the number of rows changed. With
    /// `fenced_by`, it applies only while that run is this process's (a
    /// handoff's notification, as a step's records).
    Statement {
        fenced_by: Option<Fence>,
        sql: &'static str,
        params: Vec<rusqlite::types::Value>,
        reply: oneshot::Sender<Result<usize, StoreError>>,
    },
    /// A `kb_write` step's document, written with the journal's commits
    /// rather than in a transaction and fsync of its own on the caller's
    /// thread: a loop of writes at high concurrency held every worker
    /// thread of the async runtime waiting for the database, and every
    /// other account's runs with them. Answers the document's id and version.
    /// A step's document is fenced by its run (`fenced_by`), as the step's
    /// records are; a result destination's is written outside any run.
    Document {
        fenced_by: Option<Fence>,
        account: String,
        write: Box<KbWrite>,
        reply: oneshot::Sender<Result<Value, StoreError>>,
    },
}

/// What a write of a batch did, when it applied.
pub(super) enum Written {
    /// Rows changed.
    Rows(usize),
    /// A KB document's id and version.
    Document(Value),
}

impl Write {
    pub(super) fn reply(self, result: Result<Written, WriteError>) {
        // Only decisions are ever refused; the rest fail in the store.
        let stored = |result: Result<Written, WriteError>| {
            result.map_err(|error| match error {
                WriteError::Store(error) => error,
                WriteError::Refused(refused) => StoreError::Database(refused.to_string()),
            })
        };
        let rows = |written| match written {
            Written::Rows(rows) => rows,
            Written::Document(_) => 1,
        };
        // A caller that went away no longer needs the answer.
        match self {
            Write::Journal { reply, .. } => {
                let _ = reply.send(stored(result).map(|_| ()));
            }
            Write::Decide { reply, .. } => {
                let _ = reply.send(match result {
                    Ok(_) => Ok(Ok(())),
                    Err(WriteError::Refused(refused)) => Ok(Err(refused)),
                    Err(WriteError::Store(error)) => Err(error),
                });
            }
            Write::Statement { reply, .. } => {
                let _ = reply.send(stored(result).map(rows));
            }
            Write::Document { reply, .. } => {
                let _ = reply.send(stored(result).map(|written| match written {
                    Written::Document(document) => document,
                    Written::Rows(_) => Value::Null,
                }));
            }
        }
    }
}

/// Records how an invocation of a run ended and gives the run up, if this
/// process still owns it: `finish_run`'s and a journal's end.
pub(super) const FINISH_RUN: &str = "UPDATE runs SET status = ?2, outcome = ?3, updated_ms = ?4, active_ms = active_ms + ?5, owner = NULL
     WHERE id = ?1 AND owner = ?6";

/// [`FINISH_RUN`] for an invocation's own end, in the redrive it opened
/// in (`?7`): an end an earlier invocation still had queued when the run
/// was cancelled and redriven in this same process does not end the run.
const FINISH_INVOCATION: &str = "UPDATE runs SET status = ?2, outcome = ?3, updated_ms = ?4, active_ms = active_ms + ?5, owner = NULL
     WHERE id = ?1 AND owner = ?6 AND redrives = ?7";

pub(super) fn finish_params(id: &str, end: &RunEnd) -> [rusqlite::types::Value; 6] {
    [
        id.to_string().into(),
        end.status.as_str().to_string().into(),
        end.outcome.to_string().into(),
        now_ms().into(),
        (end.active.as_millis() as i64).into(),
        owner().to_string().into(),
    ]
}

/// How long the writer polls an empty queue before it sleeps on it. One
/// run after another queues its next record some 20 - 40 µs after its
/// commit was answered, and waking a sleeping writer took about as long
/// again: B1 one run after another went from 6,185 - 7,247 to 7,090 -
/// 7,313 steps/s with this poll (five alternated runs each), B1 at once
/// unchanged. The cost is at most this much of the writer's own core per
/// commit when nothing comes.
const POLL_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(60);

/// The next write of the queue, polled for [`POLL_BEFORE_SLEEP`] before
/// sleeping on it; `None` once every sender is gone.
fn next_write(queue: &Receiver<Write>) -> Option<Write> {
    let polled = std::time::Instant::now();
    while polled.elapsed() < POLL_BEFORE_SLEEP {
        match queue.try_recv() {
            Ok(write) => return Some(write),
            Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
            Err(mpsc::TryRecvError::Disconnected) => return None,
        }
    }
    queue.recv().ok()
}

/// How long a batch of new runs' rows alone, which no one waits for,
/// waits for a write someone does: a quick first step's record comes some
/// tens of microseconds after its run's row, and one commit then carries
/// both (B1 one run after another: ten commits for ten steps, not eleven),
/// while a run whose first call takes a model's seconds has its row
/// durable a moment after the call went out.
const START_ALONE_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

impl Write {
    fn start_alone(&self) -> bool {
        matches!(self, Write::Journal { write, .. } if write.write.start_alone())
    }
}

/// The writer thread: group commit of step records until every sender is gone.
pub(super) fn write_batches(mut conn: Connection, queue: Receiver<Write>) {
    const MAX_BATCH: usize = 4096;
    let gather = |batch: &mut Vec<Write>| {
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
    };
    let mut owned = Owned::default();
    while let Some(first) = next_write(&queue) {
        let mut batch = vec![first];
        gather(&mut batch);
        let waited = std::time::Instant::now();
        while batch.len() < MAX_BATCH && batch.iter().all(Write::start_alone) {
            let Some(left) = START_ALONE_WAIT.checked_sub(waited.elapsed()) else {
                break;
            };
            match queue.recv_timeout(left) {
                Ok(next) => {
                    batch.push(next);
                    gather(&mut batch);
                }
                Err(_) => break,
            }
        }
        // Another process holding the write lock past the busy timeout
        // (a `flow` command on the same file, a backup, a paused peer) is
        // waited out: failing the batch failed each run whose record it
        // held, for a lock that is released in time. A lock held past
        // `LONGEST_WRITE_WAIT` fails the batch as before, so that a process
        // that holds it for good (stopped, hung) stops this one too, with
        // the cause, rather than leaving every run waiting unseen.
        let written =
            waiting_out_locks("the writes", || write_batch(&mut conn, &mut owned, &batch));
        match written {
            Ok(results) => {
                for (write, result) in batch.into_iter().zip(results) {
                    write.reply(result);
                }
            }
            Err(error) => {
                // What the rolled-back transaction found owned (a run it
                // created, say) is not so.
                owned = Owned::default();
                let error = StoreError::from(error);
                for write in batch {
                    write.reply(Err(WriteError::Store(error.clone())));
                }
            }
        }
    }
}

/// Makes `attempt` (a write) again while another connection holds the
/// write lock past the busy timeout, for up to `LONGEST_WRITE_WAIT`, with
/// a warning each time that says what waits.
pub(super) fn waiting_out_locks<T>(
    what: &str,
    mut attempt: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let waited = std::time::Instant::now();
    loop {
        match attempt() {
            Err(error)
                if is_busy(&error) && waited.elapsed() < crate::store::LONGEST_WRITE_WAIT =>
            {
                tracing::warn!(
                    waited_secs = waited.elapsed().as_secs(),
                    "the database is locked by another connection; {what} wait for it"
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            done => return done,
        }
    }
}

/// Whether SQLite gave up waiting for another connection's lock
/// (`SQLITE_BUSY`; `SQLITE_LOCKED` is a conflict within this connection,
/// which waiting does not clear).
pub(super) fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(failure, _)
            if failure.code == rusqlite::ErrorCode::DatabaseBusy
    )
}

/// Writes a batch in one transaction. A database error fails the whole batch;
/// a decision that cannot apply (not pending, not an approver) or a statement
/// that breaks a constraint fails alone.
pub(super) fn write_batch(
    conn: &mut Connection,
    owned: &mut Owned,
    batch: &[Write],
) -> rusqlite::Result<Vec<Result<Written, WriteError>>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Under the write lock: no other connection commits until this one has.
    owned.refresh(&tx)?;
    let mut results = Vec::with_capacity(batch.len());
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO step_runs (run_id, path, status, record, due_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (run_id, path) DO UPDATE SET status = excluded.status, record = excluded.record,
                 due_ms = excluded.due_ms
             WHERE step_runs.status IN ('pending', 'retrying', 'redriven')",
        )?;
        for write in batch {
            match write {
                Write::Journal { run, write, .. } => {
                    results.push(write_journal(&tx, &mut insert, owned, run, write)?);
                }
                Write::Decide { decision, .. } => {
                    results.push(
                        apply_decision(&tx, decision)?
                            .map(|()| Written::Rows(1))
                            .map_err(WriteError::Refused),
                    );
                }
                // A document that fails (a constraint) fails alone: its
                // statements are undone to the savepoint before it.
                Write::Document { fenced_by, .. } | Write::Statement { fenced_by, .. }
                    if !holds_if_fenced(&tx, owned, fenced_by.as_ref())? =>
                {
                    results.push(Err(WriteError::Store(StoreError::LeaseLost)));
                }
                Write::Document { account, write, .. } => {
                    tx.execute_batch("SAVEPOINT kb_write")?;
                    match write_document(&tx, account, write) {
                        Ok(document) => {
                            tx.execute_batch("RELEASE kb_write")?;
                            results.push(Ok(Written::Document(document)));
                        }
                        Err(error) if tx.is_autocommit() => return Err(error),
                        Err(error) => {
                            tx.execute_batch("ROLLBACK TO kb_write; RELEASE kb_write")?;
                            results.push(Err(WriteError::Store(error.into())));
                        }
                    }
                }
                // A statement that fails (a run id taken twice) fails alone:
                // SQLite undoes that statement and the transaction goes on.
                Write::Statement { sql, params, .. } => {
                    if *sql == FINISH_RUN
                        && let Some(rusqlite::types::Value::Text(run)) = params.first()
                    {
                        owned.release(run);
                    }
                    let result = tx.prepare_cached(sql).and_then(|mut statement| {
                        statement.execute(rusqlite::params_from_iter(params.iter()))
                    });
                    // Some errors (disk full, I/O) roll the whole transaction
                    // back, not just the statement: then the batch fails.
                    match result {
                        Err(error) if tx.is_autocommit() => return Err(error),
                        result => results.push(
                            result
                                .map(Written::Rows)
                                .map_err(|e| WriteError::Store(e.into())),
                        ),
                    }
                }
            }
        }
    }
    tx.commit()?;
    Ok(results)
}

/// Whether a write fenced by run `fenced_by` may apply: always when it is
/// fenced by none.
fn holds_if_fenced(
    tx: &rusqlite::Transaction<'_>,
    owned: &mut Owned,
    fenced_by: Option<&Fence>,
) -> rusqlite::Result<bool> {
    match fenced_by {
        Some(fence) => owned.holds(tx, fence),
        None => Ok(true),
    }
}

/// An invocation of a run, as a write is fenced by it: the run is this
/// process's (`owner`) and still in the redrive the invocation opened in
/// (`epoch`, `runs.redrives`), as PostgreSQL fences on its epoch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Fence {
    run: String,
    epoch: i64,
}

impl Fence {
    pub(super) fn of(run: &RunHandle) -> Fence {
        Fence {
            run: run.id.clone(),
            epoch: run.epoch,
        }
    }
}

/// The runs this process's writer last found to be this process's
/// (`runs.owner`), as of the database's `data_version`. Only another
/// connection's commit can take a run away from its process (`flow
/// cancel`, a redrive, a recovery, each in a process or connection of its
/// own), and any such commit moves the writer connection's `data_version`
/// (its own commits do not): so a run found owned stays so until then, and
/// one process alone (B1) asks once per run.
#[derive(Default)]
pub(super) struct Owned {
    version: Option<i64>,
    runs: std::collections::HashSet<Fence>,
}

impl Owned {
    /// Forgets what was found if another connection has committed since.
    fn refresh(&mut self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        let version: i64 = tx.query_row("PRAGMA data_version", [], |row| row.get(0))?;
        if self.version != Some(version) {
            self.runs.clear();
            self.version = Some(version);
        }
        Ok(())
    }

    /// Whether the invocation `fence` names may write for its run now.
    fn holds(&mut self, tx: &rusqlite::Transaction<'_>, fence: &Fence) -> rusqlite::Result<bool> {
        if self.runs.contains(fence) {
            return Ok(true);
        }
        let holds = tx
            .prepare_cached("SELECT 1 FROM runs WHERE id = ?1 AND owner = ?2 AND redrives = ?3")?
            .exists(params![fence.run, owner(), fence.epoch])?;
        if holds {
            self.runs.insert(fence.clone());
        }
        Ok(holds)
    }

    /// `run` was given up by this process's own write.
    fn release(&mut self, run: &str) {
        self.runs.retain(|fence| fence.run != run);
    }
}

/// Applies one journal write in the writer's transaction: the run's row if
/// new, its records, its end. A run's row that cannot be inserted (an id
/// taken) fails this write alone, as does a write for a run that is no
/// longer this process's (`LeaseLost`: cancelled, redriven or recovered by
/// another process while this one was paused or between two steps), which
/// then writes nothing: before, its records went in, and a stale step's
/// output could stand in the journal beside the one the run went on with.
pub(super) fn write_journal(
    tx: &rusqlite::Transaction<'_>,
    insert: &mut rusqlite::CachedStatement<'_>,
    owned: &mut Owned,
    run: &RunHandle,
    encoded: &EncodedWrite,
) -> rusqlite::Result<Result<Written, WriteError>> {
    let write = &encoded.write;
    if let Some((start, input)) = encoded.start() {
        let inserted = tx.prepare_cached(
            // A new run's row goes out alone as its first attempt does, and
            // again with its next write waited for: the second does nothing.
            "INSERT INTO runs (id, workflow, plan_hash, status, input, created_ms, updated_ms, owner, account, history)
             VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?5, ?6, ?7, ?8)
             ON CONFLICT (id) DO NOTHING",
        ).and_then(|mut statement| statement.execute(params![
                run.id,
                start.workflow,
                start.plan_hash,
                input,
                now_ms(),
                owner(),
                run.account,
                start.history(),
            ]));
        match inserted {
            Err(error) if tx.is_autocommit() => return Err(error),
            Err(error) => return Ok(Err(WriteError::Store(error.into()))),
            Ok(_) => {}
        }
    }
    // An end alone is fenced by its own statement.
    if !write.records.is_empty() && !owned.holds(tx, &Fence::of(run))? {
        return Ok(Err(WriteError::Store(StoreError::LeaseLost)));
    }
    for (record, json) in write.records.iter().zip(&encoded.records) {
        insert.execute(params![
            run.id,
            record.path,
            record.status.as_str(),
            json,
            gate_due_ms(record).map(|ms| ms as i64),
        ])?;
        notify_gate(tx, &run.id, record)?;
    }
    if let Some(end) = &write.end {
        let [id, status, outcome, at, active, owner] = finish_params(&run.id, end);
        let ended = tx
            .prepare_cached(FINISH_INVOCATION)?
            .execute(params![id, status, outcome, at, active, owner, run.epoch])?;
        owned.release(&run.id);
        if ended == 0 {
            return Ok(Err(WriteError::Store(StoreError::LeaseLost)));
        }
    }
    Ok(Ok(Written::Rows(1)))
}

/// Creates or updates `write`'s document of `account`, unless its
/// idempotency key wrote one before (then that write's result); its id and
/// version.
pub(super) fn write_document(
    tx: &rusqlite::Transaction<'_>,
    account: &str,
    write: &KbWrite,
) -> rusqlite::Result<Value> {
    if let Some(key) = &write.key {
        let first: Option<String> = tx
            .prepare_cached("SELECT result FROM kb_keys WHERE account = ?1 AND key = ?2")?
            .query_row(params![account, key], |row| row.get(0))
            .optional()?;
        if let Some(first) = first {
            return Ok(serde_json::from_str(&first).unwrap_or(Value::Null));
        }
    }
    let (version, search_id): (i64, Option<i64>) = tx
        .prepare_cached(
            "INSERT INTO kb_documents (account, collection, title, version, content, metadata, department) VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)
             ON CONFLICT (account, collection, title) DO UPDATE SET version = version + 1, content = excluded.content, metadata = excluded.metadata,
                 department = COALESCE(excluded.department, department)
             RETURNING version, search_id",
        )?
        .query_row(
            params![account, write.collection, write.title, write.content, write.metadata.as_ref().map(Value::to_string), write.department],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
    match search_id {
        Some(search_id) => {
            tx.prepare_cached("UPDATE kb_search SET content = ?2 WHERE rowid = ?1")?
                .execute(params![search_id, write.content])?;
        }
        None => {
            tx.prepare_cached(
                "INSERT INTO kb_search (account, collection, title, content) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![account, write.collection, write.title, write.content])?;
            let search_id = tx.last_insert_rowid();
            tx.prepare_cached(
                "UPDATE kb_documents SET search_id = ?4 WHERE account = ?1 AND collection = ?2 AND title = ?3",
            )?
            .execute(params![account, write.collection, write.title, search_id])?;
        }
    }
    let result =
        json!({ "id": format!("{}/{}", write.collection, write.title), "version": version });
    if let Some(key) = &write.key {
        tx.prepare_cached("INSERT INTO kb_keys (account, key, result) VALUES (?1, ?2, ?3)")?
            .execute(params![account, key, result.to_string()])?;
    }
    Ok(result)
}

/// A gate reached is a notification to each of its approvers (a person or
/// an approver group), stored in the transaction that stores the gate: a
/// parked run never waits unannounced, whatever happens to the process after
/// the commit. The key makes writing the record again a no-op.
pub(super) fn notify_gate(
    tx: &rusqlite::Transaction<'_>,
    run_id: &str,
    record: &StepRecord,
) -> rusqlite::Result<()> {
    if record.kind != StepKind::Approval || record.status != StepStatus::Pending {
        return Ok(());
    }
    let Ok(gate) = serde_json::from_value::<PendingApproval>(record.input.clone()) else {
        return Ok(());
    };
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO notifications
             (account, kind, audience, run_id, step_path, subject, message, key, created_ms)
         SELECT account, 'approval', ?2, id, ?3, 'Approval needed: ' || workflow || ' (' || ?4 || ')',
                ?5, ?6, ?7
         FROM runs WHERE id = ?1",
    )?;
    for approver in &gate.approvers {
        insert.execute(params![
            run_id,
            approver,
            gate.path,
            gate.step_id,
            gate.message,
            crate::store::gate_notification_key(run_id, record, approver),
            now_ms()
        ])?;
    }
    Ok(())
}

pub(super) fn apply_decision(
    tx: &rusqlite::Transaction<'_>,
    decide: &Decide,
) -> rusqlite::Result<Result<(), DecideError>> {
    let Decide {
        run_id,
        path,
        decision,
    } = decide;
    let (run_status, round): (Option<RunStatus>, u32) = tx
        .query_row(
            "SELECT status, redrives FROM runs WHERE id = ?1",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?
        .map_or((None, 0), |(status, round)| (Some(status), round));
    if !matches!(
        run_status,
        Some(RunStatus::PendingApproval | RunStatus::Running)
    ) {
        let error = DecideError::RunEnded {
            run_id: run_id.clone(),
            status: run_status.map_or("unknown", RunStatus::as_str).into(),
        };
        return Ok(Err(error));
    }
    let record: Option<String> = tx
        .query_row(
            "SELECT record FROM step_runs WHERE run_id = ?1 AND path = ?2",
            params![run_id, path],
            |row| row.get(0),
        )
        .optional()?;
    let record = record.and_then(|json| record::decode(&json).ok());
    let decided = match decide_record(record.as_ref(), path, decision, now_ms() as u64, round) {
        Ok(decided) => decided,
        Err(error) => return Ok(Err(error)),
    };
    tx.execute(
        "UPDATE step_runs SET status = ?3, record = ?4 WHERE run_id = ?1 AND path = ?2",
        params![
            run_id,
            path,
            decided.status.as_str(),
            record::encode(&decided)
        ],
    )?;
    // A parked run goes on with its decision, this process's to claim: in
    // the same commit, so that if it dies before its claim the run is an
    // orphan that recovery takes, not parked at a decided gate for good
    // (see `RunStore::decide`).
    tx.execute(
        "UPDATE runs SET status = 'running', owner = ?2, updated_ms = ?3
         WHERE id = ?1 AND status = 'pending_approval'",
        params![run_id, super::owner(), now_ms()],
    )?;
    Ok(Ok(()))
}
