//! `flow`: runs a workflow on the embedded store (a SQLite file), approves or
//! rejects its gates, lists runs and shows a run's trace. With `--server URL
//! --api-key KEY` the same commands go to a flowd (`remote.rs`), with the same
//! output and exit codes.
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

mod remote;
use flow_plan::Plan;
use flow_runtime::approval::Decision;
use flow_runtime::journal::StepRecord;
use flow_runtime::limit::{LimitedProvider, Limiter};
use flow_runtime::mcp::{McpPool, McpPoolConfig};
use flow_runtime::offline::OfflineProvider;
use flow_runtime::runner::{self, Observer, RunRecord};
use flow_runtime::services::Provider;
use flow_runtime::sqlite::SqliteStore;
use flow_runtime::store::{NO_ACCOUNT, RunStatus, Store};
use serde_json::{Value, json};

/// `println!` that ends the process when stdout has been closed (`flow runs |
/// head`), with the status a shell gives a process killed by SIGPIPE, as Unix
/// tools do, rather than panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(error) = writeln!(std::io::stdout(), $($arg)*)
            && error.kind() == std::io::ErrorKind::BrokenPipe
        {
            std::process::exit(141);
        }
    }};
}

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
    /// A flowd to run on instead of the embedded store (`http://host:8080`).
    #[arg(long, global = true, env = "FLOW_SERVER")]
    server: Option<String>,
    /// The API key of a flowd account, with --server.
    #[arg(long, global = true, env = "FLOW_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Refuse to start or reach the MCP servers that `.flow` files declare
    /// (their commands and URLs): for CI jobs that run files from pull
    /// requests. Browser steps then fail preflight, nothing started.
    #[arg(long, global = true, env = "FLOW_NO_MCP_FROM_FILE")]
    no_mcp_from_file: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workflow of a `.flow` file or a plan (`flowc build` output). With
    /// --server, the file's workflows are deployed first; without a file, the
    /// deployed workflow named by --workflow runs.
    Run {
        file: Option<PathBuf>,
        /// The workflow to run, when the file has several.
        #[arg(long)]
        workflow: Option<String>,
        /// The project folder of a `.flow` file: its imports may not lead
        /// outside it. Default: the file's folder.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// The run's input, a JSON file.
        #[arg(long)]
        input: PathBuf,
        /// The largest input accepted, in bytes: an input is stored with
        /// its run and sent to models, so an unbounded one costs memory,
        /// disk and tokens (flowd's bound on a request is the same 2 MiB).
        #[arg(long, env = "FLOW_MAX_INPUT_BYTES", default_value_t = MAX_INPUT_BYTES)]
        max_input_bytes: u64,
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
    // The runtime's warnings (a knowledge base that could not be read, a
    // limit not applied), in the words of flow's other messages.
    flow_runtime::log::init(flow_runtime::log::LogSettings::brief());
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
    let remote = match cli.server {
        Some(url) => match remote::Server::new(&url, cli.api_key) {
            Ok(server) => Some(server),
            Err(Fail(code, message)) => {
                eprintln!("error: {message}");
                return ExitCode::from(code);
            }
        },
        None => None,
    };
    // MCP: one pool of MCP connections for every run this process
    // executes; its servers are closed gracefully before the process exits.
    let mcp = Arc::new(McpPool::new(McpPoolConfig {
        servers_from_plans: !cli.no_mcp_from_file,
        ..McpPoolConfig::default()
    }));
    let dispatched = match remote {
        Some(server) => runtime.block_on(dispatch_remote(cli.command, &server)),
        None => runtime.block_on(dispatch(cli.command, &mcp)),
    };
    runtime.block_on(mcp.shutdown());
    match dispatched {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

async fn dispatch(command: Command, mcp: &Arc<McpPool>) -> Result<u8> {
    // One limiter for every run this process executes (`recover` runs many).
    let limiter = flow_runtime::limit::limiter_from_env().map_err(usage)?;
    match command {
        Command::Run {
            file,
            workflow,
            root,
            input,
            max_input_bytes,
            db,
            json,
        } => {
            let file = file.ok_or_else(|| usage("name the .flow file or plan to run"))?;
            let plan = load_plan(&file, root.as_deref())?;
            let workflow = pick_workflow(&plan, workflow.as_deref())?;
            let input = read_input(&input, max_input_bytes)?;
            let store = open_store(&db)?;
            store
                .put_plan(&plan)
                .await
                .map_err(|e| usage(e.to_string()))?;
            let run_id = runner::new_run_id();
            store
                .create_run(&run_id, NO_ACCOUNT, &workflow, &plan.hash, &input, None)
                .await
                .map_err(|e| usage(e.to_string()))?;
            execute(
                &store, &db, &limiter, mcp, &plan, &workflow, &run_id, input, json,
            )
            .await
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
                .await
                .map_err(|e| usage(e.to_string()))?
                .ok_or_else(|| usage(format!("no run `{run}` in {}", db.display())))?;
            // The local CLI has no approver groups: it decides as the person
            // named, who must be in the approval's list.
            let decision = Decision {
                approver,
                groups: Vec::new(),
                approved: !reject,
                comment,
                decided_at: flow_runtime::time::now_rfc3339(),
            };
            store
                .decide(&run, &step_path, &decision)
                .await
                .map_err(|e| usage(e.to_string()))?
                .map_err(|refused| usage(refused.to_string()))?;
            // A run that another live process is executing picks the
            // decision up itself when it parks (see `execute`).
            if !store
                .claim_run(&run, &[RunStatus::PendingApproval])
                .await
                .map_err(|e| usage(e.to_string()))?
            {
                eprintln!(
                    "flow: decision recorded; run {run} is running in another process, which will continue it"
                );
                return Ok(0);
            }
            let plan = store
                .plan(&row.plan_hash)
                .await
                .map_err(|e| usage(e.to_string()))?;
            execute(
                &store,
                &db,
                &limiter,
                mcp,
                &plan,
                &row.workflow,
                &run,
                row.input,
                json,
            )
            .await
        }
        Command::Recover { db, json } => {
            let store = open_store(&db)?;
            let runs = runner::claim_runs_to_recover(store.as_ref())
                .await
                .map_err(|e| usage(e.to_string()))?;
            if runs.is_empty() && !json {
                out!("no run to recover");
            }
            // Every run resumes at once: a restart brings them all back to
            // work together, not one after another.
            let mut resumed = tokio::task::JoinSet::new();
            for (row, plan) in runs {
                let (store, limiter) = (Arc::clone(&store), Arc::clone(&limiter));
                let (mcp, db) = (Arc::clone(mcp), db.clone());
                resumed.spawn(async move {
                    execute(
                        &store,
                        &db,
                        &limiter,
                        &mcp,
                        &plan,
                        &row.workflow,
                        &row.id,
                        row.input,
                        json,
                    )
                    .await
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
            let runs = store.runs().await.map_err(|e| usage(e.to_string()))?;
            // A run left `running` that no live process holds was
            // interrupted (a signal, a crash): `flow recover` resumes it.
            let orphaned: std::collections::HashSet<String> = store
                .orphaned_runs()
                .await
                .map_err(|e| usage(e.to_string()))?
                .into_iter()
                .map(|row| row.id)
                .collect();
            let list: Vec<Value> = runs
                .iter()
                .map(|r| {
                    json!({
                        "run_id": r.id,
                        "workflow": r.workflow,
                        "status": r.status,
                        "interrupted": orphaned.contains(&r.id),
                        "created_ms": r.created_ms,
                    })
                })
                .collect();
            print_runs(&list, json);
            Ok(0)
        }
        Command::Show { run, db, json } => {
            let store = open_store(&db)?;
            store
                .run(&run)
                .await
                .map_err(|e| usage(e.to_string()))?
                .ok_or_else(|| usage(format!("no run `{run}` in {}", db.display())))?;
            let records = store
                .step_records(&run)
                .await
                .map_err(|e| usage(e.to_string()))?;
            print_trace(&records, json)
        }
    }
}

/// The runs as `flow runs` prints them.
fn print_runs(runs: &[Value], json: bool) {
    if json {
        out!("{}", Value::Array(runs.to_vec()));
        return;
    }
    for run in runs {
        let status = run["status"].as_str().unwrap_or("");
        let status = if run["interrupted"] == true {
            format!("{status} (interrupted)")
        } else {
            status.to_string()
        };
        out!(
            "{}  {:<30} {}",
            run["run_id"].as_str().unwrap_or(""),
            status,
            run["workflow"].as_str().unwrap_or("")
        );
    }
    if runs.iter().any(|run| run["interrupted"] == true) {
        out!("interrupted runs resume with `flow recover`");
    }
}

/// A run's trace as `flow show` prints it.
fn print_trace(records: &[StepRecord], json: bool) -> Result<u8> {
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&records).map_err(|e| usage(e.to_string()))?
        );
    } else {
        for record in records {
            let depth = record.path.matches('/').count();
            let attempts = record.attempts.len();
            out!(
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
                out!(
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

/// Runs (or resumes) a run and reports it; the exit code says how it ended.
#[allow(clippy::too_many_arguments)] // reason: what one run needs; each caller has them at hand
async fn execute(
    store: &Arc<dyn Store>,
    db: &Path,
    limiter: &Arc<dyn Limiter>,
    mcp: &Arc<McpPool>,
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    json: bool,
) -> Result<u8> {
    let provider: Arc<dyn Provider> = match flow_runtime::llm::provider_from_env().map_err(usage)? {
        Some(provider) => provider,
        None => {
            eprintln!(
                "flow: no LLM provider is configured (set FLOW_LLM_BASE_URL); recipes answer with the offline provider's fabricated outputs"
            );
            Arc::new(OfflineProvider)
        }
    };
    // The local runs' account is the CLI's: one limit for all of them.
    let provider: Arc<dyn Provider> = Arc::new(LimitedProvider {
        inner: provider,
        limiter: Arc::clone(limiter),
        account: NO_ACCOUNT.to_string(),
    });
    // A spinner with the step being journaled, on a terminal only: scripts
    // and `--json` get clean output.
    let progress = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar
    });
    let observer: Option<Observer> = progress.clone().map(|bar| {
        let steps = std::sync::atomic::AtomicUsize::new(0);
        Arc::new(move |record: &StepRecord| {
            let done = steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            bar.set_message(format!(
                "{done} steps · {} {:?}",
                record.path, record.status
            ));
        }) as Observer
    });
    if mcp.servers_from_plans() {
        announce_mcp_servers(plan, workflow);
    }
    let mcp: Arc<dyn flow_runtime::services::McpClient> = mcp.clone();
    let driven = runner::drive(
        store,
        plan,
        workflow,
        run_id,
        input,
        provider,
        Some(mcp),
        observer,
        None,
    );
    let outcome = tokio::select! {
        outcome = driven => outcome.map_err(|e| usage(e.to_string()))?,
        signal = interrupted() => {
            if let Some(bar) = &progress {
                bar.finish_and_clear();
            }
            return Ok(give_up(store, db, run_id, signal).await);
        }
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(report(&runner::run_record(run_id, &outcome), json))
}

/// A signal that asks `flow` to stop: Ctrl-C, or SIGTERM (a service
/// manager, a container stopping). Its name and the exit code it gives.
async fn interrupted() -> (&'static str, u8) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(term) => term.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => ("interrupted", 130),
        _ = terminated => ("terminated", 143),
    }
}

/// Stops a run that a signal interrupted: its task is dropped where it is,
/// as a crash would drop it (the step in flight, if any, runs again when
/// the run resumes), and the run is given up, so that `flow runs` shows it
/// interrupted rather than running and `flow recover` takes it.
async fn give_up(store: &Arc<dyn Store>, db: &Path, run_id: &str, signal: (&str, u8)) -> u8 {
    let (what, code) = signal;
    let _ = store
        .finish_run(
            run_id,
            RunStatus::Running,
            &Value::Null,
            std::time::Duration::ZERO,
        )
        .await;
    eprintln!(
        "flow: {what}: run {run_id} stopped before it ended; a step that was running runs again when it resumes. Resume it with:\n  flow recover --db {}",
        db.display()
    );
    code
}

/// Says on stderr, before the first step, which commands the run may start
/// and which URLs it may reach for the MCP servers its workflow calls, as
/// the file declares them: running a file runs what it declares (as `make`
/// does), and a person should see what that is. The names of `env`
/// variables are shown, not their values.
fn announce_mcp_servers(plan: &Plan, workflow: &str) {
    let Some(workflow) = plan.workflow(workflow) else {
        return;
    };
    let mut used: Vec<u32> = Vec::new();
    workflow.each_step(&mut |step| {
        if let flow_plan::Action::Browser { server, .. } = &step.action
            && !used.contains(server)
        {
            used.push(*server);
        }
    });
    used.sort_unstable();
    for server in used
        .iter()
        .filter_map(|i| plan.mcp_servers.get(*i as usize))
    {
        let how = flow_runtime::mcp::describe_transport(&server.transport);
        let what = match &server.transport {
            flow_plan::McpTransport::Stdio { .. } => format!("starts {how}"),
            flow_plan::McpTransport::Http { .. } => format!("reaches {how}"),
        };
        eprintln!(
            "flow: MCP server `{}` {what} (declared in the file; --no-mcp-from-file refuses)",
            server.name
        );
    }
}

/// Prints how a run stands; the exit code that says it: 0 completed, 3
/// parked, 1 failed or cancelled.
fn report(record: &RunRecord, json: bool) -> u8 {
    let code = match record.status {
        RunStatus::Completed => 0,
        RunStatus::PendingApproval => 3,
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Running => 1,
    };
    let run_id = &record.run_id;
    if json {
        out!("{}", serde_json::to_string(record).unwrap_or_default());
    } else {
        match record.status {
            RunStatus::Completed => {
                out!("run {run_id} completed");
                out!(
                    "{}",
                    serde_json::to_string_pretty(record.output.as_ref().unwrap_or(&Value::Null))
                        .unwrap_or_default()
                );
            }
            RunStatus::PendingApproval => {
                let pending = record.pending_approvals.as_deref().unwrap_or_default();
                out!("run {run_id} is waiting for {} approval(s):", pending.len());
                for approval in pending {
                    out!(
                        "  {}  approvers: {}  \"{}\"",
                        approval.path,
                        approval.approvers.join(", "),
                        approval.message
                    );
                    out!(
                        "    flow approve {run_id} {} --as {}",
                        approval.path,
                        approval
                            .approvers
                            .first()
                            .map_or("APPROVER", String::as_str)
                    );
                }
            }
            RunStatus::Failed => {
                let error = record.error.as_ref();
                out!(
                    "run {run_id} failed{}: {}",
                    error
                        .and_then(|e| e.step.as_deref())
                        .map(|s| format!(" at step `{s}`"))
                        .unwrap_or_default(),
                    error.map_or("", |e| e.message.as_str())
                );
            }
            RunStatus::Cancelled => out!("run {run_id} was cancelled"),
            RunStatus::Running => out!("run {run_id} is running"),
        }
    }
    code
}

/// The commands against a flowd.
async fn dispatch_remote(command: Command, server: &remote::Server) -> Result<u8> {
    match command {
        Command::Run {
            file,
            workflow,
            root,
            input,
            max_input_bytes,
            db: _,
            json,
        } => {
            let input = read_input(&input, max_input_bytes)?;
            let workflow = match file {
                Some(file) => {
                    // Compiled here, imports and all, and deployed as a plan.
                    let plan = load_plan(&file, root.as_deref())?;
                    let workflow = pick_workflow(&plan, workflow.as_deref())?;
                    server.deploy(&plan).await?;
                    workflow
                }
                None => workflow.ok_or_else(|| {
                    usage("name a .flow file to deploy and run, or a deployed workflow with --workflow")
                })?,
            };
            let run_id = server.start(&workflow, input).await?;
            Ok(report(&server.settled(&run_id).await?, json))
        }
        Command::Approve {
            run,
            step_path,
            approver,
            reject,
            comment,
            db: _,
            json,
        } => {
            server
                .decide(&run, &step_path, &approver, !reject, comment)
                .await?;
            Ok(report(&server.settled(&run).await?, json))
        }
        Command::Recover { .. } => Err(usage(
            "flowd resumes its runs itself when it starts; `flow recover` is for the embedded store",
        )),
        Command::Runs { db: _, json } => {
            print_runs(&server.runs().await?, json);
            Ok(0)
        }
        Command::Show { run, db: _, json } => print_trace(&server.trace(&run).await?, json),
    }
}

/// How to name a wider project, the end of the hint of an import refused
/// for leaving the project.
const WIDEN: &str = "to import from a wider folder, name it with `flow run --root DIR`";

/// A plan from `flowc build` output, or compiled from a `.flow` source whose
/// imports stay inside `root` (default: the file's folder), read as `flowc`
/// reads them (`flow-loader`).
fn load_plan(file: &Path, root: Option<&Path>) -> Result<Plan> {
    let path = file
        .to_str()
        .ok_or_else(|| usage(format!("{} is not a UTF-8 path", file.display())))?;
    if path.ends_with(".json") {
        let text =
            std::fs::read_to_string(file).map_err(|e| usage(format!("cannot read {path}: {e}")))?;
        // A plan file is data anyone could have written: it is held to what
        // `flowc build` writes before anything is stored or run.
        let plan = Plan::from_json(&text).map_err(|e| usage(format!("{path}: {e}")))?;
        plan.validate()
            .map_err(|problems| usage(format!("{path}: {problems}")))?;
        return Ok(plan);
    }
    let project = match root {
        Some(root) => flow_loader::Project::new(root, WIDEN),
        None => flow_loader::Project::of_file(file, WIDEN),
    }
    .map_err(|e| usage(e.to_string()))?;
    let path = flow_compiler::check::normalize(path);
    let checked = flow_compiler::check(&path, &project.loader(Some(&path))).map_err(|e| {
        usage(match &e.hint {
            Some(hint) => format!("cannot read {}: {}\n  help: {hint}", e.path, e.message),
            None => format!("cannot read {}: {}", e.path, e.message),
        })
    })?;
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
            for hint in &diagnostic.hints {
                eprintln!("  help: {hint}");
            }
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

/// The default of `flow run --max-input-bytes`.
const MAX_INPUT_BYTES: u64 = 2 * 1024 * 1024;

/// The run's input from `path`, read no further than `max_bytes` (so that a
/// huge file, or a device, costs no more than the bound to refuse).
fn read_input(path: &Path, max_bytes: u64) -> Result<Value> {
    use std::io::Read as _;
    let cannot = |e: std::io::Error| usage(format!("cannot read {}: {e}", path.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(cannot)?
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > max_bytes {
        return Err(usage(format!(
            "{} is over {max_bytes} bytes, the largest input accepted (--max-input-bytes or FLOW_MAX_INPUT_BYTES raise it)",
            path.display()
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| usage(format!("{} is not UTF-8 text", path.display())))?;
    serde_json::from_str(&text).map_err(|e| usage(format!("{} is not JSON: {e}", path.display())))
}

fn open_store(db: &Path) -> Result<Arc<dyn Store>> {
    // SQLite is the embedded default; the rest of the CLI sees only `Store`.
    let store: Arc<dyn Store> = SqliteStore::open(db)
        .map_err(|e| usage(format!("cannot open the store {}: {e}", db.display())))?;
    Ok(store)
}
