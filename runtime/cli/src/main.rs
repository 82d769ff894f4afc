//! `flow`: runs a workflow on the embedded store (a SQLite file), approves or
//! rejects its gates, lists runs and shows a run's trace.
//!
//! Exit codes are part of the interface: 0 the run completed, 3 it is parked
//! at an approval, 1 it failed (or the source does not check, or its input
//! does not match the workflow's input: the run is recorded as failed before
//! its first step), 2 a usage or store error, or a decision that cannot apply
//! (nothing changed).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use flow_plan::Plan;
use flow_runtime::interp::{
    BoxFuture, Journal, Outcome, Provider, Services, StepError, StepRecord, StepStatus,
};
use flow_runtime::offline::OfflineProvider;
use flow_runtime::sqlite::SqliteStore;
use flow_runtime::store::{RunLog, Store};
use serde_json::{Value, json};

/// See the workspace Cargo.toml for why the binaries use mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "flow",
    version,
    about = "Run flow workflows on the embedded store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workflow of a `.flow` file or a plan (`flowc build` output).
    Run {
        file: PathBuf,
        /// The workflow to run, when the file has several.
        #[arg(long)]
        workflow: Option<String>,
        /// The run's input, a JSON file.
        #[arg(long)]
        input: PathBuf,
        #[arg(long, default_value = "flow.db")]
        db: PathBuf,
        /// Print the run record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve (or reject) a pending approval, then resume the run.
    Approve {
        run: String,
        /// The approval's execution path, as `flow run` printed it.
        step_path: String,
        /// Who decides; must be one of the approval's approvers.
        #[arg(long = "as")]
        approver: String,
        #[arg(long)]
        reject: bool,
        #[arg(long)]
        comment: Option<String>,
        #[arg(long, default_value = "flow.db")]
        db: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Resume every run left `running` by a process that died, and every
    /// parked run whose approval expired. Completed steps are not run again;
    /// the step in flight runs again. With `--json`, one run record per line.
    Recover {
        #[arg(long, default_value = "flow.db")]
        db: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// List the runs in the store.
    Runs {
        #[arg(long, default_value = "flow.db")]
        db: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Show a run's trace: every step run with its status, timing and attempts.
    Show {
        run: String,
        #[arg(long, default_value = "flow.db")]
        db: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

/// A failure before or around a run: the message and the exit code.
struct Fail(u8, String);

type Result<T> = std::result::Result<T, Fail>;

fn usage(message: impl Into<String>) -> Fail {
    Fail(2, message.into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

async fn dispatch(command: Command) -> Result<u8> {
    match command {
        Command::Run {
            file,
            workflow,
            input,
            db,
            json,
        } => {
            let plan = load_plan(&file)?;
            let workflow = pick_workflow(&plan, workflow.as_deref())?;
            let input = read_input(&input)?;
            let store = open_store(&db)?;
            store.put_plan(&plan).map_err(|e| usage(e.to_string()))?;
            let run_id = new_run_id();
            store
                .create_run(&run_id, &workflow, &plan.hash, &input)
                .map_err(|e| usage(e.to_string()))?;
            execute(&store, &plan, &workflow, &run_id, input, json).await
        }
        Command::Approve {
            run,
            step_path,
            approver,
            reject,
            comment,
            db,
            json,
        } => {
            let store = open_store(&db)?;
            let row = store
                .run(&run)
                .map_err(|e| usage(e.to_string()))?
                .ok_or_else(|| usage(format!("no run `{run}` in {}", db.display())))?;
            store
                .decide(
                    &run,
                    &step_path,
                    &approver,
                    !reject,
                    comment.as_deref(),
                    &timestamp(),
                )
                .await
                .map_err(|e| usage(e.to_string()))?;
            // A run that another live process is executing picks the
            // decision up itself when it parks (see `execute`).
            if !store
                .claim_run(&run, &["pending_approval"])
                .map_err(|e| usage(e.to_string()))?
            {
                eprintln!(
                    "flow: decision recorded; run {run} is running in another process, which will continue it"
                );
                return Ok(0);
            }
            let plan = store
                .plan(&row.plan_hash)
                .map_err(|e| usage(e.to_string()))?;
            execute(&store, &plan, &row.workflow, &run, row.input, json).await
        }
        Command::Recover { db, json } => {
            let store = open_store(&db)?;
            let mut runs = store.unfinished_runs().map_err(|e| usage(e.to_string()))?;
            // Parked runs whose approval has expired resume too, to apply
            // the approval's `on_expire`.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            for row in store.runs().map_err(|e| usage(e.to_string()))? {
                if row.status != "pending_approval" {
                    continue;
                }
                let records = store
                    .step_records(&row.id)
                    .map_err(|e| usage(e.to_string()))?;
                let expired = records.iter().any(|record| {
                    // (A pending record whose input is not a pending approval is not an approval.)
                    serde_json::from_value(record.input.clone()).is_ok_and(|pending| {
                        record.status == StepStatus::Pending
                            && flow_runtime::interp::expire(record, &pending, now).is_some()
                    })
                });
                if expired {
                    runs.push(row);
                }
            }
            if runs.is_empty() && !json {
                println!("no run to recover");
            }
            // Every run resumes at once: a restart brings them all back to
            // work together, not one after another.
            let mut resumed = tokio::task::JoinSet::new();
            for row in runs {
                // Runs still executing in a live process are not this one's.
                if !store
                    .claim_run(&row.id, &["running", "pending_approval"])
                    .map_err(|e| usage(e.to_string()))?
                {
                    continue;
                }
                let plan = store
                    .plan(&row.plan_hash)
                    .map_err(|e| usage(e.to_string()))?;
                let store = Arc::clone(&store);
                resumed.spawn(async move {
                    execute(&store, &plan, &row.workflow, &row.id, row.input, json).await
                });
            }
            // Failed outweighs parked, which outweighs completed; a store
            // error (2) outweighs them all.
            let mut worst = 0;
            while let Some(joined) = resumed.join_next().await {
                let code = match joined {
                    Ok(Ok(code)) => code,
                    Ok(Err(Fail(code, message))) => {
                        eprintln!("error: {message}");
                        code
                    }
                    Err(error) => {
                        eprintln!("error: a resumed run stopped: {error}");
                        2
                    }
                };
                worst = match (worst, code) {
                    (2, _) | (_, 2) => 2,
                    (1, _) | (_, 1) => 1,
                    (3, _) | (_, 3) => 3,
                    _ => 0,
                };
            }
            Ok(worst)
        }
        Command::Runs { db, json } => {
            let store = open_store(&db)?;
            let runs = store.runs().map_err(|e| usage(e.to_string()))?;
            if json {
                let list: Vec<Value> = runs
                    .iter()
                    .map(|r| json!({ "run_id": r.id, "workflow": r.workflow, "status": r.status, "created_ms": r.created_ms }))
                    .collect();
                println!("{}", Value::Array(list));
            } else {
                for run in runs {
                    println!("{}  {:<18} {}", run.id, run.status, run.workflow);
                }
            }
            Ok(0)
        }
        Command::Show { run, db, json } => {
            let store = open_store(&db)?;
            store
                .run(&run)
                .map_err(|e| usage(e.to_string()))?
                .ok_or_else(|| usage(format!("no run `{run}` in {}", db.display())))?;
            let records = store.step_records(&run).map_err(|e| usage(e.to_string()))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&records).map_err(|e| usage(e.to_string()))?
                );
            } else {
                for record in records {
                    let depth = record.path.matches('/').count();
                    let attempts = record.attempts.len();
                    println!(
                        "{}{}  {:?}  {} ms{}",
                        "  ".repeat(depth),
                        record.path,
                        record.status,
                        record.ended_ms.saturating_sub(record.started_ms),
                        if attempts > 1 {
                            format!("  ({attempts} attempts)")
                        } else {
                            String::new()
                        }
                    );
                    for attempt in record.attempts.iter().filter(|a| a.error.is_some()) {
                        println!(
                            "{}  attempt {}: {}",
                            "  ".repeat(depth),
                            attempt.index + 1,
                            attempt.error.as_deref().unwrap_or("")
                        );
                    }
                }
            }
            Ok(0)
        }
    }
}

/// Runs (or resumes) a run and reports it; the exit code says how it ended.
async fn execute(
    store: &Arc<dyn Store>,
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    json: bool,
) -> Result<u8> {
    let durability = plan
        .workflow(workflow)
        .map_or(flow_plan::Durability::Full, |w| w.durability);
    let journal = Arc::clone(store)
        .open_journal(run_id, durability)
        .map_err(|e| usage(e.to_string()))?;
    let provider: Arc<dyn Provider> = match flow_runtime::llm::provider_from_env().map_err(usage)? {
        Some(provider) => provider,
        None => {
            eprintln!(
                "flow: no LLM provider is configured (set FLOW_LLM_BASE_URL); recipes answer with the offline provider's fabricated outputs"
            );
            Arc::new(OfflineProvider)
        }
    };

    let journal_for_flush = Arc::clone(&journal);
    // A spinner with the step being journaled, on a terminal only: scripts
    // and `--json` get clean output.
    let progress = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar
    });
    let recorder: Arc<dyn Journal> = match &progress {
        Some(bar) => Arc::new(Progress {
            inner: journal.clone(),
            bar: bar.clone(),
            steps: std::sync::atomic::AtomicUsize::new(0),
        }),
        None => journal.clone(),
    };
    let services = Services {
        provider,
        effects: journal,
        mcp: None,
        journal: recorder,
    };
    // The workflow's timeout counts active time across invocations of the run.
    let spent = store
        .run(run_id)
        .ok()
        .flatten()
        .map_or(0, |row| row.active_ms.max(0) as u64);
    let started = std::time::Instant::now();
    // Active time is recorded each second while the run executes, so that a
    // crash does not hand the recovered run a fresh budget.
    const TICK: std::time::Duration = std::time::Duration::from_secs(1);
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let ticker = {
        let (store, run_id, ticks) = (Arc::clone(store), run_id.to_string(), Arc::clone(&ticks));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            interval.tick().await;
            loop {
                interval.tick().await;
                if store.add_active(&run_id, TICK).is_ok() {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let input_again = input.clone();
    let outcome = flow_runtime::interp::run_within(
        plan,
        workflow,
        run_id,
        input,
        services,
        std::time::Duration::from_millis(spent),
    )
    .await;
    ticker.abort();
    let _ = ticker.await;
    let recorded = TICK * ticks.load(std::sync::atomic::Ordering::SeqCst);
    let active = started.elapsed().saturating_sub(recorded);
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // Under `durability approval`, this is where the run's records are kept.
    journal_for_flush
        .flush()
        .await
        .map_err(|e| usage(format!("cannot persist the run: {}", e.message)))?;
    // A decision taken while this process was running the run (`flow approve`
    // from elsewhere) is not in this invocation's journal: run again to use it.
    if let Outcome::Parked { pending } = &outcome {
        let records = store
            .step_records(run_id)
            .map_err(|e| usage(e.to_string()))?;
        let decided = pending.iter().any(|approval| {
            records
                .iter()
                .any(|r| r.path == approval.path && r.status != StepStatus::Pending)
        });
        if decided {
            store
                .finish_run(run_id, "running", &Value::Null, active)
                .map_err(|e| usage(e.to_string()))?;
            if store
                .claim_run(run_id, &["running"])
                .map_err(|e| usage(e.to_string()))?
            {
                return Box::pin(execute(store, plan, workflow, run_id, input_again, json)).await;
            }
        }
    }
    let (status, code) = match &outcome {
        Outcome::Completed { .. } => ("completed", 0),
        Outcome::Parked { .. } => ("pending_approval", 3),
        Outcome::Failed { .. } => ("failed", 1),
    };
    let record = serde_json::to_value(&outcome).map_err(|e| usage(e.to_string()))?;
    store
        .finish_run(run_id, status, &record, active)
        .map_err(|e| usage(e.to_string()))?;
    if json {
        let mut report = json!({ "run_id": run_id, "status": status });
        match &outcome {
            Outcome::Completed { output } => report["output"] = output.clone(),
            Outcome::Parked { pending } => {
                report["pending_approvals"] = serde_json::to_value(pending).unwrap_or(Value::Null);
            }
            Outcome::Failed { error, step } => {
                report["error"] =
                    json!({ "kind": error.kind, "message": error.message, "step": step });
            }
        }
        println!("{report}");
    } else {
        match &outcome {
            Outcome::Completed { output } => {
                println!("run {run_id} completed");
                println!(
                    "{}",
                    serde_json::to_string_pretty(output).unwrap_or_default()
                );
            }
            Outcome::Parked { pending } => {
                println!("run {run_id} is waiting for {} approval(s):", pending.len());
                for approval in pending {
                    println!(
                        "  {}  approvers: {}  \"{}\"",
                        approval.path,
                        approval.approvers.join(", "),
                        approval.message
                    );
                    println!(
                        "    flow approve {run_id} {} --as {}",
                        approval.path,
                        approval
                            .approvers
                            .first()
                            .map_or("APPROVER", String::as_str)
                    );
                }
            }
            Outcome::Failed { error, step } => {
                println!(
                    "run {run_id} failed{}: {}",
                    step.as_deref()
                        .map(|s| format!(" at step `{s}`"))
                        .unwrap_or_default(),
                    error.message
                );
            }
        }
    }
    Ok(code)
}

/// The run's journal, reporting each step it records on the spinner.
struct Progress {
    inner: Arc<dyn RunLog>,
    bar: indicatif::ProgressBar,
    steps: std::sync::atomic::AtomicUsize,
}

impl Journal for Progress {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        self.inner.lookup(path)
    }

    fn record<'a>(
        &'a self,
        record: StepRecord,
    ) -> BoxFuture<'a, std::result::Result<(), StepError>> {
        let done = self
            .steps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.bar.set_message(format!(
            "{done} steps · {} {:?}",
            record.path, record.status
        ));
        self.inner.record(record)
    }
}

struct Disk;

impl flow_compiler::SourceLoader for Disk {
    fn load(&self, path: &str) -> std::result::Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

/// A plan from `flowc build` output, or compiled from a `.flow` source.
fn load_plan(file: &Path) -> Result<Plan> {
    let path = file
        .to_str()
        .ok_or_else(|| usage(format!("{} is not a UTF-8 path", file.display())))?;
    if path.ends_with(".json") {
        let text =
            std::fs::read_to_string(file).map_err(|e| usage(format!("cannot read {path}: {e}")))?;
        return Plan::from_json(&text).map_err(|e| usage(format!("{path}: {e}")));
    }
    let checked = flow_compiler::check(path, &Disk)
        .map_err(|e| usage(format!("cannot read {}: {}", e.path, e.message)))?;
    if checked.has_errors() {
        for diagnostic in checked.diagnostics.iter().filter(|d| d.is_error()) {
            let file = checked.file(diagnostic.primary.file);
            let (line, column) =
                flow_compiler::diagnostic::line_col(&file.text, diagnostic.primary.span.start);
            eprintln!(
                "{}:{line}:{column}: error {}: {}",
                file.path,
                diagnostic.code.as_str(),
                diagnostic.message
            );
        }
        return Err(Fail(
            1,
            format!("{path} does not check; see `flowc check {path}`"),
        ));
    }
    flow_compiler::lower(&checked).ok_or_else(|| Fail(1, format!("{path} could not be lowered")))
}

fn pick_workflow(plan: &Plan, wanted: Option<&str>) -> Result<String> {
    let names: Vec<&str> = plan.workflows.iter().map(|w| w.name.as_str()).collect();
    match (wanted, names.as_slice()) {
        (Some(name), _) if names.contains(&name) => Ok(name.to_string()),
        (Some(name), _) => Err(usage(format!(
            "no workflow `{name}`; the workflows are {}",
            names.join(", ")
        ))),
        (None, [only]) => Ok((*only).to_string()),
        (None, []) => Err(usage("the file declares no workflow")),
        (None, _) => Err(usage(format!(
            "name one with --workflow: {}",
            names.join(", ")
        ))),
    }
}

fn read_input(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| usage(format!("{} is not JSON: {e}", path.display())))
}

fn open_store(db: &Path) -> Result<Arc<dyn Store>> {
    // SQLite is the embedded default; the rest of the CLI sees only `Store`.
    let store: Arc<dyn Store> = SqliteStore::open(db)
        .map_err(|e| usage(format!("cannot open the store {}: {e}", db.display())))?;
    Ok(store)
}

/// A run id unique enough for one store: the time in microseconds and the
/// process id, in base 36.
fn new_run_id() -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    format!(
        "run-{}-{}",
        base36(micros),
        base36(u64::from(std::process::id()))
    )
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The decision time, in seconds since the epoch (RFC 3339 formatting needs
/// a date library this binary does not otherwise need).
fn timestamp() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    seconds.to_string()
}
