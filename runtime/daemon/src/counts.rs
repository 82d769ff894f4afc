//! Each account's count of something this process has under way (runs it
//! drives, deploys compiling, webhook attempts out), and the guard that
//! counts one while it lives. A quota is checked and counted under one
//! lock, so that requests at the same moment cannot all pass a count taken
//! before any of them, and a count cannot outlive what it counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flow_runtime::sync::lock;

/// The counts, by account; accounts at zero are not kept.
#[derive(Debug, Default)]
pub(crate) struct AccountCounts {
    by_account: Mutex<HashMap<String, usize>>,
    /// Woken each time a count goes down, for those waiting for room.
    freed: tokio::sync::Notify,
}

impl AccountCounts {
    /// Counts one more of `account`'s, whatever the count.
    pub(crate) fn count(self: &Arc<Self>, account: &str) -> Counted {
        self.count_within(account, usize::MAX)
            .expect("no count reaches usize::MAX")
    }

    /// Counts one more of `account`'s, unless `most` are counted already.
    pub(crate) fn count_within(self: &Arc<Self>, account: &str, most: usize) -> Option<Counted> {
        let mut counts = lock(&self.by_account);
        let count = counts.entry(account.to_string()).or_default();
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(Counted {
            counts: Arc::clone(self),
            account: account.to_string(),
        })
    }

    /// Counts one more of `account`'s once fewer than `most` are: waits
    /// for one of them to end if need be.
    pub(crate) async fn count_once_within(self: &Arc<Self>, account: &str, most: usize) -> Counted {
        loop {
            // Listening before looking: a count that goes down between the
            // look and the wait still wakes it.
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(counted) = self.count_within(account, most) {
                return counted;
            }
            freed.await;
        }
    }

    /// The accounts with something counted, and how much.
    pub(crate) fn by_account(&self) -> Vec<(String, usize)> {
        lock(&self.by_account)
            .iter()
            .map(|(account, count)| (account.clone(), *count))
            .collect()
    }
}

/// One of an account's counted while it lives.
#[derive(Debug)]
pub(crate) struct Counted {
    counts: Arc<AccountCounts>,
    account: String,
}

impl Counted {
    /// Whose it is.
    pub(crate) fn account(&self) -> &str {
        &self.account
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts.by_account);
        if let Some(count) = counts.get_mut(&self.account) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.account);
            }
        }
        drop(counts);
        self.counts.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count held to its most is counted again as soon as one ends, by
    /// whoever waits for room.
    #[tokio::test]
    async fn a_waiter_is_counted_once_one_ends() {
        let counts = Arc::new(AccountCounts::default());
        let first = counts.count_within("acme", 1).expect("room for one");
        assert!(counts.count_within("acme", 1).is_none(), "held to one");
        assert!(counts.count_within("globex", 1).is_some(), "per account");
        let waiting = {
            let counts = Arc::clone(&counts);
            tokio::spawn(async move { counts.count_once_within("acme", 1).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no room yet");
        drop(first);
        let second = waiting.await.expect("the waiter ends");
        assert_eq!(second.account(), "acme");
        assert_eq!(counts.by_account(), vec![("acme".to_string(), 1)]);
        drop(second);
        assert!(counts.by_account().is_empty(), "accounts at zero go");
    }
}
