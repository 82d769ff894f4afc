//! `cargo bench -p flow-compiler --bench check`: end-to-end compile speed on
//! generated sources (read from disk, parse, check, lower), on one core.
//!
//! It generates workflows of 1k, 10k and 100k steps and 1,000 files of about
//! 100 lines into a temporary directory, then compiles each several times and
//! reports the best throughput. The figures go into docs/benchmarks.md.
//! `--quick` runs each case once, small, to show that the benchmark works;
//! `--keep` leaves the generated files in place for timing `flowc check`.
//! Each workflow's peak memory is measured in a process of its own, which
//! checks it once as `flowc check` does (`--peak FILE`, run by the benchmark
//! itself): the kernel's high-water mark of resident memory, which is what
//! `/usr/bin/time -v` reports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The allocator of the `flowc` binary, so that the figures match it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Disk;

impl flow_compiler::SourceLoader for Disk {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        std::fs::read(path).map_err(|e| flow_compiler::LoadFailure::unreadable(e.to_string()))
    }
}

const RECIPE: &str = r#"recipe summarize {
  model "default"
  input { text: string, n: int }
  output { summary: string, score: int, tags: list<string>, kind: "short" | "long" }
  prompt """
    Summarize in at most {{input.n}} words:
    {{input.text}}
  """
}
"#;

/// A workflow of `steps` steps in realistic shapes: chains of references,
/// conditions, loops and parallel blocks, every tenth step a side effect.
fn workflow(name: &str, steps: usize) -> String {
    let mut out = String::with_capacity(steps * 120);
    let _ = writeln!(out, "workflow {name} {{");
    out.push_str(
        "  input { text: string, items: list<{ name: string, url: string }> }\n  timeout 30m\n",
    );
    let mut last = String::from("workflow_input.text");
    let mut i = 0;
    while i < steps {
        match i % 10 {
            3 => {
                let _ = writeln!(
                    out,
                    "  if step.s{}.score >= 3 && step.s{}.kind == \"long\" {{\n    step s{i} = summarize {{ text: \"{{{{step.s{}.summary}}}}\", n: 10 }}\n  }}",
                    i - 1,
                    i - 1,
                    i - 1
                );
            }
            5 => {
                let _ = writeln!(
                    out,
                    "  for workflow_input.items as l{i} concurrency 4 max 50 {{\n    step s{i} = summarize {{ text: \"{{{{loop_item.name}}}} at {{{{loop_item.url}}}}\", n: loop_index }}\n  }}"
                );
            }
            7 => {
                let _ = writeln!(
                    out,
                    "  parallel p{i} {{\n    branch a {{ step s{i} = summarize {{ text: {last}, n: 5 }} }}\n    branch b {{ step t{i} = summarize {{ text: \"{{{{workflow_input.text}}}}\", n: 7 }} }}\n  }}"
                );
                last = format!("step.s{i}.summary");
            }
            9 => {
                let _ = writeln!(
                    out,
                    "  step s{i} = kb_write \"notes\" {{ title: \"Note {i}\", content: {last} }} idempotency \"n-{i}\""
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "  step s{i} = summarize {{ text: \"Step {i}: {{{{{}}}}}\", n: {} }} retry 3 backoff 2s..30s timeout 60s",
                    last,
                    i % 50
                );
                last = format!("step.s{i}.summary");
            }
        }
        i += 1;
    }
    let _ = writeln!(out, "  output {{ last: {last}, loops: step.l5 }}\n}}");
    out
}

struct Measurement {
    bytes: usize,
    best: Duration,
}

/// Compiles every root in `roots` once per run; keeps the best run.
fn measure(roots: &[PathBuf], runs: usize) -> Measurement {
    let bytes: usize = roots
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len() as usize))
        .sum::<usize>();
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let start = Instant::now();
        for root in roots {
            // As `flowc build` compiles: checked, then lowered once.
            let (checked, plan) = flow_compiler::check_and_lower(&root.to_string_lossy(), &Disk)
                .expect("generated file is readable");
            assert!(
                !checked.has_errors(),
                "generated source has errors: {:?}",
                checked.diagnostics.first()
            );
            std::hint::black_box(plan.expect("lowers"));
        }
        best = best.min(start.elapsed());
    }
    Measurement { bytes, best }
}

fn report(name: &str, m: &Measurement, steps: usize) {
    let mb = m.bytes as f64 / 1e6;
    let secs = m.best.as_secs_f64();
    println!(
        "| {name} | {steps} | {:.2} MB | {:.1} ms | {:.1} MB/s | {:.2} µs |",
        mb,
        secs * 1e3,
        mb / secs,
        secs * 1e6 / steps as f64
    );
}

/// The peak resident memory of this process so far, in bytes, from
/// `/proc/self/status` (Linux); `None` elsewhere.
fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kilobytes: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kilobytes * 1024)
}

/// `--peak FILE`: checks FILE once and prints the process's peak resident
/// memory in bytes (then lowers it too with `--lower`, as `flowc build` does).
fn peak_of_one_check(path: &str, lower: bool) {
    if lower {
        let (checked, plan) =
            flow_compiler::check_and_lower(path, &Disk).expect("generated file is readable");
        assert!(!checked.has_errors(), "generated source has errors");
        std::hint::black_box(plan.expect("lowers"));
    } else {
        let checked = flow_compiler::check(path, &Disk).expect("generated file is readable");
        assert!(!checked.has_errors(), "generated source has errors");
        std::hint::black_box(&checked);
    }
    println!("{}", peak_resident_bytes().unwrap_or(0));
}

/// The peak resident memory of a fresh process that checks `path` once (and
/// lowers it with `lower`), in MB; `None` where it cannot be read.
fn peak_in_own_process(path: &Path, lower: bool) -> Option<f64> {
    let mut command = std::process::Command::new(std::env::current_exe().ok()?);
    command.arg("--peak").arg(path);
    if lower {
        command.arg("--lower");
    }
    let output = command.output().ok()?;
    let bytes: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .ok()?;
    (bytes > 0).then(|| bytes as f64 / 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--peak") {
        let path = args.get(at + 1).expect("--peak FILE");
        peak_of_one_check(path, args.iter().any(|a| a == "--lower"));
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = std::env::temp_dir().join(format!("flow-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let runs = if quick { 1 } else { 5 };

    println!("| case | steps | size | best time | throughput | per step |");
    println!("|---|---|---|---|---|---|");
    let sizes: &[usize] = if quick {
        &[100, 1_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let mut workflow_files = Vec::new();
    for &steps in sizes {
        let path = dir.join(format!("steps_{steps}.flow"));
        std::fs::write(&path, format!("{RECIPE}{}", workflow("big", steps))).expect("write");
        let m = measure(
            std::slice::from_ref(&path),
            if steps >= 100_000 { runs.min(3) } else { runs },
        );
        report(&format!("one workflow, {steps} steps"), &m, steps);
        workflow_files.push((steps, path));
    }

    println!(
        "\n| peak resident memory of a process that checks once | steps | check | check and lower |"
    );
    println!("|---|---|---|---|");
    for (steps, path) in &workflow_files {
        let show = |lower: bool| {
            peak_in_own_process(path, lower)
                .map_or("unknown".to_string(), |mb| format!("{mb:.1} MB"))
        };
        println!(
            "| peak memory, one workflow of {steps} steps | {steps} | check {} | check and lower {} |",
            show(false),
            show(true)
        );
    }

    // Where the time goes, on the 10k-step workflow: parsing alone, then
    // parse + check, then the lowering for the budgets that `check` adds,
    // then sealing the plan (its hash) as `lower` hands it out.
    let text = format!(
        "{RECIPE}{}",
        workflow("big", if quick { 1_000 } else { 10_000 })
    );
    let phase = |f: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..runs {
            f();
        }
        start.elapsed().as_secs_f64() * 1e3 / runs as f64
    };
    let parse_ms = phase(&|| {
        std::hint::black_box(flow_compiler::syntax::parse(
            &text,
            flow_compiler::FileId(0),
        ));
    });
    let check_ms = phase(&|| {
        std::hint::black_box(flow_compiler::check::check_source("big.flow", &text));
    });
    let budgets_ms = phase(&|| {
        std::hint::black_box(flow_compiler::check_source("big.flow", &text));
    });
    let lower_ms = phase(&|| {
        let checked = flow_compiler::check_source("big.flow", &text);
        std::hint::black_box(flow_compiler::lower(&checked));
    });
    println!(
        "\nphases ({:.2} MB): parse {parse_ms:.1} ms, check {:.1} ms, lower for the budgets {:.1} ms, lower and seal {:.1} ms\n",
        text.len() as f64 / 1e6,
        check_ms - parse_ms,
        budgets_ms - check_ms,
        lower_ms - budgets_ms
    );

    let files = if quick { 50 } else { 1_000 };
    let mut roots = Vec::new();
    for index in 0..files {
        let path = dir.join(format!("file_{index:04}.flow"));
        std::fs::write(
            &path,
            format!("{RECIPE}{}", workflow(&format!("w{index}"), 16)),
        )
        .expect("write");
        roots.push(path);
    }
    let lines: usize = std::fs::read_to_string(&roots[0]).map_or(0, |t| t.lines().count());
    let m = measure(&roots, runs);
    report(&format!("{files} files of {lines} lines"), &m, files * 16);

    // `--keep` leaves the generated files, to time the `flowc` binary on them.
    if std::env::args().any(|a| a == "--keep") {
        println!("\ngenerated files kept in {}", dir.display());
    } else {
        remove(&dir);
    }
}

fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
