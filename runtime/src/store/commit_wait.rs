//! How a run waits for its commits when its thread has nothing else to do.
//!
//! `flow run` drives its run with `block_on` on the process's main thread,
//! which slept whenever the run waited for the journal writer's commit and
//! was woken by the writer once the commit was durable. On a virtual
//! machine whose idle cores halt, that wake (an interrupt to the halted
//! core, the hypervisor scheduling it again) cost more than the step's own
//! work: B1 one run after another spent 53 - 70 µs of each step outside
//! the disk's sync, 36 - 43 µs once the thread polled instead. A thread
//! that drives one run alone loses nothing by polling for the answer a
//! while before it sleeps, as the writer polls for its next write; a
//! worker thread of the async runtime would keep other runs from going on
//! meanwhile, so only a future wrapped in [`driven_alone`] polls, and only
//! in a process of more than one core (on one, it would take the core the
//! writer needs). docs/benchmarks.md ("A run's thread awake for its
//! commit") has the figures.

use std::cell::Cell;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

/// How long a wait for a commit polls before its thread sleeps. A thread
/// whose commits typically take longer (a slow disk, a loaded machine)
/// sleeps at once: its poll would cost this much of its core for nothing.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(500);

thread_local! {
    /// Whether the future being polled on this thread is [`driven_alone`].
    static ALONE: Cell<bool> = const { Cell::new(false) };
    /// How long this thread's commits take to be answered, a moving
    /// average that one slow commit moves an eighth of the way.
    static TYPICAL_COMMIT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// `future`, for a thread that drives it and nothing else (`block_on` of a
/// command that drives one run): its waits for a commit poll for the
/// answer a while before the thread sleeps.
pub async fn driven_alone<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        let before = ALONE.replace(true);
        let polled = future.as_mut().poll(cx);
        ALONE.set(before);
        polled
    })
    .await
}

/// Waits for `commit` (a store's answer that a write is durable); on a
/// thread that drives its run alone, polls it first for up to
/// [`POLL_BEFORE_SLEEP`] if its commits are typically answered within that.
pub(super) async fn commit<T>(commit: impl Future<Output = T>) -> T {
    if !ALONE.get() {
        return commit.await;
    }
    let sent = Instant::now();
    let polls = TYPICAL_COMMIT.get() <= POLL_BEFORE_SLEEP && cores_to_spare();
    // Outside tokio's budget, which would otherwise answer `Pending` after
    // some polls of a channel whatever it holds.
    let mut commit = std::pin::pin!(tokio::task::unconstrained(commit));
    let answer = std::future::poll_fn(|cx| {
        if let Poll::Ready(answer) = commit.as_mut().poll(cx) {
            return Poll::Ready(answer);
        }
        while polls && sent.elapsed() < POLL_BEFORE_SLEEP {
            std::hint::spin_loop();
            if let Poll::Ready(answer) = commit.as_mut().poll(cx) {
                return Poll::Ready(answer);
            }
        }
        Poll::Pending
    })
    .await;
    let typical = TYPICAL_COMMIT.get();
    TYPICAL_COMMIT.set(typical - typical / 8 + sent.elapsed() / 8);
    answer
}

/// Whether the process has more than one core: on one, a thread polling
/// for its commit would take the core the writer needs to make it.
fn cores_to_spare() -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) > 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A commit answered at its `ready_at`th poll, counting its polls.
    struct Answered {
        polls: Arc<AtomicUsize>,
        ready_at: usize,
    }

    impl Future for Answered {
        type Output = &'static str;

        fn poll(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> Poll<&'static str> {
            let polls = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if polls >= self.ready_at {
                Poll::Ready("durable")
            } else {
                Poll::Pending
            }
        }
    }

    /// Polls `future` once, as an executor would, with a waker that does
    /// nothing; answers what the poll gave and how often the commit inside
    /// was polled.
    fn poll_once(
        future: impl Future<Output = &'static str>,
        polls: &AtomicUsize,
    ) -> (Poll<&'static str>, usize) {
        let mut future = std::pin::pin!(future);
        let polled = future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        (polled, polls.load(Ordering::SeqCst))
    }

    fn answered(ready_at: usize) -> (Answered, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        (
            Answered {
                polls: Arc::clone(&polls),
                ready_at,
            },
            polls,
        )
    }

    #[test]
    fn a_worker_thread_polls_a_commit_once_and_goes_on_with_other_runs() {
        let (future, polls) = answered(usize::MAX);
        let (polled, times) = poll_once(commit(future), &polls);
        assert!(polled.is_pending());
        assert_eq!(times, 1);
    }

    #[test]
    fn a_thread_driving_its_run_alone_meets_its_commit_awake() {
        if !cores_to_spare() {
            eprintln!("skipped: one core, where a thread never polls for its commit");
            return;
        }
        TYPICAL_COMMIT.set(Duration::ZERO);
        let (future, polls) = answered(3);
        let (polled, times) = poll_once(driven_alone(commit(future)), &polls);
        assert_eq!(polled, Poll::Ready("durable"));
        assert_eq!(times, 3);
        // A commit that does not come is polled for a while, then slept on.
        let (future, polls) = answered(usize::MAX);
        let (polled, times) = poll_once(driven_alone(commit(future)), &polls);
        assert!(polled.is_pending());
        assert!(times > 1, "polled {times} times");
    }

    #[test]
    fn a_thread_whose_commits_are_slow_sleeps_at_once() {
        TYPICAL_COMMIT.set(POLL_BEFORE_SLEEP * 2);
        let (future, polls) = answered(usize::MAX);
        let (polled, times) = poll_once(driven_alone(commit(future)), &polls);
        assert!(polled.is_pending());
        assert_eq!(times, 1);
        // Commits that come quickly again bring the polling back.
        for _ in 0..32 {
            let (future, _) = answered(1);
            let _ = poll_once(driven_alone(commit(future)), &AtomicUsize::new(0));
        }
        assert!(
            TYPICAL_COMMIT.get() <= POLL_BEFORE_SLEEP,
            "{:?}",
            TYPICAL_COMMIT.get()
        );
    }
}
