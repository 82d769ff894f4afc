//! The journal writer: the writes of every run's journal and new runs' rows
//! queued and applied in batches, one transaction (one commit) each, fenced
//! by each run's epoch (see the parent module's doc).

use super::*;

/// A write for the writer, answered once its batch is committed.
pub(super) struct Append {
    pub(super) what: Queued,
    pub(super) reply: oneshot::Sender<Result<bool, StoreError>>,
}

/// What a queued write does, and what its answer says.
pub(super) enum Queued {
    /// A run's journal write: its records, its row if it is new, its end.
    /// Written only while the run is still this process's in the epoch of
    /// `run` (the one its journal opened in); answered false when the
    /// fence refused it. Encoded by the run's thread, not by this one task
    /// every run's commit waits for.
    Journal {
        run: Arc<RunHandle>,
        encoded: EncodedWrite,
    },
    /// A run stored before it is driven (`create_run`); answered false
    /// when a run with its idempotency key was stored first. Each was a
    /// commit of its own, a third of B9's commits on PostgreSQL.
    Create(CreatedRun),
    /// Gives up every run this process holds `running` (`release_runs`),
    /// in the commit after every write queued before it: a journal dropped
    /// with records in hand sends them as its run's task is stopped, and
    /// the fence would refuse them once the runs are no longer this
    /// process's. Answered true.
    Release,
}

/// A run's row as `create_run` stores it.
pub(super) struct CreatedRun {
    pub(super) id: String,
    pub(super) account: String,
    pub(super) workflow: String,
    pub(super) plan_hash: String,
    pub(super) input: String,
    pub(super) idempotency_key: Option<String>,
    /// `NewRun::history`.
    pub(super) history: String,
}

impl Append {
    fn journal(&self) -> Option<(&RunHandle, &EncodedWrite)> {
        match &self.what {
            Queued::Journal { run, encoded } => Some((run, encoded)),
            Queued::Create(_) | Queued::Release => None,
        }
    }
}

/// Why a batch was not applied, and whether the connection to the
/// database was lost (then the same batch is tried again, on another).
pub(super) enum BatchError {
    /// A statement failed: nothing was written, and each write can be
    /// tried alone.
    Statement(StoreError, Lost),
    /// The commit itself failed: whether it was applied is unknown, so a
    /// `create_run` is not tried again (it would find its own key and be
    /// answered as a retry of another), nor a journal write that ends its
    /// run (applied, it gave the run up, and the fence would refuse it
    /// again: a run this process ended would be answered as taken over).
    /// Other journal writes are: writing their records and their gates'
    /// notifications twice leaves what writing them once does.
    Commit(StoreError, Lost),
}

/// Whether a database error was the connection's loss.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Lost(bool);

impl BatchError {
    fn into_error(self) -> StoreError {
        match self {
            BatchError::Statement(error, _) | BatchError::Commit(error, _) => error,
        }
    }

    fn connection_lost(&self) -> bool {
        matches!(
            self,
            BatchError::Statement(_, Lost(true)) | BatchError::Commit(_, Lost(true))
        )
    }
}

/// Whether `error` says the connection was lost rather than the statement
/// refused: closed or reset, the server ending it (`pg_terminate_backend`,
/// a restart: SQLSTATE class 08 and 57P01-57P03).
pub(super) fn connection_lost(error: &tokio_postgres::Error) -> bool {
    let ended = error.code().is_some_and(|code| {
        let code = code.code();
        code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
    });
    ended
        || error.is_closed()
        || std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>())
}

impl From<tokio_postgres::Error> for BatchError {
    fn from(error: tokio_postgres::Error) -> BatchError {
        let lost = Lost(connection_lost(&error));
        BatchError::Statement(error.into(), lost)
    }
}

impl From<deadpool_postgres::PoolError> for BatchError {
    fn from(error: deadpool_postgres::PoolError) -> BatchError {
        // No connection to be had (the server restarting, refusing): as lost.
        let lost = match &error {
            deadpool_postgres::PoolError::Backend(error) => connection_lost(error),
            deadpool_postgres::PoolError::Timeout(_) => true,
            _ => false,
        };
        BatchError::Statement(error.into(), Lost(lost))
    }
}

impl From<StoreError> for BatchError {
    fn from(error: StoreError) -> BatchError {
        BatchError::Statement(error, Lost(false))
    }
}

/// The writer task: group commit of step records until the store is dropped.
pub(super) async fn write_batches(
    pool: Pool,
    owner: String,
    lease: Duration,
    mut queue: mpsc::UnboundedReceiver<Append>,
) {
    const MAX_BATCH: usize = 4096;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // A lost connection (a backend terminated, a failover) is waited
        // out, as SQLite's writer waits out a lock: failing the batch
        // failed each run with a record in it, for an outage of moments.
        let waited = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        let outcome = loop {
            match insert_records(&pool, &owner, lease, &batch).await {
                Err(error)
                    if error.connection_lost()
                        && waited.elapsed() < crate::store::LONGEST_WRITE_WAIT =>
                {
                    tracing::warn!(
                        writes = batch.len(),
                        waited_secs = waited.elapsed().as_secs(),
                        "the connection to PostgreSQL was lost ({}); the writes wait for another",
                        error_text(&error)
                    );
                    if let BatchError::Commit(error, _) = &error {
                        answer_unrepeatable(&mut batch, error);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                outcome => break outcome,
            }
        };
        match outcome {
            Ok(written) => {
                for (append, written) in batch.drain(..).zip(written) {
                    let _ = append.reply.send(Ok(written));
                }
            }
            Err(BatchError::Commit(error, _)) => {
                for append in batch.drain(..) {
                    let _ = append.reply.send(Err(error.clone()));
                }
            }
            // One faulty record must not fail the others: each alone.
            Err(BatchError::Statement(..)) => {
                for append in batch.drain(..) {
                    let result =
                        insert_records(&pool, &owner, lease, std::slice::from_ref(&append))
                            .await
                            .map(|written| written[0])
                            .map_err(BatchError::into_error);
                    // A caller that went away no longer needs the answer.
                    let _ = append.reply.send(result);
                }
            }
        }
    }
}

fn error_text(error: &BatchError) -> String {
    match error {
        BatchError::Statement(error, _) | BatchError::Commit(error, _) => error.to_string(),
    }
}

/// Answers the writes of a batch whose commit failed with `error` that
/// cannot be made again (`BatchError::Commit`), and takes them out of it:
/// whether they were stored is unknown.
fn answer_unrepeatable(batch: &mut Vec<Append>, error: &StoreError) {
    let (unrepeatable, rest): (Vec<Append>, Vec<Append>) = std::mem::take(batch)
        .into_iter()
        .partition(|append| match &append.what {
            Queued::Create(_) => true,
            Queued::Journal { encoded, .. } => encoded.write.end.is_some(),
            // Applied or not, it may be applied again.
            Queued::Release => false,
        });
    for append in unrepeatable {
        let _ = append.reply.send(Err(error.clone()));
    }
    *batch = rest;
}

/// Applies a batch of writes in one transaction (one commit): the rows of
/// new runs in one statement, the fence on the batch's runs, the records in
/// one statement, the notifications of the gates among them in another,
/// and the runs' ends. A record replaces a stored one only
/// while that is replaceable (an approval's record, decided or expired; a
/// retrying step's), as in the SQLite store.
///
/// Fenced: a journal write applies only if its run is still `owner`'s in
/// the write's epoch, checked under a share lock on the run's
/// row, so that a claim by another process (which updates that row) either
/// waits for this commit and then finds the records in the journal it
/// loads, or comes first and the write is refused. Answers, for each write,
/// whether it applied (false: refused by the fence, or a `create_run`
/// whose idempotency key a stored run has).
pub(super) async fn insert_records(
    pool: &Pool,
    owner: &str,
    lease: Duration,
    batch: &[Append],
) -> Result<Vec<bool>, BatchError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let created = insert_runs(&tx, owner, lease, batch).await?;
    let mut runs: Vec<&str> = batch
        .iter()
        .filter_map(|append| append.journal())
        .map(|(run, _)| run.id.as_str())
        .collect();
    runs.sort_unstable();
    runs.dedup();
    let live: std::collections::HashMap<String, i64> = if runs.is_empty() {
        Default::default()
    } else {
        let statement = tx
            .prepare_cached(
                "SELECT id, epoch FROM runs WHERE id = ANY($1) AND owner = $2
                 ORDER BY id FOR SHARE",
            )
            .await?;
        tx.query(&statement, &[&runs, &owner])
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    };
    let written: Vec<bool> = batch
        .iter()
        .map(|append| match &append.what {
            Queued::Create(run) => {
                run.idempotency_key.is_none() || created.contains(run.id.as_str())
            }
            Queued::Journal { run, .. } => live.get(&run.id) == Some(&run.epoch),
            Queued::Release => true,
        })
        .collect();
    let admitted: Vec<(&RunHandle, &EncodedWrite)> = batch
        .iter()
        .zip(&written)
        .filter(|(_, written)| **written)
        .filter_map(|(append, _)| append.journal())
        .collect();
    // One statement cannot change a row twice: when a batch holds two
    // records of one path, the second replaces the first only if that one
    // is replaceable, as two statements would have had it.
    let mut chosen: Vec<(&str, &StepRecord, &str)> = Vec::with_capacity(admitted.len());
    let mut at: std::collections::HashMap<(&str, &str), usize> = Default::default();
    for (run, encoded) in admitted.iter().copied() {
        for (record, json) in encoded.write.records.iter().zip(&encoded.records) {
            let key = (run.id.as_str(), record.path.as_str());
            match at.get(&key) {
                Some(&index) if chosen[index].1.status.is_replaceable() => {
                    chosen[index] = (key.0, record.as_ref(), json.as_str());
                }
                Some(_) => {}
                None => {
                    at.insert(key, chosen.len());
                    chosen.push((key.0, record.as_ref(), json.as_str()));
                }
            }
        }
    }
    if !chosen.is_empty() {
        let mut run_ids = Vec::with_capacity(chosen.len());
        let mut paths = Vec::with_capacity(chosen.len());
        let mut statuses = Vec::with_capacity(chosen.len());
        let mut records = Vec::with_capacity(chosen.len());
        let mut due = Vec::with_capacity(chosen.len());
        for (run_id, record, json) in chosen {
            run_ids.push(run_id);
            paths.push(record.path.as_str());
            statuses.push(record.status.as_str());
            records.push(json);
            due.push(gate_due_ms(record).map(|ms| ms as i64));
        }
        let statement = tx
            .prepare_cached(
                "INSERT INTO step_runs (run_id, path, status, record, due_ms)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[])
                 ON CONFLICT (run_id, path) DO UPDATE
                     SET status = excluded.status, record = excluded.record, due_ms = excluded.due_ms
                     WHERE step_runs.status IN ('pending', 'retrying', 'redriven')",
            )
            .await?;
        tx.execute(&statement, &[&run_ids, &paths, &statuses, &records, &due])
            .await?;
    }
    let gates = GateNotifications::of(&admitted);
    if !gates.run_ids.is_empty() {
        let statement = tx
            .prepare_cached(
                "INSERT INTO notifications
                     (account, kind, audience, run_id, step_path, subject, message, key, created_ms)
                 SELECT r.account, 'approval', g.audience, r.id, g.path,
                        'Approval needed: ' || r.workflow || ' (' || g.step_id || ')',
                        g.message, g.key, $7
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                     AS g(run_id, audience, path, step_id, message, key)
                 JOIN runs r ON r.id = g.run_id
                 ON CONFLICT (account, key) DO NOTHING",
            )
            .await?;
        tx.execute(
            &statement,
            &[
                &gates.run_ids,
                &gates.audiences,
                &gates.paths,
                &gates.step_ids,
                &gates.messages,
                &gates.keys,
                &now_ms(),
            ],
        )
        .await?;
    }
    end_runs(&tx, owner, &admitted).await?;
    if batch
        .iter()
        .any(|append| matches!(append.what, Queued::Release))
    {
        // A new epoch fences off whatever this process's journals send
        // after it.
        let statement = tx
            .prepare_cached(
                "UPDATE runs SET owner = NULL, lease_until = NULL, epoch = epoch + 1
                 WHERE owner = $1 AND status = 'running'",
            )
            .await?;
        tx.execute(&statement, &[&owner]).await?;
    }
    tx.commit().await.map_err(|error| {
        let lost = Lost(connection_lost(&error));
        BatchError::Commit(error.into(), lost)
    })?;
    Ok(written)
}

/// In `tx`: the rows of the runs a batch starts, the journals' new runs
/// and `create_run`'s, in one statement. Answers the ids stored of the
/// runs with an idempotency key, the only ones a stored run can keep out
/// (any other failure fails the batch). Run ids are random, so an id
/// answers for one write.
async fn insert_runs(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    lease: Duration,
    batch: &[Append],
) -> Result<std::collections::HashSet<String>, StoreError> {
    let mut columns = NewRunColumns::default();
    let mut creates = Vec::new();
    for append in batch {
        match &append.what {
            Queued::Journal { run, encoded } => {
                if let Some((start, input)) = encoded.start() {
                    columns.push(
                        &run.id,
                        &run.account,
                        &start.workflow,
                        &start.plan_hash,
                        input,
                        None,
                    );
                    columns.histories.push(start.history());
                }
            }
            Queued::Create(run) => creates.push(run),
            Queued::Release => {}
        }
    }
    // Creates in the order of their keys: two processes inserting the same
    // two keys in opposite orders would each wait for the other's row.
    creates.sort_unstable_by_key(|run| (run.account.as_str(), run.idempotency_key.as_deref()));
    for run in creates {
        columns.push(
            &run.id,
            &run.account,
            &run.workflow,
            &run.plan_hash,
            &run.input,
            run.idempotency_key.as_deref(),
        );
        columns.histories.push(run.history.clone());
    }
    if columns.ids.is_empty() {
        return Ok(Default::default());
    }
    let statement = tx
        .prepare_cached(
            "WITH stored AS (
                 INSERT INTO runs (id, account, workflow, plan_hash, status, input, created_ms,
                     updated_ms, owner, lease_until, idempotency_key, history)
                 SELECT n.id, n.account, n.workflow, n.plan_hash, 'running', n.input, $7, $7, $8,
                     now() + $9 * interval '1 millisecond', n.key, n.history
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::text[], $10::text[]) AS n(id, account, workflow, plan_hash, input, key, history)
                 -- A key another run took, or a new run's row sent before
                 -- (alone, as its first attempt went out): nothing.
                 ON CONFLICT DO NOTHING
                 RETURNING id, idempotency_key)
             SELECT id FROM stored WHERE idempotency_key IS NOT NULL",
        )
        .await?;
    Ok(tx
        .query(
            &statement,
            &[
                &columns.ids,
                &columns.accounts,
                &columns.workflows,
                &columns.plan_hashes,
                &columns.inputs,
                &columns.keys,
                &now_ms(),
                &owner,
                &millis(lease),
                &columns.histories,
            ],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// In `tx`, after the fence admitted `admitted`: records how each of their
/// runs' invocations ended, if it did, and gives the run up.
pub(super) async fn end_runs(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    admitted: &[(&RunHandle, &EncodedWrite)],
) -> Result<(), StoreError> {
    let mut ids = Vec::new();
    let mut statuses = Vec::new();
    let mut outcomes = Vec::new();
    let mut actives = Vec::new();
    for (run, encoded) in admitted {
        if let Some(end) = &encoded.write.end {
            ids.push(run.id.as_str());
            statuses.push(end.status.as_str());
            outcomes.push(end.outcome.to_string());
            actives.push(end.active.as_millis() as i64);
        }
    }
    if ids.is_empty() {
        return Ok(());
    }
    let statement = tx
        .prepare_cached(
            "UPDATE runs SET status = e.status, outcome = e.outcome, updated_ms = $5,
                 active_ms = active_ms + e.active, owner = NULL, lease_until = NULL
             FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[])
                 AS e(id, status, outcome, active)
             WHERE runs.id = e.id AND runs.owner = $6",
        )
        .await?;
    tx.execute(
        &statement,
        &[&ids, &statuses, &outcomes, &actives, &now_ms(), &owner],
    )
    .await?;
    Ok(())
}

/// The rows of runs started by a batch, as columns.
#[derive(Default)]
struct NewRunColumns<'a> {
    ids: Vec<&'a str>,
    accounts: Vec<&'a str>,
    workflows: Vec<&'a str>,
    plan_hashes: Vec<&'a str>,
    inputs: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    /// Each run's history as stored: `NewRun::history`, pushed beside.
    histories: Vec<String>,
}

impl<'a> NewRunColumns<'a> {
    fn push(
        &mut self,
        id: &'a str,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
        input: &'a str,
        key: Option<&'a str>,
    ) {
        self.ids.push(id);
        self.accounts.push(account);
        self.workflows.push(workflow);
        self.plan_hashes.push(plan_hash);
        self.inputs.push(input);
        self.keys.push(key);
    }
}

/// The notification of each approver of each gate reached in a batch, as
/// columns. The key (the daemon's and the SQLite store's) makes storing a
/// gate's record again a no-op.
#[derive(Default)]
pub(super) struct GateNotifications<'a> {
    pub(super) run_ids: Vec<&'a str>,
    pub(super) audiences: Vec<String>,
    pub(super) paths: Vec<String>,
    pub(super) step_ids: Vec<String>,
    pub(super) messages: Vec<String>,
    pub(super) keys: Vec<String>,
}

impl<'a> GateNotifications<'a> {
    pub(super) fn of(admitted: &[(&'a RunHandle, &'a EncodedWrite)]) -> GateNotifications<'a> {
        let mut gates = GateNotifications::default();
        let records = admitted.iter().flat_map(|(run, encoded)| {
            encoded
                .write
                .records
                .iter()
                .map(move |record| (run.id.as_str(), record))
        });
        for (run_id, record) in records {
            if record.kind != flow_plan::StepKind::Approval || record.status != StepStatus::Pending
            {
                continue;
            }
            let Ok(gate) = serde_json::from_value::<PendingApproval>(record.input.clone()) else {
                continue;
            };
            for approver in gate.approvers {
                gates.run_ids.push(run_id);
                gates.paths.push(gate.path.clone());
                gates.step_ids.push(gate.step_id.clone());
                gates.messages.push(gate.message.clone());
                gates.keys.push(crate::store::gate_notification_key(
                    run_id, record, &approver,
                ));
                gates.audiences.push(approver);
            }
        }
        gates
    }
}
