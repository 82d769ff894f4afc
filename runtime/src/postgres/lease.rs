//! Lease renewals: the heartbeats of every run this process executes,
//! queued and applied in batches, one statement (one commit) each.
//!
//! A run's heartbeat comes once a second while it runs; one statement and
//! commit each was a third of B9's commits on PostgreSQL, and with model
//! calls of seconds it would be several commits per step. They are not
//! part of the journal writer's batches: a renewal updates the run's row,
//! which waits for any transaction holding a share lock on it (a KB write
//! or handoff of the run), and every run's records would wait with it.

use std::collections::{BTreeMap, HashSet};

use super::*;

/// A heartbeat for the renewer, answered once its batch is committed.
pub(super) struct Renewal {
    pub(super) run: RunHandle,
    /// The active time to add to the run's.
    pub(super) active_ms: i64,
    /// Whether the run was still this process's in `run`'s epoch (nothing
    /// changed if not).
    pub(super) reply: oneshot::Sender<Result<bool, StoreError>>,
}

/// The renewer task: renewals batched until the store is dropped.
pub(super) async fn renew_batches(
    pool: Pool,
    owner: String,
    lease: Duration,
    mut queue: mpsc::UnboundedReceiver<Renewal>,
) {
    const MAX_BATCH: usize = 4096;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let renewed = renew(&pool, &owner, lease, &batch).await;
        for (at, renewal) in batch.drain(..).enumerate() {
            let answer = match &renewed {
                Ok(renewed) => Ok(renewed[at]),
                Err(error) => Err(error.clone()),
            };
            // A caller that went away no longer needs the answer.
            let _ = renewal.reply.send(answer);
        }
    }
}

/// Renews the leases of `batch` in one statement: in each renewal's epoch
/// and while the run is `owner`'s, adding its active time (several of one
/// run added up: one statement cannot change a row twice). Answers, for
/// each renewal, whether its run was renewed.
async fn renew(
    pool: &Pool,
    owner: &str,
    lease: Duration,
    batch: &[Renewal],
) -> Result<Vec<bool>, StoreError> {
    let mut active: BTreeMap<(&str, i64), i64> = BTreeMap::new();
    for renewal in batch {
        *active
            .entry((renewal.run.id.as_str(), renewal.run.epoch))
            .or_default() += renewal.active_ms;
    }
    let mut ids = Vec::with_capacity(active.len());
    let mut epochs = Vec::with_capacity(active.len());
    let mut actives = Vec::with_capacity(active.len());
    for ((id, epoch), ms) in &active {
        ids.push(*id);
        epochs.push(*epoch);
        actives.push(*ms);
    }
    let client = pool.get().await?;
    let statement = client
        .prepare_cached(
            "UPDATE runs SET active_ms = active_ms + r.active,
                 lease_until = now() + $4 * interval '1 millisecond'
             FROM unnest($1::text[], $2::int8[], $3::int8[]) WITH ORDINALITY
                 AS r(id, epoch, active, at)
             WHERE runs.id = r.id AND runs.epoch = r.epoch AND runs.owner = $5
             RETURNING r.at",
        )
        .await?;
    let rows = client
        .query(
            &statement,
            &[&ids, &epochs, &actives, &millis(lease), &owner],
        )
        .await?;
    // Each row names a (run, epoch) by its place in the arrays, from 1.
    let renewed: HashSet<(&str, i64)> = rows
        .iter()
        .map(|row| row.get::<_, i64>(0) as usize - 1)
        .map(|at| (ids[at], epochs[at]))
        .collect();
    Ok(batch
        .iter()
        .map(|renewal| renewed.contains(&(renewal.run.id.as_str(), renewal.run.epoch)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStore;

    /// A renewal of `run` adding `active_ms`, its answer dropped.
    fn renewal(run: &RunHandle, active_ms: i64) -> Renewal {
        Renewal {
            run: run.clone(),
            active_ms,
            reply: oneshot::channel().0,
        }
    }

    /// Regression: one statement cannot change a row twice, and PostgreSQL
    /// applies one of several joined rows without a word; the renewals of
    /// one run in one batch must each add their time. A renewal in another
    /// epoch, or of a run that is no longer this owner's, changes nothing.
    #[tokio::test]
    async fn renewals_of_one_run_in_one_batch_each_count() {
        flow_tests::require!(Postgres);
        let schema = flow_tests::postgres::TestSchema::new();
        let store = PostgresStore::connect(&schema.url()).await.unwrap();
        store
            .execute("INSERT INTO plans (hash, json) VALUES ('p', '{}')", &[])
            .await
            .unwrap();
        let run = NewRun {
            workflow: "w".to_string(),
            plan_hash: "p".to_string(),
            input: json!({}),
            provider: None,
        };
        for id in ["run-1", "run-2"] {
            assert!(store.create_run(id, "", &run, None).await.unwrap());
        }
        store
            .execute("UPDATE runs SET owner = NULL WHERE id = 'run-2'", &[])
            .await
            .unwrap();
        let handle = |id: &str, epoch| RunHandle {
            id: id.to_string(),
            account: String::new(),
            epoch,
        };
        let mut batch: Vec<Renewal> = (0..8).map(|_| renewal(&handle("run-1", 0), 100)).collect();
        batch.push(renewal(&handle("run-1", 7), 1_000));
        batch.push(renewal(&handle("run-2", 0), 1_000));
        let renewed = renew(&store.pool, store.owner(), DEFAULT_LEASE, &batch)
            .await
            .unwrap();
        let mut expected = vec![true; 8];
        expected.extend([false, false]);
        assert_eq!(renewed, expected);
        let active = |id: &'static str| {
            let store = Arc::clone(&store);
            async move { store.run(id).await.unwrap().unwrap().active_ms }
        };
        assert_eq!(active("run-1").await, 800, "every renewal's time is added");
        assert_eq!(active("run-2").await, 0, "a run given up is not renewed");
    }
}
