//! `flow`: runs a workflow on the embedded store (a SQLite file), approves or
//! rejects its gates, cancels runs, lists runs, pending approvals, knowledge-
//! base documents and notifications, and shows a run's trace. With `--server
//! URL --api-key KEY` the same commands go to a flowd (`remote.rs`), with the
//! same output and exit codes.
//!
//! Exit codes are part of the interface: 0 the run completed, 3 it is parked
//! at an approval, 1 it failed (or the source does not check, or its input
//! does not match the workflow's input: the run is recorded as failed before
//! its first step), 2 a usage or store error, or a decision or cancel that
//! cannot apply (nothing changed).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory as _, Parser, Subcommand};

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

mod deliver;
mod lists;
mod remote;
mod style;
mod trace;

use flow_plan::Plan;
use flow_runtime::approval::{DecideError, Decision};
use flow_runtime::journal::{StepRecord, StepStatus, failed_at};
use flow_runtime::limit::{LimitedProvider, Limiter};
use flow_runtime::mcp::{McpPool, McpPoolConfig};
use flow_runtime::offline::OfflineProvider;
use flow_runtime::runner::{self, Observer, RunRecord};
use flow_runtime::services::Provider;
use flow_runtime::sqlite::SqliteStore;
use flow_runtime::store::{KbQuery, NO_ACCOUNT, NewRun, RunQuery, RunRow, RunStatus, Store};
use lists::{GateLine, RunLine};
use serde_json::{Value, json};
use style::{DEFAULT_DB, Paint};

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
    /// Varies the offline provider's answers (used when no LLM provider is
    /// configured): they depend on the recipe, the step's path, the call's
    /// input and this seed only, so a run is repeatable with the same
    /// seed. Give the same one to `flow approve`, `flow recover` and `flow redrive` to go
    /// on as the run started.
    #[arg(long, global = true, env = "FLOW_OFFLINE_SEED", default_value_t = 0)]
    seed: u64,
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
        /// The run's input: a JSON file, `-` for standard input, or JSON
        /// itself (`'{"ticket_id": "T-1"}'`). Optional for a workflow
        /// without inputs.
        #[arg(long, value_name = "FILE|-|JSON")]
        input: Option<String>,
        /// The largest input accepted, in bytes: an input is stored with
        /// its run and sent to models, so an unbounded one costs memory,
        /// disk and tokens (flowd's bound on a request is the same 2 MiB).
        #[arg(long, env = "FLOW_MAX_INPUT_BYTES", default_value_t = MAX_INPUT_BYTES)]
        max_input_bytes: u64,
        #[command(flatten)]
        store: StoreArg,
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
        #[arg(long = "as", value_name = "APPROVER", value_parser = person)]
        approver: String,
        #[arg(long)]
        reject: bool,
        #[arg(long)]
        comment: Option<String>,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a run that is running or waiting at an approval: it becomes
    /// `cancelled` and never resumes.
    Cancel {
        run: String,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Continue a failed or cancelled run from where it stopped: completed
    /// steps are kept, the steps that failed it run again (with their retry
    /// budget anew), then the rest; the workflow's deadline starts over. A
    /// run is redriven at most 10 times.
    Redrive {
        run: String,
        /// Go on on this version of the workflow (a `.flow` file or a
        /// `flowc build` plan), if the run can from where it stopped
        /// (`flowc diff` says which runs can).
        #[arg(long, value_name = "FILE")]
        to: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArg,
        /// Print the run record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move a parked run to another version of its workflow (a `.flow` file
    /// or a `flowc build` plan) where it can go on from the gates it waits
    /// at; refused, with why, where it cannot. The move is in its trace.
    Migrate {
        run: String,
        file: PathBuf,
        /// Say whether the run can move, and move nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Resume every run left `running` by a process that died, and every
    /// parked run whose approval expired. Completed steps are not run again;
    /// the step in flight runs again. With `--json`, one run record per line.
    /// A run whose stored plan no longer loads is named on standard error
    /// and left as it is (exit 2, after the others resumed); running its
    /// source again stores the plan again, and the next recover takes it.
    Recover {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// List runs, newest first: when each started and last changed, its
    /// workflow and status (`running (interrupted)`: left by a process that
    /// is gone, for `flow recover`).
    Runs {
        /// Only runs with this status.
        #[arg(long, value_parser = run_status)]
        status: Option<RunStatus>,
        /// Only runs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// At most this many (default: all; a flowd answers at most 1000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Write a `test` block from a recorded run: its input, each recipe's
    /// and tool's recorded answers as mocks, each approval's decision, and
    /// its status and output as expectations; `flowc test` runs it against
    /// the workflow's source.
    TestFrom {
        run: String,
        /// Write the test to FILE (e.g. `support_triage.run.test.flow`,
        /// beside the workflow's file) instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show a run's trace: how it stands, then its steps as a tree that
    /// follows the workflow's nesting, each with its kind, status, active
    /// time and attempts; approvals with their decision, or the command
    /// that decides them.
    Show {
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The run started last.
        #[arg(long)]
        last: bool,
        /// Show the run's output and each step's.
        #[arg(long)]
        output: bool,
        #[command(flatten)]
        store: StoreArg,
        /// The step records as JSON (each with `trace_version`).
        #[arg(long)]
        json: bool,
    },
    /// List the approvals runs are waiting at, with the command that
    /// decides each.
    Approvals {
        /// Only those this person may decide (required with --server).
        #[arg(long = "as", value_name = "APPROVER", value_parser = person)]
        approver: Option<String>,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Read the knowledge base that `kb_write` steps write and recipes
    /// draw context from.
    Kb {
        #[command(subcommand)]
        command: KbCommand,
    },
    /// List notifications, newest first: handoffs to departments and
    /// requests to approvers.
    Notifications {
        /// Only those to this department or approver (repeatable).
        #[arg(long = "to", value_name = "AUDIENCE")]
        audiences: Vec<String>,
        /// The person reading: with --server, what they were notified of
        /// (required there: flowd resolves their departments and groups).
        #[arg(long = "as", value_name = "READER", value_parser = person)]
        reader: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Print a shell's completion script for `flow`: `flow completions bash
    /// > ~/.local/share/bash-completion/completions/flow`.
    Completions { shell: clap_complete::Shell },
    /// Write `flow`'s man pages (`flow.1`, `flow-run.1`, ...) into a folder.
    Man {
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum KbCommand {
    /// List documents by collection and title, each with its version and
    /// first line.
    List {
        /// Only this collection's.
        #[arg(long)]
        collection: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Print a document: `flow kb show COLLECTION/TITLE`.
    Show {
        #[arg(value_name = "COLLECTION/TITLE")]
        document: String,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Find documents by words, best match first (the full-text index
    /// that recipes' context is drawn from).
    Search {
        #[arg(required = true, value_name = "WORDS")]
        words: Vec<String>,
        /// Only this collection's.
        #[arg(long)]
        collection: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
}

/// The embedded store a local command reads and writes.
#[derive(clap::Args)]
struct StoreArg {
    /// The SQLite file of the local store (ignored with --server).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_DB, value_parser = sqlite_file)]
    db: PathBuf,
}

/// `--db`: a file, not a database server's URL (regression, an audit:
/// `flow cancel --db postgres://...` said "no store at postgres://...").
fn sqlite_file(db: &str) -> std::result::Result<PathBuf, String> {
    let scheme = db
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => Err(
            "flow's local commands open a SQLite file; the runs in a flowd's PostgreSQL store are driven through that flowd: `flow --server URL --api-key KEY COMMAND ...`".to_string(),
        ),
        _ => Ok(PathBuf::from(db)),
    }
}

/// `--status`: a run status as the store, the API and `--json` spell it.
fn run_status(name: &str) -> std::result::Result<RunStatus, String> {
    RunStatus::parse(name).ok_or_else(|| {
        let names: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
        format!("the statuses are {}", names.join(", "))
    })
}

/// Who `--as` names: not blank (regression, an audit: `--as ""` was
/// answered "error:  may not decide this approval").
fn person(name: &str) -> std::result::Result<String, String> {
    if name.trim().is_empty() {
        return Err("name a person: their email, or a name the workflow's approvers hold".into());
    }
    Ok(name.to_string())
}

/// A failure before or around a run: the message and the exit code.
struct Fail(u8, String);

type Result<T> = std::result::Result<T, Fail>;

fn usage(message: impl Into<String>) -> Fail {
    Fail(2, message.into())
}

fn main() -> ExitCode {
    flow_runtime::allocator::configure_process();
    let cli = Cli::parse();
    // What needs neither a store nor a runtime: the definitions of the
    // commands themselves.
    match &cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "flow", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Man { dir } => {
            return match clap_mangen::generate_to(Cli::command(), dir) {
                Ok(()) => {
                    // Said: without --dir they land in the current folder
                    // (an audit found 18 files there and no word of them).
                    println!(
                        "wrote flow.1 and a page for each command (flow-run.1, ...) in {}",
                        dir.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!(
                        "error: cannot write man pages to {}: {error}",
                        dir.display()
                    );
                    ExitCode::from(2)
                }
            };
        }
        _ => {}
    }
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
        // This thread drives one run at a time and nothing else: its waits
        // for a commit poll before they sleep (`driven_alone`).
        None => runtime.block_on(flow_runtime::store::driven_alone(dispatch(
            cli.command,
            &mcp,
            cli.seed,
        ))),
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

/// A store's failure as the CLI's: a usage or store error (2).
fn store_error(error: impl std::fmt::Display) -> Fail {
    usage(error.to_string())
}

/// The plan run `row` runs on, from the store; one that does not load is
/// named with its run and what mends it (regression: the parse error was
/// all that was said).
async fn run_plan(store: &Arc<dyn Store>, row: &RunRow) -> Result<Plan> {
    store.plan(&row.plan_hash).await.map_err(|error| {
        usage(format!(
            "run {} ({}): its plan {} does not load from the store: {error}; running the workflow's source again (`flow run FILE`) stores it anew",
            row.id, row.workflow, row.plan_hash
        ))
    })
}

async fn dispatch(command: Command, mcp: &Arc<McpPool>, seed: u64) -> Result<u8> {
    // One limiter for every run this process executes (`recover` runs many).
    let limiter = flow_runtime::limit::limiter_from_env().map_err(usage)?;
    let paint = Paint::for_stdout();
    match command {
        Command::Run {
            file,
            workflow,
            root,
            input,
            max_input_bytes,
            store: StoreArg { db },
            json,
        } => {
            let file = file.ok_or_else(|| usage("name the .flow file or plan to run"))?;
            let plan = load_plan(&file, root.as_deref())?;
            let workflow = pick_workflow(&plan, &file, workflow.as_deref())?;
            let input = run_input(input.as_deref(), max_input_bytes, plan.workflow(&workflow))?;
            let store = open_store(&db, Use::Writes)?;
            store.put_plan(&plan).await.map_err(store_error)?;
            let run_id = runner::new_run_id();
            // The run's row is written as its first attempt goes out, in
            // the commit of its first record when that comes at once.
            let start = runner::Invocation::Start {
                account: NO_ACCOUNT.to_string(),
                run: NewRun {
                    workflow: workflow.clone(),
                    plan_hash: plan.hash.clone(),
                    input: input.clone(),
                    // Set by `execute`, which chooses the provider.
                    provider: None,
                },
            };
            execute(
                &store, &db, &limiter, mcp, &plan, &workflow, &run_id, start, input, json, seed,
            )
            .await
        }
        Command::Approve {
            run,
            step_path,
            approver,
            reject,
            comment,
            store: StoreArg { db },
            json,
        } => {
            let store = open_existing_store(&db, Use::Writes)?;
            let row = find_run(&store, &run, &db).await?;
            answerable_here(&store, &run, provider_kind()?).await?;
            // The plan before the decision, which makes the run this
            // process's: nothing that can fail comes between it and the run.
            let plan = run_plan(&store, &row).await?;
            // The local CLI has no approver groups: it decides as the person
            // named, who must be in the approval's list.
            let decision = Decision {
                approver,
                groups: Vec::new(),
                approved: !reject,
                comment,
                decided_at: flow_runtime::time::now_rfc3339(),
            };
            match store
                .decide(&run, &step_path, &decision)
                .await
                .map_err(store_error)?
            {
                Ok(()) => {}
                Err(refused @ DecideError::UnknownStep(_)) => {
                    let records = store.step_records(&run).await.map_err(store_error)?;
                    let waiting: Vec<&str> = records
                        .iter()
                        .filter(|r| r.status == StepStatus::Pending)
                        .map(|r| r.path.as_str())
                        .collect();
                    return Err(usage(format!(
                        "{refused}{}",
                        gate_hint(&step_path, &waiting)
                    )));
                }
                // Here nothing resumes a run by itself, as flowd's sweep
                // does: the command that does is named (an audit).
                Err(refused @ DecideError::Expired(_)) => {
                    return Err(usage(format!(
                        "{refused}: `flow recover --db {}` resumes it",
                        db.display()
                    )));
                }
                Err(refused) => return Err(usage(refused.to_string())),
            }
            // A run that another live process is executing picks the
            // decision up itself when it parks (see `execute`).
            if !store
                .claim_run(&run, &[RunStatus::PendingApproval, RunStatus::Running])
                .await
                .map_err(store_error)?
            {
                eprintln!(
                    "flow: decision recorded; run {run} is running in another process, which will continue it"
                );
                return Ok(0);
            }
            execute(
                &store,
                &db,
                &limiter,
                mcp,
                &plan,
                &row.workflow,
                &run,
                runner::Invocation::Resume,
                row.input,
                json,
                seed,
            )
            .await
        }
        Command::Cancel {
            run,
            store: StoreArg { db },
            json,
        } => {
            let store = open_existing_store(&db, Use::Writes)?;
            let row = find_run(&store, &run, &db).await?;
            if !store.cancel_run(&run).await.map_err(store_error)? {
                return Err(already_ended(&run, row.status));
            }
            let code = cancelled(&run, json);
            // Its `deliver on cancelled`, as flowd delivers it (regression:
            // the local cancel delivered nothing, and said nothing of it).
            if let Ok(plan) = store.plan(&row.plan_hash).await {
                let event = flow_plan::RunEvent::Cancelled;
                deliver::on_event(&store, &plan, &row.workflow, &run, event, None).await;
            }
            Ok(code)
        }
        Command::Redrive {
            run,
            to,
            store: StoreArg { db },
            json,
        } => {
            let store = open_existing_store(&db, Use::Writes)?;
            let row = find_run(&store, &run, &db).await?;
            answerable_here(&store, &run, provider_kind()?).await?;
            let plan = match &to {
                None => run_plan(&store, &row).await?,
                Some(file) => version_for(&store, &row, file).await?,
            };
            let to_plan = to.as_ref().map(|_| plan.hash.as_str());
            if store
                .redrive_run(&run, to_plan)
                .await
                .map_err(store_error)?
                .is_none()
            {
                // Refused as the run is now: another process may have
                // redriven it meanwhile (regression: it was said to be
                // redriven 0 times, the most it may be).
                let now = find_run(&store, &run, &db).await.unwrap_or(row);
                return Err(usage(
                    flow_runtime::store::RedriveRefused::of(&now).to_string(),
                ));
            }
            execute(
                &store,
                &db,
                &limiter,
                mcp,
                &plan,
                &row.workflow,
                &run,
                runner::Invocation::Resume,
                row.input,
                json,
                seed,
            )
            .await
        }
        Command::Migrate {
            run,
            file,
            dry_run,
            store: StoreArg { db },
        } => {
            let store = open_existing_store(&db, Use::Writes)?;
            let row = find_run(&store, &run, &db).await?;
            if row.status != RunStatus::PendingApproval {
                // The way on for a run that stopped; none for one that ended well.
                let instead = match row.status {
                    RunStatus::Failed | RunStatus::Cancelled => {
                        format!(
                            " (a {} one goes on with `flow redrive {run} --to FILE`)",
                            row.status
                        )
                    }
                    RunStatus::Running => " (a running one moves once it parks)".to_string(),
                    _ => String::new(),
                };
                return Err(usage(format!(
                    "run `{run}` is {}: only a parked run moves{instead}",
                    row.status
                )));
            }
            let plan = version_for(&store, &row, &file).await?;
            // Said as it is: a move to the plan it is on moved nothing, and
            // its history would have said it had.
            if plan.hash == row.plan_hash {
                out!("run {run} is on that version already ({})", plan.hash);
                return Ok(0);
            }
            if dry_run {
                out!("run {run} can move to {}", plan.hash);
                return Ok(0);
            }
            if !store
                .move_run(&run, &row.plan_hash, &plan.hash)
                .await
                .map_err(store_error)?
            {
                return Err(usage(format!(
                    "run `{run}` was decided, cancelled or moved meanwhile; nothing moved"
                )));
            }
            out!("run {run} moved to {}", plan.hash);
            Ok(0)
        }
        Command::Recover {
            store: StoreArg { db },
            json,
        } => {
            let Some(store) = listed_store(&db, "recover", Use::Writes)? else {
                if !json {
                    out!("no run to recover");
                }
                return Ok(0);
            };
            let recovery = runner::claim_runs_to_recover(
                store.as_ref(),
                |account| account == NO_ACCOUNT,
                |hash| {
                    let store = Arc::clone(&store);
                    async move { store.plan(&hash).await.map(Arc::new) }
                },
            )
            .await
            .map_err(store_error)?;
            // Said first; the rest recover without them, and the exit code
            // says a store error (2) at the end.
            for (row, error) in &recovery.unloadable {
                eprintln!(
                    "error: run {} ({}) stays unfinished: its plan does not load: {error}",
                    row.id, row.workflow
                );
            }
            let runs = recovery.claimed;
            if runs.is_empty() && recovery.unloadable.is_empty() && !json {
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
                        runner::Invocation::Resume,
                        row.input,
                        json,
                        seed,
                    )
                    .await
                });
            }
            // Failed outweighs parked, which outweighs completed; a store
            // error (2) outweighs them all.
            let mut worst = if recovery.unloadable.is_empty() { 0 } else { 2 };
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
        Command::Runs {
            status,
            workflow,
            limit,
            store: StoreArg { db },
            json,
        } => {
            let Some(store) = listed_store(&db, "list", Use::Reads)? else {
                lists::print_runs(&[], json, paint);
                return Ok(0);
            };
            let query = RunQuery {
                workflow,
                status,
                limit: limit.unwrap_or(usize::MAX),
                before: None,
            };
            let rows = store
                .account_runs(NO_ACCOUNT, &query)
                .await
                .map_err(store_error)?;
            let interrupted = interrupted_runs(&store).await?;
            let runs: Vec<RunLine> = rows
                .into_iter()
                .map(|row| RunLine {
                    interrupted: interrupted.contains(&row.id),
                    run_id: row.id,
                    workflow: row.workflow,
                    status: row.status,
                    created_ms: row.created_ms,
                    updated_ms: row.updated_ms,
                })
                .collect();
            lists::print_runs(&runs, json, paint);
            Ok(0)
        }
        Command::TestFrom {
            run,
            out,
            store: StoreArg { db },
        } => {
            let store = open_existing_store(&db, Use::Reads)?;
            let row = find_run(&store, &run, &db).await?;
            let plan = run_plan(&store, &row).await?;
            let records = store.step_records(&row.id).await.map_err(store_error)?;
            let text = runner::test_from_row(&plan, &row, &records).map_err(usage)?;
            write_test(&text, out.as_deref())
        }
        Command::Show {
            run,
            last: _,
            output,
            store: StoreArg { db },
            json,
        } => {
            let store = open_existing_store(&db, Use::Reads)?;
            // Without a run, clap made sure `--last` was given.
            let row = match run {
                Some(run) => find_run(&store, &run, &db).await?,
                None => {
                    let newest = RunQuery {
                        limit: 1,
                        ..RunQuery::default()
                    };
                    let rows = store
                        .account_runs(NO_ACCOUNT, &newest)
                        .await
                        .map_err(store_error)?;
                    rows.into_iter()
                        .next()
                        .ok_or_else(|| usage(format!("no runs in {}", db.display())))?
                }
            };
            let records = store.step_records(&row.id).await.map_err(store_error)?;
            let interrupted = row.status == RunStatus::Running
                && interrupted_runs(&store).await?.contains(&row.id);
            let record = RunRecord::of_row(&row);
            let summary = trace::RunSummary {
                interrupted,
                plan_hash: Some(row.plan_hash.clone()),
                active_ms: Some(row.active_ms),
                history: store.run_history(&row.id).await.map_err(store_error)?,
                ..summary_of(&record)
            };
            print_trace(&summary, &records, output, style::Via::Db(Some(&db)), json);
            Ok(0)
        }
        Command::Approvals {
            approver,
            store: StoreArg { db },
            json,
        } => {
            let Some(store) = listed_store(&db, "list", Use::Reads)? else {
                lists::print_approvals(&[], json, style::Via::Db(Some(&db)), paint);
                return Ok(0);
            };
            // A run still running has its gates too (one parallel branch
            // waits while another runs): each decides as a parked run's.
            let mut rows = Vec::new();
            for status in [RunStatus::PendingApproval, RunStatus::Running] {
                let query = RunQuery {
                    status: Some(status),
                    limit: usize::MAX,
                    ..RunQuery::default()
                };
                rows.extend(
                    store
                        .account_runs(NO_ACCOUNT, &query)
                        .await
                        .map_err(store_error)?,
                );
            }
            // The gate that has waited longest first.
            rows.sort_by_key(|row| row.updated_ms);
            let now_ms = flow_runtime::time::now_ms();
            let mut gates = Vec::new();
            let mut expired = 0;
            for row in rows {
                let records = store.step_records(&row.id).await.map_err(store_error)?;
                for record in records.iter().filter(|r| {
                    r.kind == flow_plan::StepKind::Approval && r.status == StepStatus::Pending
                }) {
                    let Ok(gate) = serde_json::from_value::<flow_runtime::approval::PendingApproval>(
                        record.input.clone(),
                    ) else {
                        continue;
                    };
                    if !approver
                        .as_deref()
                        .is_none_or(|approver| gate.may_decide(approver, &[]))
                    {
                        continue;
                    }
                    // Past its expiry a gate takes no decision: `flow
                    // recover` applies its `on_expire`.
                    if flow_runtime::approval::gate_due_ms(record).is_some_and(|due| due <= now_ms)
                    {
                        expired += 1;
                        continue;
                    }
                    gates.push(GateLine::new(&row.id, &row.workflow, row.updated_ms, gate));
                }
            }
            lists::print_approvals(&gates, json, style::Via::Db(Some(&db)), paint);
            if expired > 0 && !json {
                eprintln!(
                    "{expired} more expired: `flow recover` applies what each does on expiry (`on_expire`)"
                );
            }
            Ok(0)
        }
        Command::Kb { command } => kb(command, paint).await,
        Command::Notifications {
            audiences,
            reader,
            limit,
            store: StoreArg { db },
            json,
        } => {
            let Some(store) = listed_store(&db, "list", Use::Reads)? else {
                lists::print_notifications(&[], json, paint);
                return Ok(0);
            };
            let list = if audiences.is_empty() {
                store.account_notifications(NO_ACCOUNT, limit).await
            } else {
                let query = flow_runtime::store::NotificationQuery {
                    unread_only: false,
                    limit,
                };
                let reader = reader.as_deref().unwrap_or_default();
                store
                    .notifications(NO_ACCOUNT, &audiences, reader, &query)
                    .await
            }
            .map_err(store_error)?;
            lists::print_notifications(&list, json, paint);
            Ok(0)
        }
        Command::Completions { .. } | Command::Man { .. } => Ok(0),
    }
}

/// `flow kb`, on the local store: flowd's API has no knowledge-base reads.
async fn kb(command: KbCommand, paint: Paint) -> Result<u8> {
    match command {
        KbCommand::List {
            collection,
            limit,
            store: StoreArg { db },
            json,
        } => {
            let query = KbQuery {
                collection,
                terms: Vec::new(),
                limit,
            };
            list_documents(&db, &query, json, paint).await
        }
        KbCommand::Search {
            words,
            collection,
            limit,
            store: StoreArg { db },
            json,
        } => {
            let terms = flow_runtime::kb::search_terms(&words.join(" "));
            if terms.is_empty() {
                return Err(usage(
                    "search for words of three letters or more: the index keeps no shorter ones",
                ));
            }
            let query = KbQuery {
                collection,
                terms,
                limit,
            };
            list_documents(&db, &query, json, paint).await
        }
        KbCommand::Show {
            document,
            store: StoreArg { db },
            json,
        } => {
            let (collection, title) = lists::parse_document_id(&document).ok_or_else(|| {
                usage(format!(
                    "name a document as COLLECTION/TITLE (as `flow kb list` shows it), not `{document}`"
                ))
            })?;
            let store = open_existing_store(&db, Use::Reads)?;
            let found = store
                .kb_document(NO_ACCOUNT, collection, title)
                .await
                .map_err(store_error)?;
            match found {
                Some(found) => {
                    lists::print_document(&found, json, paint);
                    Ok(0)
                }
                None => {
                    let query = KbQuery {
                        collection: Some(collection.to_string()),
                        terms: Vec::new(),
                        limit: 1_000,
                    };
                    let others = store
                        .kb_documents(NO_ACCOUNT, &query)
                        .await
                        .map_err(store_error)?;
                    let titles: Vec<&str> = others.iter().map(|d| d.title.as_str()).collect();
                    let hint =
                        match flow_compiler::suggest::did_you_mean(title, titles.iter().copied()) {
                            Some(meant) => format!("; did you mean `{collection}/{meant}`?"),
                            None => String::new(),
                        };
                    Err(usage(format!(
                        "no document `{document}` in {}{hint}",
                        db.display()
                    )))
                }
            }
        }
    }
}

/// `flow kb list` and `flow kb search`: the documents `query` finds.
async fn list_documents(db: &Path, query: &KbQuery, json: bool, paint: Paint) -> Result<u8> {
    let Some(store) = listed_store(db, "list", Use::Reads)? else {
        lists::print_documents(&[], json, paint);
        return Ok(0);
    };
    let found = store
        .kb_documents(NO_ACCOUNT, query)
        .await
        .map_err(store_error)?;
    lists::print_documents(&found, json, paint);
    Ok(0)
}

/// The run `run` of the local store, or a usage error that names the store.
/// Lays out a test written from a run with the compiler's formatter (the
/// layout `flowc fmt` writes), then prints it or writes it to `out`.
fn write_test(text: &str, out: Option<&Path>) -> Result<u8> {
    let text = flow_compiler::format::format_source(text).map_err(|error| {
        usage(format!(
            "the test written from the run does not parse: {error}"
        ))
    })?;
    // A test no `flowc test` would read is said now, not when it is run
    // (an audit: a 15 MiB answer made a test of 15 MiB).
    let most = flow_loader::MAX_SOURCE_BYTES;
    if text.len() as u64 > most {
        return Err(usage(format!(
            "the test written from the run is {} bytes, more than the {most} a flow file may have: the run's input or answers are too large to mock",
            text.len()
        )));
    }
    match out {
        Some(path) => {
            std::fs::write(path, &text)
                .map_err(|error| usage(format!("cannot write {}: {error}", path.display())))?;
            eprintln!("flow: wrote {}", path.display());
        }
        None => out!("{}", text.trim_end()),
    }
    Ok(0)
}

async fn find_run(store: &Arc<dyn Store>, run: &str, db: &Path) -> Result<RunRow> {
    store
        .run(run)
        .await
        .map_err(store_error)?
        .ok_or_else(|| usage(format!("no run `{run}` in {}", db.display())))
}

/// The runs left `running` that no live process holds: interrupted (a
/// signal, a crash), for `flow recover`.
async fn interrupted_runs(store: &Arc<dyn Store>) -> Result<std::collections::HashSet<String>> {
    Ok(store
        .orphaned_runs()
        .await
        .map_err(store_error)?
        .into_iter()
        .map(|row| row.id)
        .collect())
}

/// The end of a refusal to decide at `path`: the gate meant, when `path`
/// is a likely typo of one, and the gates the run waits at.
fn gate_hint(path: &str, waiting: &[&str]) -> String {
    let mut hint = String::new();
    if let Some(meant) = flow_compiler::suggest::did_you_mean(path, waiting.iter().copied()) {
        hint.push_str(&format!("\n  help: did you mean `{meant}`?"));
    }
    if waiting.is_empty() {
        hint.push_str("\n  help: the run waits at no approval");
    } else {
        hint.push_str(&format!(
            "\n  help: the run waits at {}",
            flow_compiler::suggest::candidates_list(waiting.iter().copied())
        ));
    }
    hint
}

/// A cancel that found the run already ended: nothing changed (2).
fn already_ended(run: &str, status: RunStatus) -> Fail {
    usage(format!(
        "run `{run}` has already ended ({status}): nothing to cancel"
    ))
}

/// Says that `run` is cancelled; its exit code.
fn cancelled(run: &str, json: bool) -> u8 {
    if json {
        lists::print_json(&json!({ "run_id": run, "status": RunStatus::Cancelled }));
    } else {
        out!("run {run} cancelled");
    }
    0
}

/// What the trace's header says of a run, from its record.
fn summary_of(record: &RunRecord) -> trace::RunSummary {
    trace::RunSummary {
        id: record.run_id.clone(),
        workflow: record.workflow.clone(),
        status: record.status,
        interrupted: false,
        plan_hash: None,
        created_ms: record.created_ms,
        active_ms: None,
        error: record.error.clone(),
        output: record.output.clone(),
        history: Vec::new(),
        in_flight: Vec::new(),
    }
}

/// `flow show`'s answer: the trace for people, or its records as JSON.
fn print_trace(
    summary: &trace::RunSummary,
    records: &[StepRecord],
    outputs: bool,
    via: style::Via<'_>,
    json: bool,
) {
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&trace::json(records)).unwrap_or_default()
        );
        return;
    }
    let options = trace::Options {
        outputs,
        via,
        paint: Paint::for_stdout(),
        now_ms: flow_runtime::time::now_ms(),
    };
    let text = trace::render(summary, records, &options);
    out!("{}", text.trim_end());
}

/// The kind of provider this process answers recipes with: the one the
/// environment configures, else `offline`.
fn provider_kind() -> Result<&'static str> {
    Ok(flow_runtime::llm::provider_from_env()
        .map_err(usage)?
        .map_or("offline", |(kind, _)| kind))
}

/// Refuses to go on with `run_id` in a process with no provider configured
/// when the run began with a real one (`runner::missing_provider`;
/// a `flow recover` in a shell without FLOW_LLM_* did).
async fn answerable_here(store: &Arc<dyn Store>, run_id: &str, kind: &str) -> Result<()> {
    let missing = runner::missing_provider(store.as_ref(), run_id, kind)
        .await
        .map_err(store_error)?;
    match missing {
        Some(provider) => Err(usage(format!(
            "run {run_id} began with the `{provider}` provider, and none is configured here: \
             its next steps would get the offline provider's made-up answers; set FLOW_LLM_BASE_URL \
             (and FLOW_LLM_PROVIDER, FLOW_LLM_API_KEY) as when it began"
        ))),
        None => Ok(()),
    }
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
    invocation: runner::Invocation,
    input: Value,
    json: bool,
    seed: u64,
) -> Result<u8> {
    // Built once: the kind it is of goes into the run's history, or is
    // checked against it (`answerable_here`).
    let configured = flow_runtime::llm::provider_from_env().map_err(usage)?;
    let kind = configured.as_ref().map_or("offline", |(kind, _)| *kind);
    let mut invocation = invocation;
    match &mut invocation {
        runner::Invocation::Start { run, .. } => run.provider = Some(kind.to_string()),
        runner::Invocation::Resume => answerable_here(store, run_id, kind).await?,
        runner::Invocation::Created { .. } => {}
    }
    let provider: Arc<dyn Provider> = match configured {
        Some((_, provider)) => provider,
        None => {
            // Said where it matters: a workflow of no recipe asks no model.
            let mut asks_a_model = false;
            if let Some(workflow) = plan.workflow(workflow) {
                workflow.each_step(&mut |step| {
                    asks_a_model |= step.action.kind() == flow_plan::StepKind::Recipe;
                });
            }
            if asks_a_model {
                eprintln!(
                    "flow: no LLM provider is configured (set FLOW_LLM_BASE_URL); recipes answer with the offline provider's fabricated outputs"
                );
            }
            Arc::new(OfflineProvider::new(seed))
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
    // It names the run from the start: a `flow run` killed (-9) leaves its
    // last frame on the screen, with the id `flow recover` resumes.
    let progress = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar.set_message(run_id.to_string());
        bar
    });
    let observer: Option<Observer> = progress.clone().map(|bar| {
        let steps = std::sync::atomic::AtomicUsize::new(0);
        let run_id = run_id.to_string();
        Arc::new(move |record: &StepRecord| {
            let done = steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            bar.set_message(format!(
                "{run_id} · {done} steps · {} {}",
                record.path,
                record.status.as_str()
            ));
            Ok(())
        }) as Observer
    });
    if mcp.servers_from_plans() {
        announce_mcp_servers(plan, workflow);
    }
    let mcp: Arc<dyn flow_runtime::services::McpClient> =
        Arc::new(flow_runtime::mcp::PoolClient(mcp.clone()));
    // A new run's row rides in its first step's commit: a signal before
    // that stores it here, so that `flow recover` has it.
    let new_run = match &invocation {
        runner::Invocation::Start { account, run } => Some((account.clone(), run.clone())),
        _ => None,
    };
    let driven = runner::drive(
        store,
        plan,
        workflow,
        run_id,
        invocation,
        input,
        provider,
        Some(mcp),
        observer,
        None,
        None,
    );
    let outcome = tokio::select! {
        outcome = driven => match outcome {
            Ok(outcome) => outcome,
            // Cancelled meanwhile (`flow cancel`, flowd): said so, as a
            // run that did not complete (exit 1), not as an error of this
            // process's.
            Err(runner::DriveError::Lost)
                if matches!(
                    store.run(run_id).await,
                    Ok(Some(row)) if row.status == RunStatus::Cancelled
                ) =>
            {
                if let Some(bar) = &progress {
                    bar.finish_and_clear();
                }
                let cancelled = runner::RunRecord::new(run_id, RunStatus::Cancelled);
                return Ok(report(&cancelled, json, style::Via::Db(Some(db)), seed));
            }
            Err(error) => return Err(usage(error.to_string())),
        },
        signal = interrupted() => {
            if let Some(bar) = &progress {
                bar.finish_and_clear();
            }
            return Ok(give_up(store, db, run_id, new_run, signal, json).await);
        }
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // The answer first: destinations never delay it.
    let code = report(
        &runner::run_record(run_id, &outcome),
        json,
        style::Via::Db(Some(db)),
        seed,
    );
    deliver::locally(store, plan, workflow, run_id, &outcome).await;
    Ok(code)
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
/// interrupted rather than running and `flow recover` takes it. A run not
/// stored yet (`new_run`: its row waited for its first step's commit) is
/// stored first; before, it was lost, and the message said to recover it.
/// With `--json`, the run's record (`running`) is printed as for any end:
/// a script reading standard output got nothing, not even the run's id.
async fn give_up(
    store: &Arc<dyn Store>,
    db: &Path,
    run_id: &str,
    new_run: Option<(String, NewRun)>,
    signal: (&str, u8),
    json: bool,
) -> u8 {
    let (what, code) = signal;
    if let Some((account, run)) = new_run
        && matches!(store.run(run_id).await, Ok(None))
    {
        // The writer takes writes in order: a start the dropped run had
        // queued is committed first, and this one then conflicts, harmlessly.
        let _ = store.create_run(run_id, &account, &run, None).await;
    }
    if !matches!(store.run(run_id).await, Ok(Some(_))) {
        eprintln!(
            "flow: {what}: run {run_id} stopped before anything of it was stored; run it again"
        );
        return code;
    }
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
    if json {
        let record = runner::RunRecord::new(run_id, RunStatus::Running);
        out!("{}", serde_json::to_string(&record).unwrap_or_default());
    }
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
        if let flow_plan::Action::Browser(browser) = &step.action
            && !used.contains(&browser.server)
        {
            used.push(browser.server);
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
/// parked, 1 failed or cancelled. A parked run's hints name `db`, the
/// local store it is in, unless it is the default.
fn report(record: &RunRecord, json: bool, via: style::Via<'_>, seed: u64) -> u8 {
    let code = match record.status {
        RunStatus::Completed => 0,
        RunStatus::PendingApproval => 3,
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Running => 1,
    };
    let run_id = &record.run_id;
    if json {
        out!("{}", serde_json::to_string(record).unwrap_or_default());
        return code;
    }
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
                    "  {}  approvers: {}",
                    approval.path,
                    approval.approvers.join(", ")
                );
                for line in style::quoted(&approval.message) {
                    out!("    {line}");
                }
                out!(
                    "    {}",
                    style::approve_command(run_id, &approval.path, &approval.approvers, via, seed)
                );
            }
            out!(
                "  (add --reject to reject; `flow show {run_id}{}` shows the trace)",
                via.flag()
            );
        }
        RunStatus::Failed => {
            let error = record.error.as_ref();
            // The error's kind as `flow show` gives it (`server`,
            // `rate_limited`): what a script or a reader decides on.
            out!(
                "run {run_id} failed{}: {}{}",
                error
                    .map(|e| failed_at(e.step.as_deref(), e.attempts))
                    .unwrap_or_default(),
                error.map_or(String::new(), |e| format!("{}: ", e.kind.name())),
                style::inert(error.map_or("", |e| e.message.as_str()))
            );
        }
        RunStatus::Cancelled => out!("run {run_id} was cancelled"),
        RunStatus::Running => out!("run {run_id} is running"),
    }
    code
}

/// The commands against a flowd.
async fn dispatch_remote(command: Command, server: &remote::Server) -> Result<u8> {
    let paint = Paint::for_stdout();
    match command {
        Command::Run {
            file,
            workflow,
            root,
            input,
            max_input_bytes,
            store: _,
            json,
        } => {
            let (workflow, input) = match file {
                Some(file) => {
                    // Compiled here, imports and all, and deployed as a plan.
                    let plan = load_plan(&file, root.as_deref())?;
                    let workflow = pick_workflow(&plan, &file, workflow.as_deref())?;
                    let input =
                        run_input(input.as_deref(), max_input_bytes, plan.workflow(&workflow))?;
                    server.deploy(&plan).await?;
                    (workflow, input)
                }
                None => {
                    let workflow = workflow.ok_or_else(|| {
                        usage("name a .flow file to deploy and run, or a deployed workflow with --workflow")
                    })?;
                    // flowd checks the input against the deployed workflow.
                    (
                        workflow,
                        run_input(input.as_deref(), max_input_bytes, None)?,
                    )
                }
            };
            let run_id = server.start(&workflow, input).await?;
            Ok(report(
                &server.settled(&run_id).await?,
                json,
                style::Via::Server(server.url()),
                0,
            ))
        }
        Command::Approve {
            run,
            step_path,
            approver,
            reject,
            comment,
            store: _,
            json,
        } => {
            server
                .decide(&run, &step_path, &approver, !reject, comment)
                .await?;
            Ok(report(
                &server.settled(&run).await?,
                json,
                style::Via::Server(server.url()),
                0,
            ))
        }
        Command::Cancel {
            run,
            store: _,
            json,
        } => {
            server.cancel(&run).await?;
            Ok(cancelled(&run, json))
        }
        Command::Redrive {
            run,
            to,
            store: _,
            json,
        } => {
            if to.is_some() {
                return Err(usage(
                    "with --server, a run goes on on a deployed version: `POST /v1/runs/RUN/redrive` with `{\"version\": N}`",
                ));
            }
            server.redrive(&run).await?;
            Ok(report(
                &server.settled(&run).await?,
                json,
                style::Via::Server(server.url()),
                0,
            ))
        }
        Command::Migrate { .. } => Err(usage(
            "with --server, parked runs move between deployed versions: `POST /v1/workflows/NAME/migrate`",
        )),
        Command::Recover { .. } => Err(usage(
            "flowd resumes its runs itself when it starts; `flow recover` is for the embedded store",
        )),
        Command::Runs {
            status,
            workflow,
            limit,
            store: _,
            json,
        } => {
            let runs = server
                .runs(workflow.as_deref(), status, limit.unwrap_or(1_000))
                .await?;
            lists::print_runs(&runs, json, paint);
            Ok(0)
        }
        Command::TestFrom { run, out, store: _ } => {
            let text = server.test_from(&run).await?;
            write_test(&text, out.as_deref())
        }
        Command::Show {
            run,
            last: _,
            output,
            store: _,
            json,
        } => {
            let run = match run {
                Some(run) => run,
                None => server
                    .runs(None, None, 1)
                    .await?
                    .into_iter()
                    .next()
                    .map(|line| line.run_id)
                    .ok_or_else(|| usage("the account has no runs"))?,
            };
            let record = server.run(&run).await?;
            let (records, history, in_flight) = server.trace(&run).await?;
            let summary = trace::RunSummary {
                history,
                in_flight,
                ..summary_of(&record)
            };
            print_trace(
                &summary,
                &records,
                output,
                style::Via::Server(server.url()),
                json,
            );
            Ok(0)
        }
        Command::Approvals {
            approver,
            store: _,
            json,
        } => {
            let approver = approver.ok_or_else(|| {
                usage("with --server, say whose approvals to list: --as APPROVER (flowd resolves their groups)")
            })?;
            lists::print_approvals(
                &server.approvals(&approver).await?,
                json,
                style::Via::Server(server.url()),
                paint,
            );
            Ok(0)
        }
        Command::Notifications {
            audiences,
            reader,
            limit,
            store: _,
            json,
        } => {
            let reader = reader.ok_or_else(|| {
                usage("with --server, say whose notifications to list: --as READER (flowd resolves their departments and groups)")
            })?;
            let mut list = server.notifications(&reader, false, limit).await?;
            if !audiences.is_empty() {
                list.retain(|note| audiences.contains(&note.audience));
            }
            lists::print_notifications(&list, json, paint);
            Ok(0)
        }
        Command::Kb { .. } => Err(usage(
            "flowd's API has no knowledge-base reads yet; `flow kb` reads a local store (--db)",
        )),
        Command::Completions { .. } | Command::Man { .. } => Ok(0),
    }
}

/// How to name a wider project, the end of the hint of an import refused
/// for leaving the project.
const WIDEN: &str = "to import from a wider folder, name it with `flow run --root DIR`";

/// The plan of `file`, stored, if run `row` can go on on it from where it
/// stands; else every reason it cannot (exit 1).
async fn version_for(store: &Arc<dyn Store>, row: &RunRow, file: &Path) -> Result<Plan> {
    let new = load_plan(file, None)?;
    let old = run_plan(store, row).await?;
    let records = store.step_records(&row.id).await.map_err(store_error)?;
    let problems = flow_runtime::versions::move_problems(&old, &new, &row.workflow, row, &records);
    if !problems.is_empty() {
        let mut message = format!(
            "run `{}` cannot go on on {} from where it stands:",
            row.id,
            file.display()
        );
        for problem in &problems {
            // A problem of the whole workflow (D001) is at no step.
            let at = match problem.step.as_str() {
                "" => String::new(),
                step => format!(" at {step}"),
            };
            message.push_str(&format!(
                "\n  {}{at}: {} (flowc explain {})",
                problem.code.as_str(),
                problem.reason,
                problem.code.as_str()
            ));
        }
        return Err(Fail(1, message));
    }
    store.put_plan(&new).await.map_err(store_error)?;
    Ok(new)
}

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
    let (checked, plan) = flow_compiler::check_and_lower(&path, &project.loader(Some(&path)))
        .map_err(|e| {
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
    // A file of tests lowers to a plan without workflows; it is `flowc
    // test`'s to run, whatever the file is called.
    if !checked.analysis.tests.is_empty() && checked.analysis.workflows.is_empty() {
        return Err(usage(format!(
            "{path} declares no workflow: it holds tests, and `flowc test {path}` runs them"
        )));
    }
    plan.ok_or_else(|| Fail(1, format!("{path} could not be lowered")))
}

fn pick_workflow(plan: &Plan, file: &Path, wanted: Option<&str>) -> Result<String> {
    let names: Vec<&str> = plan.workflows.iter().map(|w| w.name.as_str()).collect();
    match (wanted, names.as_slice()) {
        (Some(name), _) if names.contains(&name) => Ok(name.to_string()),
        (Some(name), _) => Err(usage(format!(
            "no workflow `{name}`; the workflows are {}",
            names.join(", ")
        ))),
        (None, [only]) => Ok((*only).to_string()),
        (None, []) => Err(usage(format!("{} declares no workflow", file.display()))),
        (None, _) => Err(usage(format!(
            "name one with --workflow: {}",
            names.join(", ")
        ))),
    }
}

/// The default of `flow run --max-input-bytes`.
const MAX_INPUT_BYTES: u64 = 2 * 1024 * 1024;

/// The run's input, as `--input` gives it: `-` for standard input, JSON
/// itself when it starts with `{` or `[` (no file path a person types
/// does), else a file's path; each read no further than `max_bytes` (so
/// that a huge file, a device or an endless pipe costs no more than the
/// bound to refuse). Without `--input`, `{}` for a workflow that takes no
/// input (or one not known here: flowd checks a deployed one's), and a
/// usage error naming the fields for one that does.
fn run_input(
    input: Option<&str>,
    max_bytes: u64,
    workflow: Option<&flow_plan::Workflow>,
) -> Result<Value> {
    use std::io::Read as _;
    let Some(input) = input else {
        return match workflow {
            Some(workflow) if !workflow.input_fields.is_empty() => Err(usage(format!(
                "workflow `{}` takes an input ({}): give --input FILE.json, --input - (standard input) or --input '{{...}}'",
                workflow.name,
                workflow.input_fields.join(", ")
            ))),
            _ => Ok(json!({})),
        };
    };
    if input.trim().is_empty() {
        return Err(usage(
            "--input is empty: give a file, `-` (standard input) or JSON such as '{\"text\": \"hi\"}'",
        ));
    }
    let (what, bytes) = if input == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| usage(format!("cannot read standard input: {e}")))?;
        ("standard input".to_string(), bytes)
    } else if input.trim_start().starts_with(['{', '['])
        // `null`, `42`, `"text"`: JSON, unless a file has that name.
        || (!std::path::Path::new(input).exists()
            && serde_json::from_str::<Value>(input).is_ok())
    {
        ("--input".to_string(), input.as_bytes().to_vec())
    } else {
        let cannot = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => usage(format!(
                "--input {input}: no such file, and not JSON either"
            )),
            _ => usage(format!("cannot read {input}: {e}")),
        };
        let mut bytes = Vec::new();
        std::fs::File::open(input)
            .map_err(cannot)?
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(cannot)?;
        (input.to_string(), bytes)
    };
    if bytes.len() as u64 > max_bytes {
        return Err(usage(format!(
            "{what} is over {max_bytes} bytes, the largest input accepted (--max-input-bytes or FLOW_MAX_INPUT_BYTES raise it)"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| usage(format!("{what} is not UTF-8 text")))?;
    flow_plan::unique_keys::from_str(&text).map_err(|e| usage(format!("{what} is not JSON: {e}")))
}

/// The store of a command about a run that must be in it: a `--db` that
/// names no file (a typo) is said to, not made an empty store.
fn open_existing_store(db: &Path, used: Use) -> Result<Arc<dyn Store>> {
    if !db.exists() {
        return Err(usage(format!(
            "no store at {}: `flow run` makes one there; --db names another",
            db.display()
        )));
    }
    open_store(db, used)
}

/// The store of a command that lists (or recovers, `doing`) what one
/// holds: `None` at a `--db` that names no file, where there is nothing to
/// list, and where an empty store was made (a typo in --db left one behind).
fn listed_store(db: &Path, doing: &str, used: Use) -> Result<Option<Arc<dyn Store>>> {
    if db.exists() {
        return open_store(db, used).map(Some);
    }
    // A `--db` given that names no file is said (on stderr: the listing
    // stays what scripts read), since it may be a typo.
    if db != Path::new(DEFAULT_DB) {
        eprintln!(
            "flow: no store at {}: nothing to {doing} (`flow run --db` makes one)",
            db.display()
        );
    }
    Ok(None)
}

/// What a command does with its store.
#[derive(Clone, Copy)]
enum Use {
    /// Lists or shows: a store this user may only read will do.
    Reads,
    /// Runs, decides, moves or recovers.
    Writes,
}

fn open_store(db: &Path, used: Use) -> Result<Arc<dyn Store>> {
    // SQLite is the embedded default; the rest of the CLI sees only `Store`.
    let store: Arc<dyn Store> = match used {
        Use::Reads => SqliteStore::open_to_read(db),
        Use::Writes => SqliteStore::open(db),
    }
    .map_err(|e| usage(format!("cannot open the store {}: {e}", db.display())))?;
    Ok(store)
}
