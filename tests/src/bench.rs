//! What benchmarks of several crates share: the workloads they name alike
//! (B1's workflow runs in process in `runtime/benches/runs.rs` and over
//! HTTP in `runtime/daemon/benches/end_to_end.rs`), the switch that lets
//! `bench/profile` record a benchmark's timed part only, and the readers of
//! the CPU time that processes and threads have used.

use std::collections::BTreeMap;
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
