//! Counts of what this process has under way, by key: each account's runs
//! it drives, deploys compiling and webhook attempts out, and the decided
//! runs waiting for a place, by run id; and the guard that counts one
//! while it lives. A quota is checked and counted under one lock, so that
//! requests at the same moment cannot all pass a count taken before any of
//! them, and a count cannot outlive what it counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flow_runtime::sync::lock;

/// The counts, by key; keys at zero are not kept.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    by_key: Mutex<HashMap<String, usize>>,
    /// For each key someone has waited for room under, what wakes them as
    /// its count goes down: a run's end wakes its own account's waiters
    /// only (one shared wake-up woke every account's, at every run's end).
    freed: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl Counts {
    /// Counts one more of `key`'s, whatever the count.
    pub(crate) fn count(self: &Arc<Self>, key: &str) -> Counted {
        self.count_within(key, usize::MAX)
            .expect("no count reaches usize::MAX")
    }

    /// Counts one more of `key`'s, unless `most` are counted already.
    pub(crate) fn count_within(self: &Arc<Self>, key: &str, most: usize) -> Option<Counted> {
        let mut counts = lock(&self.by_key);
        let count = counts.entry(key.to_string()).or_default();
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(Counted {
            counts: Arc::clone(self),
            key: key.to_string(),
        })
    }

    /// Counts one more of `key`'s once fewer than `most` are: waits for
    /// one of them to end if need be.
    pub(crate) async fn count_once_within(self: &Arc<Self>, key: &str, most: usize) -> Counted {
        let wake = Arc::clone(lock(&self.freed).entry(key.to_string()).or_default());
        loop {
            // Listening before looking: a count that goes down between the
            // look and the wait still wakes it.
            let freed = wake.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(counted) = self.count_within(key, most) {
                return counted;
            }
            freed.await;
        }
    }

    /// The keys with something counted, and how much.
    pub(crate) fn by_key(&self) -> Vec<(String, usize)> {
        lock(&self.by_key)
            .iter()
            .map(|(key, count)| (key.clone(), *count))
            .collect()
    }

    /// Whether `key` has something counted.
    pub(crate) fn holds(&self, key: &str) -> bool {
        lock(&self.by_key).contains_key(key)
    }
}

/// One of a key's counted while it lives.
#[derive(Debug)]
pub(crate) struct Counted {
    counts: Arc<Counts>,
    key: String,
}

impl Counted {
    /// Whose it is: the account, or the run.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts.by_key);
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
        drop(counts);
        if let Some(freed) = lock(&self.counts.freed).get(&self.key) {
            freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count held to its most is counted again as soon as one ends, by
    /// whoever waits for room.
    #[tokio::test]
    async fn a_waiter_is_counted_once_one_ends() {
        let counts = Arc::new(Counts::default());
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
        assert_eq!(second.key(), "acme");
        assert_eq!(counts.by_key(), vec![("acme".to_string(), 1)]);
        drop(second);
        assert!(counts.by_key().is_empty(), "keys at zero go");
    }
}
