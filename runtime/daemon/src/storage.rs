//! The stored-bytes quota: how much of the store one account's data may
//! take (`stored_bytes`). Measuring reads every row of an account, so it
//! is done by a sweep, when flowd starts and then every `MEASURE_EVERY`
//! (and for an account, after a deletion of its data), never inside a
//! request; between measurements each deploy and run start adds what it
//! stores, and each step record what it holds (`meter`).
//! Past the quota, deploys and run starts answer 429, and a run under way
//! stops after the record that passed it (error kind `quota`): counted only at starts,
//! one run of a 300 KB account stored 30 MB, a loop's records (an audit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;

use flow_runtime::error::{ErrorKind, StepError};
use flow_runtime::journal::StepRecord;
use flow_runtime::store::json::json_len;
use flow_runtime::sync::lock;

use crate::server::{Daemon, Problem, store_problem};

/// How often every account's stored bytes are measured again.
pub(crate) const MEASURE_EVERY: Duration = Duration::from_secs(60);

/// How long after a deletion its account is measured again: deletions in
/// a row (a client's loop) make one measurement per this much time, each
/// a read of all of the account's rows.
const REMEASURE_AFTER: Duration = Duration::from_secs(2);

/// What a step record takes besides its input, output and error: its
/// path, ids, attempts and times, as stored.
const RECORD_OVERHEAD: usize = 200;

/// The bytes each account's data took at its last measurement, plus what
/// was admitted since.
#[derive(Debug, Default)]
pub(crate) struct StoredBytes {
    /// Shared with each run's `meter`.
    by_account: Arc<Mutex<HashMap<String, u64>>>,
    /// The accounts a measurement after a deletion is due for.
    remeasuring: Mutex<std::collections::HashSet<String>>,
}

impl StoredBytes {
    /// Admits `adding` bytes more of `account`'s data, or refuses them when
    /// they would take it past its quota.
    pub(crate) async fn admit(
        &self,
        daemon: &Arc<Daemon>,
        account: &str,
        adding: u64,
    ) -> Result<(), Problem> {
        // An account not measured yet (the first sweep starts with flowd
        // and is still reading) is admitted on what it adds meanwhile:
        // measuring inside a request would make the first one of each
        // account wait for a read of all its rows.
        let stored = lock(&self.by_account).get(account).copied().unwrap_or(0);
        let quota = daemon.config.quotas(account).stored_bytes;
        if stored.saturating_add(adding) > quota {
            return Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                &format!(
                    "this account's data takes {stored} bytes of the store and this adds {adding}; its quota (stored_bytes) is {quota}: delete ended runs, old versions or KB documents"
                ),
            )
            .retry_after(MEASURE_EVERY.as_secs() as u32));
        }
        *lock(&self.by_account)
            .entry(account.to_string())
            .or_insert(stored) += adding;
        Ok(())
    }

    /// What each record of a run of `account` adds to the account's stored
    /// bytes, refused (the run stops after it) once that is past its quota.
    /// A record is counted by its input's and output's JSON, about as a
    /// store writes it, without encoding it again.
    pub(crate) fn meter(
        &self,
        daemon: &Arc<Daemon>,
        account: &str,
    ) -> impl Fn(&StepRecord) -> Result<(), StepError> + Send + Sync + 'static {
        let (stored, account) = (Arc::clone(&self.by_account), account.to_string());
        let quota = daemon.config.quotas(&account).stored_bytes;
        move |record: &StepRecord| {
            // A record that another replaces at its path (a step between
            // its attempts, a gate pending) is counted as the one that
            // stays: each counted again, a step retried five times counted
            // its input six times.
            if record.status.is_replaceable() {
                return Ok(());
            }
            let adding = RECORD_OVERHEAD
                + json_len(&record.input)
                + record.output.as_deref().map_or(0, json_len)
                + record.error.as_ref().map_or(0, |error| error.message.len());
            let mut by_account = lock(&stored);
            let total = match by_account.get_mut(&account) {
                Some(total) => total,
                None => by_account.entry(account.clone()).or_insert(0),
            };
            *total += adding as u64;
            if *total > quota {
                return Err(StepError::new(
                    ErrorKind::Quota,
                    format!(
                        "this account's data takes {total} bytes of the store, past its quota (stored_bytes) of {quota}: the run stops after this step; delete ended runs, old versions or KB documents, then redrive it"
                    ),
                ));
            }
            Ok(())
        }
    }

    /// Measures `account` again a moment after a deletion freed what it
    /// held: until the next sweep, its starts were refused for data that
    /// was gone (an audit). Deletions in a row make one measurement, as
    /// each reads all of the account's rows.
    pub(crate) fn measure_soon(daemon: &Arc<Daemon>, account: &str) {
        if !lock(&daemon.stored.remeasuring).insert(account.to_string()) {
            return;
        }
        let (daemon, account) = (Arc::clone(daemon), account.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(REMEASURE_AFTER).await;
            let measured = daemon.stored.measure(&daemon, &account).await;
            // Out of the set once measured, not before: a deletion meanwhile
            // is in this measurement or waits for the next, never two at
            // once.
            lock(&daemon.stored.remeasuring).remove(&account);
            if let Err(problem) = measured {
                tracing::error!(account = %account, "cannot measure stored bytes: {}", problem.detail());
            }
        });
    }

    /// Measures every configured account (the sweep), replacing what was
    /// admitted since the last measurement with what the store holds.
    pub(crate) async fn measure_all(&self, daemon: &Arc<Daemon>) {
        for account in &daemon.config.accounts {
            if let Err(problem) = self.measure(daemon, &account.id).await {
                tracing::error!(
                    account = %account.id,
                    "cannot measure stored bytes: {}",
                    problem.detail()
                );
            }
        }
    }

    async fn measure(&self, daemon: &Arc<Daemon>, account: &str) -> Result<(), Problem> {
        let stored = daemon
            .store
            .stored_bytes(account)
            .await
            .map_err(store_problem)?;
        lock(&self.by_account).insert(account.to_string(), stored);
        Ok(())
    }
}
