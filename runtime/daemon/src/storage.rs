//! The stored-bytes quota: how much of the store one account's data may
//! take (`stored_bytes`). Measuring reads every row of an account, so it
//! is done by a sweep, when flowd starts and then every `MEASURE_EVERY`,
//! never inside a request; between measurements each deploy and run start
//! adds what it stores.
//! Past the quota, deploys and run starts answer 429; runs under way go on
//! (a quota stops what comes in, not what was accepted).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;

use crate::server::{Daemon, Problem, store_problem};

/// How often every account's stored bytes are measured again.
pub(crate) const MEASURE_EVERY: Duration = Duration::from_secs(60);

/// The bytes each account's data took at its last measurement, plus what
/// was admitted since.
#[derive(Debug, Default)]
pub(crate) struct StoredBytes {
    by_account: Mutex<HashMap<String, u64>>,
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
        let stored = self.lock().get(account).copied().unwrap_or(0);
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
        *self.lock().entry(account.to_string()).or_insert(stored) += adding;
        Ok(())
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
        self.lock().insert(account.to_string(), stored);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.by_account.lock().unwrap_or_else(|p| p.into_inner())
    }
}
