//! `cargo bench -p flow-runtime --bench runs`: the interpreter's throughput.
//!
//! * B1: 1,000 concurrent runs of 10 recipe steps against a zero-latency
//!   provider, journaled in the SQLite store with full durability (WAL,
//!   `synchronous=FULL`, group commit): steps per second.
//! * B1pg: B1's workload on the PostgreSQL store (the server on
//!   127.0.0.1:5432, or `FLOW_TEST_POSTGRES_URL`; a schema of its own,
//!   dropped after): each step record committed before the run goes on,
//!   records of concurrent runs committed together.
//! * B2: one run through a 10,000-item loop, journaled in memory: the
//!   engine's overhead per step.
//!
//! * B3: park many runs at an approval, then decide and resume them.
//! * B4: stop a process dead half-way through B1's workload, then resume
//!   every run in a new one: time until all move again, runs lost, completed
//!   steps run twice.
//!
//! `--quick` runs each once, small, to show that the benchmarks work.

use std::sync::Arc;
use std::time::Instant;

use flow_runtime::error::StepError;
use flow_runtime::journal::Outcome;
use flow_runtime::memory::MemoryStore;
use flow_runtime::runner::Invocation;
use flow_runtime::services::{BoxFuture, Provider, RecipeCall, Services};
use flow_runtime::sqlite::{RunJournal, SqliteStore};
use flow_runtime::store::{NewRun, RunLog};
use flow_tests::bench::{
    ANSWER_RECIPE as RECIPE, Counting, cpu_between, cpu_by_thread, cpu_of_processes, profiler,
};
use serde_json::{Value, json};

/// mimalloc, as flowd and `flow` run, counting allocations in B1's
/// counted pass only.
#[global_allocator]
static ALLOCATOR: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);

/// Answers at once with a fixed valid output: the engine is what is measured.
struct Instant0;

impl Provider for Instant0 {
    fn complete<'a>(&'a self, _: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async { Ok(json!({ "text": "x".repeat(100), "score": 3 })) })
    }
}

fn plan(source: &str) -> flow_plan::Plan {
    let checked = flow_compiler::check_source("bench.flow", source);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics.first());
    flow_compiler::lower(&checked).expect("lowers")
}

fn main() {
    flow_runtime::allocator::configure_process();
    let quick = std::env::args().any(|a| a == "--quick");
    // `--only b1` or `--only b2` runs one benchmark, for profiling.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let wants = |name: &str| only.as_deref().is_none_or(|o| o == name);
    // `--repeat N` runs the selection N times in this process, for a profile
    // with enough samples (`bench/profile`).
    let repeat = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|i| args.get(i + 1))
        .map_or(1, |n| n.parse::<usize>().expect("--repeat N"));
    // As flowd on SQLite runs: a core left to the journal writer's thread.
    let runtime = flow_runtime::sqlite::async_runtime().expect("a tokio runtime");

    for _ in 0..repeat {
        run_selected(&runtime, quick, &wants);
    }
}

fn run_selected(runtime: &tokio::runtime::Runtime, quick: bool, wants: &dyn Fn(&str) -> bool) {
    if wants("b1") {
        b1(runtime, quick);
    }
    if wants("b1seq") {
        b1_sequential(runtime, quick);
    }
    if wants("b1pg") {
        b1_postgres(runtime, quick);
    }
    if wants("b2") {
        b2(runtime, quick);
    }
    if wants("b3seq") {
        b3_sequential(runtime, quick);
    }
    if wants("b3") {
        b3(runtime, quick);
    }
    if wants("b4") {
        b4(quick);
    }
}

/// Answers after a delay, and notes which calls it answered: for B4.
struct Counted {
    delay: std::time::Duration,
    calls: std::sync::Mutex<Vec<(String, Instant)>>,
}

impl Provider for Counted {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((call.call_id.to_string(), Instant::now()));
            Ok(json!({ "text": "x".repeat(100), "score": 3 }))
        })
    }
}

/// B4: the process running B1's workload stops dead half-way (its runtime is
/// dropped with every run in flight); a new one resumes every unfinished run.
/// Measured: time until every unfinished run has called its provider again,
/// runs lost, and completed steps executed a second time.
fn b4(quick: bool) {
    use std::collections::{HashMap, HashSet};

    let runs = if quick { 50 } else { 1_000 };
    let ten = Arc::new(ten_steps());
    let dir = std::env::temp_dir().join(format!("flow-bench-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db = dir.join("crash.db");
    let input = json!({ "q": "x".repeat(1000) });
    let start_runs = |store: &Arc<SqliteStore>,
                      runtime: &tokio::runtime::Runtime,
                      provider: &Arc<Counted>| {
        (0..runs)
            .map(|i| {
                let (store, plan, input, provider) = (
                    Arc::clone(store),
                    Arc::clone(&ten),
                    input.clone(),
                    Arc::clone(provider),
                );
                runtime.spawn(async move {
                    let run_id = format!("run-{i}");
                    let journal = RunJournal::open(&store, &run_id, flow_plan::Durability::Full)
                        .expect("journal");
                    let services = Services {
                        provider,
                        effects: journal.clone(),
                        mcp: None,
                        journal,
                        steps: None,
                        in_flight: None,
                    };
                    flow_runtime::run(&plan, "ten", &run_id, input, services).await
                })
            })
            .collect::<Vec<_>>()
    };
    let calls_of = |provider: &Counted| {
        provider
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    };

    // The first process: runs until about half the steps are done, then stops dead.
    {
        let store = SqliteStore::open(&db).expect("the store opens");
        store.put_plan(&ten).expect("the plan is stored");
        let runtime = flow_runtime::sqlite::async_runtime().expect("runtime");
        create_runs(&runtime, &store, &ten, &input, runs);
        let provider = Arc::new(Counted {
            delay: std::time::Duration::from_millis(5),
            calls: Default::default(),
        });
        let _handles = start_runs(&store, &runtime, &provider);
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while calls_of(&provider).len() < runs * 5 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        runtime.shutdown_timeout(std::time::Duration::ZERO);
    }

    // The second process: opens the store and resumes every run.
    let store = SqliteStore::open(&db).expect("the store reopens");
    let mut done: HashSet<(String, String)> = HashSet::new();
    let mut unfinished = 0;
    for i in 0..runs {
        let run_id = format!("run-{i}");
        let records = store.step_records(&run_id).expect("records");
        if records.len() < 10 {
            unfinished += 1;
        }
        done.extend(records.into_iter().map(|r| (run_id.clone(), r.path)));
    }
    let runtime = flow_runtime::sqlite::async_runtime().expect("runtime");
    let provider = Arc::new(Counted {
        delay: std::time::Duration::ZERO,
        calls: Default::default(),
    });
    let restart = Instant::now();
    let handles = start_runs(&store, &runtime, &provider);
    let outcomes: Vec<_> = runtime.block_on(async {
        let mut outcomes = Vec::new();
        for handle in handles {
            outcomes.push(handle.await);
        }
        outcomes
    });
    let calls = calls_of(&provider);
    let mut first_call: HashMap<&str, Instant> = HashMap::new();
    let mut repeated = 0;
    for (id, at) in &calls {
        let mut parts = id.split(':');
        let (run, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        first_call.entry(run).or_insert(*at);
        if done.contains(&(run.to_string(), path.to_string())) {
            repeated += 1;
        }
    }
    let moving_again = first_call
        .values()
        .max()
        .map_or(0.0, |at| (*at - restart).as_secs_f64());
    let lost = outcomes
        .iter()
        .filter(|o| !matches!(o, Ok(Outcome::Completed { .. })))
        .count();
    println!(
        "| B4 | {runs} runs x 10 steps stopped dead with {} steps done; {unfinished} runs resumed | every run moving again after {:.1} ms | runs lost: {lost}, completed steps run again: {repeated} |",
        done.len(),
        moving_again * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Resident memory of this process, in bytes (Linux).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// B3: park many runs at an approval, then decide and resume them all.
/// B3seq: B3 one run after another, as `flow run` and `flow approve` do:
/// each run created and driven until it parks, then each decided and
/// driven to its end, all inside the timers; the peers' shape.
fn b3_sequential(runtime: &tokio::runtime::Runtime, quick: bool) {
    use flow_runtime::store::{RunStatus, Store};
    let runs = if quick { 20 } else { 300 };
    let gated = plan(&format!(
        "{RECIPE}workflow gated {{\n  step a = answer {{ q: \"x\" }}\n  step ok = approval {{ approvers: [\"boss\"], message: \"go?\" }}\n  step b = answer {{ q: step.a.text }}\n}}\n"
    ));
    let dir = std::env::temp_dir().join(format!("flow-bench-park-seq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = SqliteStore::open(&dir.join("park.db")).expect("the store opens");
    sqlite.put_plan(&gated).expect("the plan is stored");
    let store: Arc<dyn Store> = sqlite;
    let provider: Arc<dyn flow_runtime::services::Provider> = Arc::new(Instant0);
    let input = json!({});
    let drive = |run_id: String, invocation: Invocation| {
        let (store, gated, provider, input) = (
            Arc::clone(&store),
            &gated,
            Arc::clone(&provider),
            input.clone(),
        );
        async move {
            flow_runtime::runner::drive(
                &store, gated, "gated", &run_id, invocation, input, provider, None, None, None,
                None,
            )
            .await
            .expect("the run is driven")
        }
    };
    profiler("enable");
    // As `flow run` and `flow approve` drive a run (`driven_alone`).
    let (park, resume) = runtime.block_on(flow_runtime::store::driven_alone(async {
        let start = Instant::now();
        for i in 0..runs {
            // As `flow run` starts a run: its row rides with its first write.
            let start = Invocation::Start {
                account: String::new(),
                run: NewRun {
                    workflow: "gated".to_string(),
                    plan_hash: gated.hash.clone(),
                    input: input.clone(),
                    provider: None,
                },
            };
            let outcome = drive(format!("run-{i}"), start).await;
            assert!(matches!(outcome, Outcome::Parked { .. }), "{outcome:?}");
        }
        let park = start.elapsed().as_secs_f64();
        let start = Instant::now();
        for i in 0..runs {
            let run_id = format!("run-{i}");
            store
                .decide(&run_id, "ok", &approve("boss"))
                .await
                .expect("the store answers")
                .expect("the gate is pending");
            assert!(
                store
                    .claim_run(&run_id, &[RunStatus::PendingApproval, RunStatus::Running])
                    .await
                    .expect("claimed")
            );
            let outcome = drive(run_id, Invocation::Resume).await;
            assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
        }
        (park, start.elapsed().as_secs_f64())
    }));
    profiler("disable");
    println!(
        "| B3seq | park {runs} runs one after another, then decide and resume each | park {park:.3} s, resume {resume:.3} s | {:.0} parked/s, {:.0} resumed/s |",
        runs as f64 / park,
        runs as f64 / resume
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn b3(runtime: &tokio::runtime::Runtime, quick: bool) {
    let runs = if quick { 100 } else { 10_000 };
    let gated = Arc::new(plan(&format!(
        "{RECIPE}workflow gated {{\n  step a = answer {{ q: \"x\" }}\n  step ok = approval {{ approvers: [\"boss\"], message: \"go?\" }}\n  step b = answer {{ q: step.a.text }}\n}}\n"
    )));
    let dir = std::env::temp_dir().join(format!("flow-bench-park-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let store = SqliteStore::open(&dir.join("park.db")).expect("the store opens");
    store.put_plan(&gated).expect("the plan is stored");
    // Queued at once, the starts share the journal writer's commits.
    let run = NewRun {
        workflow: "gated".to_string(),
        plan_hash: gated.hash.clone(),
        input: json!({}),
        provider: None,
    };
    let starts: Vec<_> = (0..runs)
        .map(|i| store.create_run(&format!("run-{i}"), "", &run, None))
        .collect();
    runtime.block_on(async {
        for start in starts {
            start.await.expect("run created");
        }
    });
    let go = |which: std::ops::Range<usize>, resume: bool| {
        let (store, gated) = (Arc::clone(&store), Arc::clone(&gated));
        runtime.block_on(async move {
            let mut tasks = Vec::new();
            for i in which {
                let (store, plan) = (Arc::clone(&store), Arc::clone(&gated));
                tasks.push(tokio::spawn(async move {
                    let run_id = format!("run-{i}");
                    if resume {
                        store
                            .decide(&run_id, "ok", &approve("boss"))
                            .await
                            .expect("the store answers")
                            .expect("the gate is pending");
                    }
                    let journal = RunJournal::open(&store, &run_id, flow_plan::Durability::Full)
                        .expect("journal");
                    let services = Services {
                        provider: Arc::new(Instant0),
                        effects: journal.clone(),
                        mcp: None,
                        journal: journal.clone(),
                        steps: None,
                        in_flight: None,
                    };
                    let outcome =
                        flow_runtime::run(&plan, "gated", &run_id, json!({}), services).await;
                    // The records that wait for the run's end are in the time.
                    journal.flush().await.expect("the records are written");
                    outcome
                }));
            }
            let mut parked = 0;
            let mut completed = 0;
            for task in tasks {
                match task.await {
                    Ok(Outcome::Parked { .. }) => parked += 1,
                    Ok(Outcome::Completed { .. }) => completed += 1,
                    other => panic!("{other:?}"),
                }
            }
            (parked, completed)
        })
    };
    // Parking happens in waves, all of a wave's runs at once: the process's
    // memory after each wave shows whether parked runs hold any (the first
    // wave pays for the runtime's and allocator's warm-up).
    const WAVES: usize = 10;
    let wave = runs / WAVES;
    let mut after_wave = Vec::new();
    let start = Instant::now();
    for w in 0..WAVES {
        let (parked, _) = go(w * wave..(w + 1) * wave, false);
        assert_eq!(parked, wave);
        after_wave.push(rss());
    }
    let park = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let (_, completed) = go(0..runs, true);
    let resume = start.elapsed().as_secs_f64();
    assert_eq!(completed, runs);
    let growth = after_wave[WAVES - 1] as f64 - after_wave[0] as f64;
    let waves: Vec<String> = after_wave
        .iter()
        .map(|bytes| format!("{:.0}", *bytes as f64 / 1e6))
        .collect();
    println!(
        "| B3 | park {runs} runs at an approval (in {WAVES} waves), then resume them all at once | park {park:.2} s, resume {resume:.2} s | RSS after each wave {} MB: {:+.0} B per run parked after the first wave |",
        waves.join(" / "),
        growth / (runs - wave) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The workflow `ten` of B1 and B4: ten recipe steps, each on the last one's output.
fn ten_steps() -> flow_plan::Plan {
    plan(&flow_tests::bench::ten_steps_source())
}

/// B1's timed rounds, each its 1,000 runs in a fresh store: one round's
/// timed part is a tenth of a second, in which the machine's other work
/// moved the rate and the CPU per step by a fifth from one run of the
/// bench to the next.
const B1_ROUNDS: usize = 5;

/// B1: concurrent durable runs, in `B1_ROUNDS` rounds. The row gives the
/// median of the rounds' rates and, from the round of median CPU time
/// (not always the same round), its CPU per step and split by thread.
fn b1(runtime: &tokio::runtime::Runtime, quick: bool) {
    let runs = if quick { 50 } else { 1_000 };
    let rounds = if quick { 1 } else { B1_ROUNDS };
    let steps = runs * 10;
    let mut measured = Vec::new();
    for round in 0..rounds {
        let timed = B1Runs::create(runtime, runs, &format!("timed-{round}"));
        let cpu_before = cpu_by_thread(std::process::id());
        profiler("enable");
        let start = Instant::now();
        let completed = timed.drive(runtime);
        let elapsed = start.elapsed().as_secs_f64();
        profiler("disable");
        let cpu = cpu_between(&cpu_before, &cpu_by_thread(std::process::id()));
        assert_eq!(completed, runs, "every run completes");
        measured.push((elapsed, cpu));
    }
    // The same again, untimed, counting allocations: a figure the
    // machine's noise does not move.
    let counted = B1Runs::create(runtime, runs, "counted");
    let (completed, allocations) = ALLOCATOR.count(|| counted.drive(runtime));
    assert_eq!(completed, runs, "every counted run completes");
    // The row gives every round's steps and time (`bench/profile` adds
    // them up), and the median round's rate.
    let mut elapsed: Vec<f64> = measured.iter().map(|(elapsed, _)| *elapsed).collect();
    let total: f64 = elapsed.iter().sum();
    elapsed.sort_by(f64::total_cmp);
    let median = elapsed[elapsed.len() / 2];
    let cpu_total = |cpu: &std::collections::BTreeMap<String, std::time::Duration>| {
        cpu.values().sum::<std::time::Duration>()
    };
    measured.sort_by_key(|(_, cpu)| cpu_total(cpu));
    let (_, cpu) = &measured[measured.len() / 2];
    println!(
        "| B1 | {runs} runs x 10 steps, SQLite, synchronous=FULL, group commit, median of {rounds} rounds | {} steps in {total:.3} s | {:.0} steps/s | {}; {:.1} allocations per step |",
        steps * rounds,
        steps as f64 / median,
        cpu_per_step(cpu, steps),
        allocations as f64 / steps as f64
    );
}

/// Stores `runs` runs of `plan`'s workflow `ten` with `input`, named
/// `run-0`, `run-1`, ...: queued at once, the starts share the journal
/// writer's commits.
fn create_runs(
    runtime: &tokio::runtime::Runtime,
    store: &SqliteStore,
    plan: &flow_plan::Plan,
    input: &Value,
    runs: usize,
) {
    let run = NewRun {
        workflow: "ten".to_string(),
        plan_hash: plan.hash.clone(),
        input: input.clone(),
        provider: None,
    };
    let starts: Vec<_> = (0..runs)
        .map(|i| store.create_run(&format!("run-{i}"), "", &run, None))
        .collect();
    runtime.block_on(async {
        for start in starts {
            start.await.expect("run created");
        }
    });
}

/// B1's runs, created in a store of their own and ready to be driven.
struct B1Runs {
    dir: std::path::PathBuf,
    store: Arc<SqliteStore>,
    ten: Arc<flow_plan::Plan>,
    input: Value,
    runs: usize,
}

impl B1Runs {
    fn create(runtime: &tokio::runtime::Runtime, runs: usize, name: &str) -> B1Runs {
        let ten = Arc::new(ten_steps());
        let dir =
            std::env::temp_dir().join(format!("flow-bench-runs-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store = SqliteStore::open(&dir.join("bench.db")).expect("the store opens");
        store.put_plan(&ten).expect("the plan is stored");
        let input = json!({ "q": "x".repeat(1000) });
        create_runs(runtime, &store, &ten, &input, runs);
        B1Runs {
            dir,
            store,
            ten,
            input,
            runs,
        }
    }

    /// Drives every run at once to its end; answers how many completed.
    fn drive(&self, runtime: &tokio::runtime::Runtime) -> usize {
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..self.runs {
                let store: Arc<dyn flow_runtime::store::Store> = Arc::clone(&self.store) as _;
                let (plan, input) = (Arc::clone(&self.ten), self.input.clone());
                tasks.push(tokio::spawn(async move {
                    // As flowd drives a run it has just created: nothing read
                    // back, the run's end in its last step's commit.
                    let created = Invocation::Created {
                        account: String::new(),
                        asked_at: std::time::Instant::now(),
                    };
                    let provider: Arc<dyn flow_runtime::services::Provider> = Arc::new(Instant0);
                    let outcome = flow_runtime::runner::drive(
                        &store,
                        &plan,
                        "ten",
                        &format!("run-{i}"),
                        created,
                        input,
                        provider,
                        None,
                        None,
                        None,
                        None,
                    )
                    .await;
                    matches!(outcome, Ok(Outcome::Completed { .. }))
                }));
            }
            let mut completed = 0;
            for task in tasks {
                completed += usize::from(task.await.unwrap_or(false));
            }
            completed
        })
    }
}

impl Drop for B1Runs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The CPU time `cpu` (by thread name) per durable step: the process's
/// total, then its threads that took at least a twentieth of it.
fn cpu_per_step(
    cpu: &std::collections::BTreeMap<String, std::time::Duration>,
    steps: usize,
) -> String {
    let total: std::time::Duration = cpu.values().sum();
    let per_step = |time: &std::time::Duration| time.as_secs_f64() * 1e6 / steps as f64;
    let threads: Vec<String> = cpu
        .iter()
        .filter(|(_, time)| time.as_secs_f64() >= total.as_secs_f64() / 20.0)
        .map(|(name, time)| format!("{name} {:.1}", per_step(time)))
        .collect();
    format!(
        "CPU per step {:.1} µs ({})",
        per_step(&total),
        threads.join(", ")
    )
}

/// B1seq: B1's runs one after another, each created, driven and finished
/// inside the timer (`runner::drive`, as `flow run` does): the shape of the
/// peers' B1 in the side-by-side table, where no commit is shared.
fn b1_sequential(runtime: &tokio::runtime::Runtime, quick: bool) {
    use flow_runtime::store::Store;
    let runs = if quick { 20 } else { 300 };
    let ten = ten_steps();
    let dir = std::env::temp_dir().join(format!("flow-bench-seq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = SqliteStore::open(&dir.join("bench.db")).expect("the store opens");
    sqlite.put_plan(&ten).expect("the plan is stored");
    let store: Arc<dyn Store> = sqlite;
    let input = json!({ "q": "x".repeat(1000) });
    let provider: Arc<dyn flow_runtime::services::Provider> = Arc::new(Instant0);
    profiler("enable");
    let start = Instant::now();
    // As `flow run` drives a run (`driven_alone`).
    runtime.block_on(flow_runtime::store::driven_alone(async {
        for i in 0..runs {
            // As `flow run` starts a run: its row rides with its first write.
            let start = Invocation::Start {
                account: String::new(),
                run: NewRun {
                    workflow: "ten".to_string(),
                    plan_hash: ten.hash.clone(),
                    input: input.clone(),
                    provider: None,
                },
            };
            let outcome = flow_runtime::runner::drive(
                &store,
                &ten,
                "ten",
                &format!("run-{i}"),
                start,
                input.clone(),
                Arc::clone(&provider),
                None,
                None,
                None,
                None,
            )
            .await
            .expect("the run is driven");
            assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
        }
    }));
    let elapsed = start.elapsed().as_secs_f64();
    profiler("disable");
    let steps = runs * 10;
    println!(
        "| B1seq | {runs} runs x 10 steps one after another, created and finished in the timer, SQLite, synchronous=FULL | {steps} steps in {elapsed:.3} s | {:.0} steps/s |",
        steps as f64 / elapsed
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// B1pg: B1 on the PostgreSQL store, through the `Store` trait as flowd uses it.
fn b1_postgres(runtime: &tokio::runtime::Runtime, quick: bool) {
    use flow_runtime::store::Store;
    let runs = if quick { 50 } else { 1_000 };
    let ten = Arc::new(ten_steps());
    let schema = flow_tests::postgres::TestSchema::new();
    let store: Arc<dyn Store> = runtime
        .block_on(flow_runtime::postgres::PostgresStore::connect(
            &schema.url(),
        ))
        .expect("the store connects");
    let input = json!({ "q": "x".repeat(1000) });
    runtime.block_on(async {
        store.put_plan(&ten).await.expect("the plan is stored");
        let run = Arc::new(NewRun {
            workflow: "ten".to_string(),
            plan_hash: ten.hash.clone(),
            input: input.clone(),
            provider: None,
        });
        let starts: Vec<_> = (0..runs)
            .map(|i| {
                let (store, run) = (Arc::clone(&store), Arc::clone(&run));
                tokio::spawn(async move {
                    let run_id = format!("run-{i}");
                    store.create_run(&run_id, "", &run, None).await
                })
            })
            .collect();
        for start in starts {
            start.await.expect("joined").expect("run created");
        }
    });
    let cpu_before = cpu_by_thread(std::process::id());
    let postgres_before = cpu_of_processes("postgres");
    let start = Instant::now();
    let completed = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..runs {
            let (store, plan, input) = (Arc::clone(&store), Arc::clone(&ten), input.clone());
            tasks.push(tokio::spawn(async move {
                let run_id = format!("run-{i}");
                let journal = store
                    .open_journal(&run_id, flow_plan::Durability::Full)
                    .await
                    .expect("journal");
                let services = Services {
                    provider: Arc::new(Instant0),
                    effects: journal.clone(),
                    mcp: None,
                    journal,
                    steps: None,
                    in_flight: None,
                };
                matches!(
                    flow_runtime::run(&plan, "ten", &run_id, input, services).await,
                    Outcome::Completed { .. }
                )
            }));
        }
        let mut completed = 0;
        for task in tasks {
            completed += usize::from(task.await.unwrap_or(false));
        }
        completed
    });
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_between(&cpu_before, &cpu_by_thread(std::process::id()));
    let postgres: std::time::Duration =
        cpu_between(&postgres_before, &cpu_of_processes("postgres"))
            .values()
            .sum();
    assert_eq!(completed, runs, "every run completes");
    let steps = runs * 10;
    println!(
        "| B1pg | {runs} runs x 10 steps, PostgreSQL, synchronous_commit=on, group commit | {steps} steps in {:.3} s | {:.0} steps/s | {}; PostgreSQL {:.1} µs |",
        elapsed,
        steps as f64 / elapsed,
        cpu_per_step(&cpu, steps),
        postgres.as_secs_f64() * 1e6 / steps as f64
    );
    // The store's pool and writer belong to this runtime: closed before the
    // schema is dropped.
    drop(store);
}

/// B2: one long loop, in memory.
fn b2(runtime: &tokio::runtime::Runtime, quick: bool) {
    let items = if quick { 1_000 } else { 10_000 };
    let looped = plan(&format!(
        "{RECIPE}workflow many {{\n  input {{ items: list<string> }}\n  for workflow_input.items as each {{\n    step a = answer {{ q: loop_item }}\n  }}\n  output {{ n: step.each[0].a.score }}\n}}\n"
    ));
    // Best and median of five runs, each with a fresh store: the first run of
    // a process pays for page faults that the later ones do not.
    let mut times = Vec::new();
    for _ in 0..5 {
        let store = Arc::new(MemoryStore::default());
        let services = Services {
            provider: Arc::new(Instant0),
            effects: store.clone(),
            mcp: None,
            journal: store.clone(),
            steps: None,
            in_flight: None,
        };
        let input = json!({ "items": vec!["x"; items] });
        let start = Instant::now();
        let outcome = runtime.block_on(flow_runtime::run(&looped, "many", "loop", input, services));
        times.push(start.elapsed().as_secs_f64());
        // The journal outlives the run, as a store does (and as LangGraph's
        // graph outlives its `invoke`): freeing its 10,000 records is not
        // the run's work.
        drop(store);
        assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    }
    times.sort_by(f64::total_cmp);
    println!(
        "| B2 | one run, {items}-item loop, in memory | best {:.1} ms, median {:.1} ms | {:.2} µs/step (median {:.2}) |",
        times[0] * 1e3,
        times[2] * 1e3,
        times[0] * 1e6 / items as f64,
        times[2] * 1e6 / items as f64
    );
}

/// An approval by `approver`.
fn approve(approver: &str) -> flow_runtime::approval::Decision {
    flow_runtime::approval::Decision {
        approver: approver.to_string(),
        groups: Vec::new(),
        approved: true,
        comment: None,
        decided_at: "2026-11-29T00:00:00Z".to_string(),
    }
}
