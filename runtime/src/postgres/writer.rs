//! The journal writer: the writes of every run's journal queued and applied
//! in batches, one transaction (one commit) each, fenced by each run's epoch
//! (see the parent module's doc).

use super::*;

/// A journal write for the writer, answered once its batch is committed.
pub(super) struct Append {
    pub(super) run: RunHandle,
    /// Written only while the run is still this process's in the epoch of
    /// `run` (the one its journal opened in). Encoded by the run's thread,
    /// not by this one task every run's commit waits for.
    pub(super) encoded: EncodedWrite,
    pub(super) reply: oneshot::Sender<Result<bool, StoreError>>,
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
        match insert_records(&pool, &owner, lease, &batch).await {
            Ok(written) => {
                for (append, written) in batch.drain(..).zip(written) {
                    let _ = append.reply.send(Ok(written));
                }
            }
            // One faulty record must not fail the others: each alone.
            Err(_) => {
                for append in batch.drain(..) {
                    let result =
                        insert_records(&pool, &owner, lease, std::slice::from_ref(&append))
                            .await
                            .map(|written| written[0]);
                    // A caller that went away no longer needs the answer.
                    let _ = append.reply.send(result);
                }
            }
        }
    }
}

/// Applies a batch of journal writes in one transaction (one commit): the
/// rows of new runs, the records in one statement, the notifications of the
/// gates among them in another, and the runs' ends. A record replaces a
/// stored one only while that is replaceable (an approval's record, decided
/// or expired; a retrying step's), as in the SQLite store.
///
/// Fenced: a write applies only if its run is still `owner`'s in the
/// write's epoch, checked under a share lock on the run's row, so that a
/// claim by another process (which updates that row) either waits for this
/// commit and then finds the records in the journal it loads, or comes first
/// and the write is refused. Answers, for each write, whether it applied
/// (false: refused by the fence).
pub(super) async fn insert_records(
    pool: &Pool,
    owner: &str,
    lease: Duration,
    batch: &[Append],
) -> Result<Vec<bool>, StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let mut columns = NewRunColumns::default();
    for append in batch {
        if let Some((start, input)) = append.encoded.start() {
            columns.push(&append.run, start, input);
        }
    }
    if !columns.ids.is_empty() {
        let statement = tx
            .prepare_cached(
                "INSERT INTO runs (id, account, workflow, plan_hash, status, input, created_ms,
                     updated_ms, owner, lease_until)
                 SELECT n.id, n.account, n.workflow, n.plan_hash, 'running', n.input, $6, $6, $7,
                     now() + $8 * interval '1 millisecond'
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                     AS n(id, account, workflow, plan_hash, input)",
            )
            .await?;
        tx.execute(
            &statement,
            &[
                &columns.ids,
                &columns.accounts,
                &columns.workflows,
                &columns.plan_hashes,
                &columns.inputs,
                &now_ms(),
                &owner,
                &millis(lease),
            ],
        )
        .await?;
    }
    let mut runs: Vec<&str> = batch.iter().map(|append| append.run.id.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    let statement = tx
        .prepare_cached(
            "SELECT id, epoch FROM runs WHERE id = ANY($1) AND owner = $2
             ORDER BY id FOR SHARE",
        )
        .await?;
    let live: std::collections::HashMap<String, i64> = tx
        .query(&statement, &[&runs, &owner])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let written: Vec<bool> = batch
        .iter()
        .map(|append| live.get(&append.run.id) == Some(&append.run.epoch))
        .collect();
    let admitted: Vec<&Append> = batch
        .iter()
        .zip(&written)
        .filter_map(|(append, &written)| written.then_some(append))
        .collect();
    // One statement cannot change a row twice: when a batch holds two
    // records of one path, the second replaces the first only if that one
    // is replaceable, as two statements would have had it.
    let mut chosen: Vec<(&str, &StepRecord, &str)> = Vec::with_capacity(admitted.len());
    let mut at: std::collections::HashMap<(&str, &str), usize> = Default::default();
    for append in admitted.iter().copied() {
        let encoded = &append.encoded;
        for (record, json) in encoded.write.records.iter().zip(&encoded.records) {
            let key = (append.run.id.as_str(), record.path.as_str());
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
    let gates = GateNotifications::of(&admitted);
    let statement = tx
        .prepare_cached(
            "INSERT INTO step_runs (run_id, path, status, record, due_ms)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[])
             ON CONFLICT (run_id, path) DO UPDATE
                 SET status = excluded.status, record = excluded.record, due_ms = excluded.due_ms
                 WHERE step_runs.status IN ('pending', 'retrying', 'redriven')",
        )
        .await?;
    if !run_ids.is_empty() {
        tx.execute(&statement, &[&run_ids, &paths, &statuses, &records, &due])
            .await?;
    }
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
    tx.commit().await?;
    Ok(written)
}

/// In `tx`, after the fence admitted `admitted`: records how each of their
/// runs' invocations ended, if it did, and gives the run up.
pub(super) async fn end_runs(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    admitted: &[&Append],
) -> Result<(), StoreError> {
    let mut ids = Vec::new();
    let mut statuses = Vec::new();
    let mut outcomes = Vec::new();
    let mut actives = Vec::new();
    for append in admitted {
        if let Some(end) = &append.encoded.write.end {
            ids.push(append.run.id.as_str());
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

/// The rows of runs started by a batch's journal writes, as columns.
#[derive(Default)]
pub(super) struct NewRunColumns<'a> {
    pub(super) ids: Vec<&'a str>,
    pub(super) accounts: Vec<&'a str>,
    pub(super) workflows: Vec<&'a str>,
    pub(super) plan_hashes: Vec<&'a str>,
    pub(super) inputs: Vec<&'a str>,
}

impl<'a> NewRunColumns<'a> {
    pub(super) fn push(&mut self, run: &'a RunHandle, start: &'a NewRun, input: &'a str) {
        self.ids.push(&run.id);
        self.accounts.push(&run.account);
        self.workflows.push(&start.workflow);
        self.plan_hashes.push(&start.plan_hash);
        self.inputs.push(input);
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
    pub(super) fn of(batch: &[&'a Append]) -> GateNotifications<'a> {
        let mut gates = GateNotifications::default();
        let records = batch.iter().flat_map(|append| {
            append
                .encoded
                .write
                .records
                .iter()
                .map(move |record| (append.run.id.as_str(), record))
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
                gates
                    .keys
                    .push(format!("approval:{run_id}:{}:{approver}", gate.path));
                gates.audiences.push(approver);
            }
        }
        gates
    }
}
