//! Time the process stood still: stopped (SIGSTOP), its virtual machine
//! paused.
//!
//! A step's timeout bounds the wait for a model, and a workflow's timeout
//! its active time; neither is spent while this process does not run. An
//! attempt whose answer waited in the socket while the process was stopped
//! past the step's timeout was failed as timed out and sent again (an
//! audit: 20 model calls for 10 steps after a 70 s SIGSTOP; with `retry 1`
//! the run failed), and the stop counted as the run's active time. Those
//! clocks leave out what is counted here.
//!
//! Leases and holds must not: a process stopped past its lease has lost
//! its runs to others, whatever it counts (`Hold`).
//!
//! A thread of its own wakes every [`TICK`] and counts any gap between two
//! wakes past [`SLACK`] as a stall. A stall the thread has not woken from
//! yet (the timer that fires as the process continues may run first) is
//! counted from its last wake.
//!
//! A process whose clock is virtual (`flowc test`'s) turns the count off
//! ([`ignore`]): a real stall added to a virtual deadline would make a
//! test's result depend on the machine it ran on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// Whether stalls are counted: not where [`ignore`] was called, nor
/// where the watching thread could not start (its last wake would then
/// age for ever, and every timeout move with it).
static COUNTED: AtomicBool = AtomicBool::new(true);

/// Counts no stall in this process from now on: its timeouts run on a
/// virtual clock (`flowc test`).
pub fn ignore() {
    COUNTED.store(false, Ordering::SeqCst);
}

/// How often the watching thread wakes.
const TICK: Duration = Duration::from_millis(100);

/// How late a wake may be before the gap counts as a stall: a busy
/// machine's scheduler delays a thread's wake by milliseconds, not this.
const SLACK: Duration = Duration::from_millis(1_000);

struct Watch {
    /// The last wake, and the stalls counted up to it.
    seen: Mutex<(Instant, Duration)>,
}

fn watch() -> &'static Watch {
    static WATCH: OnceLock<&'static Watch> = OnceLock::new();
    WATCH.get_or_init(|| {
        let watch: &'static Watch = Box::leak(Box::new(Watch {
            seen: Mutex::new((Instant::now(), Duration::ZERO)),
        }));
        let spawned = std::thread::Builder::new()
            .name("flow-stall-watch".to_string())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    let mut seen = lock(&watch.seen);
                    let now = Instant::now();
                    let (last, counted) = *seen;
                    *seen = (now, counted + stall_in(now.duration_since(last)));
                }
            });
        // Without the thread no stall is counted: timeouts are then wall
        // time, as they were.
        if spawned.is_err() {
            COUNTED.store(false, Ordering::SeqCst);
        }
        watch
    })
}

/// The part of a gap of `gap` between two wakes that was a stall.
fn stall_in(gap: Duration) -> Duration {
    if gap > SLACK {
        gap - TICK
    } else {
        Duration::ZERO
    }
}

/// A mark to measure stalls from (`Mark::stalled`). Taking the first one
/// starts the watching thread.
#[derive(Debug, Clone, Copy)]
pub struct Mark(Duration);

impl Mark {
    pub fn now() -> Mark {
        Mark(stalled())
    }

    /// How long the process stood still since the mark was taken.
    pub fn stalled(self) -> Duration {
        stalled().saturating_sub(self.0)
    }
}

/// `future`'s output, or `None` once `limit` has passed, not counting the
/// time the process stood still meanwhile: the timer that fires as the
/// process continues is set again for the stall's length, and the future
/// (an answer that waited in the socket) is polled again first.
pub async fn timeout<F: std::future::Future>(limit: Duration, future: F) -> Option<F::Output> {
    let (start, mark) = (tokio::time::Instant::now(), Mark::now());
    let mut future = std::pin::pin!(future);
    // A limit past what the clock holds never ends, as `tokio::time::timeout`'s.
    let Some(mut deadline) = start.checked_add(limit) else {
        return Some(future.await);
    };
    loop {
        if let Ok(output) = tokio::time::timeout_at(deadline, future.as_mut()).await {
            return Some(output);
        }
        match deadline.checked_add(mark.stalled().saturating_sub(deadline - start - limit)) {
            Some(owed) if owed > deadline => deadline = owed,
            _ => return None,
        }
    }
}

/// The stalls since the watch started, with one under way or not yet
/// seen by the watching thread.
fn stalled() -> Duration {
    if !COUNTED.load(Ordering::Relaxed) {
        return Duration::ZERO;
    }
    let watch = watch();
    let seen = *lock(&watch.seen);
    seen.1 + stall_in(Instant::now().saturating_duration_since(seen.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gap_past_the_slack_is_a_stall() {
        assert_eq!(stall_in(TICK), Duration::ZERO);
        assert_eq!(stall_in(SLACK), Duration::ZERO);
        assert_eq!(
            stall_in(Duration::from_secs(70)),
            Duration::from_secs(70) - TICK
        );
    }
}
