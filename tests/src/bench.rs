//! What benchmarks of several crates share: the workloads they name alike
//! (B1's workflow runs in process in `runtime/benches/runs.rs` and over
//! HTTP in `runtime/daemon/benches/end_to_end.rs`), the switch that lets
//! `bench/profile` record a benchmark's timed part only, the readers of
//! the CPU time that processes and threads have used, and the allocator
//! that counts allocations.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The recipe of B1, B2 and B3: one question in, a text and a score out.
pub const ANSWER_RECIPE: &str = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string, score: int }
  prompt "Answer {{input.q}}"
}
"#;

/// B1's source: [`ANSWER_RECIPE`] and the workflow `ten`, ten recipe
/// steps, each on the last one's output.
pub fn ten_steps_source() -> String {
    let mut source = format!(
        "{ANSWER_RECIPE}workflow ten {{\n  input {{ q: string }}\n  step s0 = answer {{ q: workflow_input.q }}\n"
    );
    for i in 1..10 {
        source.push_str(&format!(
            "  step s{i} = answer {{ q: step.s{}.text }}\n",
            i - 1
        ));
    }
    source.push_str("  output { last: step.s9.score }\n}\n");
    source
}

/// With `FLOW_BENCH_PERF=CTL,ACK`, the fifos of a `perf record -D -1
/// --control fifo:CTL,ACK` that runs the bench (`bench/profile`), tells perf
/// to `enable` or `disable` recording and waits for its answer: the profile
/// then holds a benchmark's timed part only, not its setup.
pub fn profiler(command: &str) {
    use std::io::{Read, Write};
    let Ok(fifos) = std::env::var("FLOW_BENCH_PERF") else {
        return;
    };
    let (control, ack) = fifos.split_once(',').expect("FLOW_BENCH_PERF=CTL,ACK");
    std::fs::OpenOptions::new()
        .write(true)
        .open(control)
        .and_then(|mut fifo| fifo.write_all(format!("{command}\n").as_bytes()))
        .expect("perf's control fifo");
    let mut answer = [0; 4];
    std::fs::File::open(ack)
        .and_then(|mut fifo| fifo.read_exact(&mut answer))
        .expect("perf's answer");
}

/// The time on a CPU so far of each thread of process `pid`, summed by
/// thread name (Linux's `schedstat`, in nanoseconds, so no clock tick
/// rounds it). A thread that has ended is no longer counted.
pub fn cpu_by_thread(pid: u32) -> BTreeMap<String, Duration> {
    let mut by_name = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        *by_name
            .entry(name.trim().to_string())
            .or_insert(Duration::ZERO) += on_cpu(&path.join("schedstat"));
    }
    by_name
}

/// The time on a CPU so far of every process named `name` (each of
/// PostgreSQL's backends is a process of its own), by process id.
pub fn cpu_of_processes(name: &str) -> BTreeMap<u32, Duration> {
    let mut by_pid = BTreeMap::new();
    for process in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        if std::fs::read_to_string(process.path().join("comm")).is_ok_and(|c| c.trim() == name) {
            by_pid.insert(pid, on_cpu(&process.path().join("schedstat")));
        }
    }
    by_pid
}

/// The CPU time between two readings of [`cpu_of_processes`] or
/// [`cpu_by_thread`], by process or thread name: one started in between
/// counts from zero, one ended in between not at all.
pub fn cpu_between<K: Ord + Clone>(
    before: &BTreeMap<K, Duration>,
    after: &BTreeMap<K, Duration>,
) -> BTreeMap<K, Duration> {
    after
        .iter()
        .map(|(key, time)| {
            let spent = time.saturating_sub(before.get(key).copied().unwrap_or_default());
            (key.clone(), spent)
        })
        .collect()
}

/// The first field of a `schedstat` file: nanoseconds on a CPU.
fn on_cpu(schedstat: &std::path::Path) -> Duration {
    let text = std::fs::read_to_string(schedstat).unwrap_or_default();
    Duration::from_nanos(
        text.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    )
}

/// An allocator that counts the allocations made through it while
/// [`Counting::count`] runs, then passes them on to `A` (mimalloc in the
/// benches): allocations per durable step are a figure that a loaded or
/// noisy machine does not move, where CPU time per step varies by a fifth
/// between runs of the same binary. Counting is off outside `count`, and
/// then costs one relaxed load per allocation.
#[derive(Debug)]
pub struct Counting<A> {
    inner: A,
    on: AtomicBool,
    allocations: AtomicU64,
}

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Counting<A> {
        Counting {
            inner,
            on: AtomicBool::new(false),
            allocations: AtomicU64::new(0),
        }
    }

    /// Runs `work`, answering what it returns and how many allocations
    /// (new blocks and reallocations) every thread of the process made
    /// meanwhile.
    pub fn count<T>(&self, work: impl FnOnce() -> T) -> (T, u64) {
        self.allocations.store(0, Ordering::SeqCst);
        self.on.store(true, Ordering::SeqCst);
        let answer = work();
        self.on.store(false, Ordering::SeqCst);
        (answer, self.allocations.load(Ordering::SeqCst))
    }

    fn note(&self) {
        if self.on.load(Ordering::Relaxed) {
            self.allocations.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is passed on to `inner` unchanged, with the same
// layout and pointer; counting touches only two atomics and never
// allocates.
#[allow(unsafe_code)] // reason: a `GlobalAlloc` is an unsafe trait; this one only wraps another
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}
