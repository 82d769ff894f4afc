//! Mutexes as the stores take them.

use std::sync::{Mutex, MutexGuard};

/// The stores' mutexes, taken even when poisoned: each critical section of
/// the stores is one insert, lookup or take, so a panic elsewhere leaves
/// the data whole.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
