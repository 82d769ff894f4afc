//! Large values freed on a blocking thread, not on the async worker.
//!
//! A plan of tens of megabytes is millions of JSON values and strings, and
//! freeing one is a walk over all of them: a 34 MB plan (2,000 recipes each
//! returning a 200-field record) took flowd's async worker 130 ms to free,
//! in which no run of any account moved and no request was answered (one
//! worker, with SQLite on two cores). Where flowd lets go of such a value on
//! the async worker, it hands it to a blocking thread instead.

use std::sync::Arc;

use flow_plan::Plan;

/// Frees `value` on a blocking thread of the current tokio runtime; where
/// there is none (a test, a runtime shutting down), here.
pub(crate) fn free_off_worker<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

/// Lets go of a shared plan: freed off the worker if this was its last
/// holder, which is cheap otherwise.
pub(crate) fn release(plan: Arc<Plan>) {
    if let Some(plan) = Arc::into_inner(plan) {
        free_off_worker(plan);
    }
}

/// A value freed off the async worker however its holder's scope ends (an
/// early return with a problem included).
pub(crate) struct FreedOffWorker<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> FreedOffWorker<T> {
    pub(crate) fn new(value: T) -> FreedOffWorker<T> {
        FreedOffWorker(Some(value))
    }
}

impl<T: Send + 'static> std::ops::Deref for FreedOffWorker<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_ref().expect("held until dropped")
    }
}

impl<T: Send + 'static> Drop for FreedOffWorker<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            free_off_worker(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FreedOffWorker, free_off_worker};
    use std::sync::mpsc;

    /// Says on which thread it was dropped.
    struct Tattletale(mpsc::Sender<std::thread::ThreadId>);

    impl Drop for Tattletale {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    /// Guards the deploy's and the plan cache's frees: a value let go of on
    /// the async worker is freed on another thread, and still freed where
    /// no runtime is.
    #[test]
    fn values_let_go_on_a_runtime_are_freed_on_a_blocking_thread() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (sent, freed_on) = mpsc::channel();
        let here = std::thread::current().id();
        runtime.block_on(async {
            free_off_worker(Tattletale(sent.clone()));
            drop(FreedOffWorker::new(Tattletale(sent.clone())));
        });
        for _ in 0..2 {
            let thread = freed_on
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("freed");
            assert_ne!(thread, here);
        }
        free_off_worker(Tattletale(sent));
        assert_eq!(freed_on.recv().unwrap(), here, "no runtime: freed at once");
    }
}
