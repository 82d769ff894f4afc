//! What benchmarks of several crates share: the workloads they name alike
//! (B1's workflow runs in process in `runtime/benches/runs.rs` and over
//! HTTP in `runtime/daemon/benches/end_to_end.rs`), and the switch that
//! lets `bench/profile` record a benchmark's timed part only.

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
