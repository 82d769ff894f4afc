//! `flowc`, the flow compiler's command line: init a project; check, build, diff, explain,
//! format, graph and lock `.flow` workflows; its own shell completions and man pages.
//!
//! Exit codes are part of the interface, for CI: 0 when clean, 1 when the
//! sources have problems (errors, warnings under `--deny-warnings`, files that
//! `fmt --check` would change), 2 for usage and IO errors.

/// `print!` that ends the process when stdout has been closed (`flowc
/// explain --list | head`), with the status a shell gives a process killed
/// by SIGPIPE, as Unix tools do (and as `flow`'s `out!`), rather than
/// panicking; `outln!` is its `println!`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(error) = write!(std::io::stdout(), $($arg)*)
            && error.kind() == std::io::ErrorKind::BrokenPipe
        {
            std::process::exit(141);
        }
    }};
}

macro_rules! outln {
    ($($arg:tt)*) => {{
        out!("{}\n", format_args!($($arg)*))
    }};
}

mod commands;
mod loader;
mod parallel;
mod render;
mod report;
mod testing;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

/// See the workspace Cargo.toml for why the binaries use mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How a command ended; the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Exit {
    Ok = 0,
    /// The sources have problems: errors, denied warnings, unformatted files.
    Problems = 1,
    /// The command could not do its work: a bad argument, a path that cannot
    /// be read or written.
    Usage = 2,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

#[derive(Debug, Parser)]
#[command(name = "flowc", version, about = "The flow workflow compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check files and directories (recursively, `*.flow`) for errors.
    Check {
        /// How to print diagnostics.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Fail (exit 1) on warnings too.
        #[arg(long)]
        deny_warnings: bool,
        /// Check again whenever a `.flow` file or `flow.lock` under the
        /// paths (a file's folder for a file) changes; stop with Ctrl-C.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        project: ProjectArg,
        /// Files and directories to check.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Write a starter project (a workflow, its input, its tests, editor
    /// settings) that checks, tests and runs at once; never over a file.
    Init {
        /// Where (made when missing).
        #[arg(value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
    /// Check a file and write its plan (JSON) for the runtime.
    Build {
        /// The file to build.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Where to write the plan (`-` for stdout); default: FILE with `.plan.json`.
        #[arg(short, long, value_name = "PLAN.json")]
        output: Option<PathBuf>,
        /// Build only this workflow of the file.
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// How to print diagnostics.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Say, for each place a run of OLD can wait or stop at (each gate,
    /// each step a run can fail at), whether it can go on on NEW.
    ///
    /// OLD and NEW are `.flow` files or plans that `flowc build` wrote
    /// (`*.json`). Exit 0 when every run can move, 1 when some cannot, 2
    /// when a version cannot be read or does not check.
    Diff {
        /// The version runs started on.
        #[arg(value_name = "OLD")]
        old: PathBuf,
        /// The version they would go on on.
        #[arg(value_name = "NEW")]
        new: PathBuf,
        /// Compare only this workflow (default: every workflow of OLD).
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// How to print the comparison.
        #[arg(long, value_enum, default_value_t = commands::diff::DiffFormat::Human)]
        format: commands::diff::DiffFormat,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Print the documentation of a diagnostic code (`E101` or
    /// `unknown-step`) or of a `flowc diff` code (`D002`).
    Explain {
        /// The code or its name.
        #[arg(required_unless_present = "list", value_name = "CODE")]
        code: Option<String>,
        /// List every code with its summary.
        #[arg(long, conflicts_with = "code")]
        list: bool,
    },
    /// Format files and directories (recursively, `*.flow`) in place; a
    /// file that does not parse is left as it is, and said (exit 1).
    Fmt {
        /// Change nothing: list the files that would change, and exit 1 if any.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        project: ProjectArg,
        /// Files and directories to format.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Start every MCP server the files and their imports declare, ask it for
    /// its tools, and write them to `flow.lock` beside the files, for `check`.
    ///
    /// This runs programs: every `mcp` server declared in the files, or in
    /// the files they import, is started (its `command`, with its `args` and
    /// `env`) or reached (its `url`). Each command is printed on stderr
    /// before it starts, with the names of its environment variables (not
    /// their values); `--dry-run` lists them and starts nothing. Lock only
    /// files you would trust as a script.
    Lock {
        /// How long each server may take to start and list its tools, in seconds.
        #[arg(long, default_value_t = 60, value_name = "SECONDS")]
        timeout: u64,
        /// List the commands that would be started and the URLs that would
        /// be reached, start nothing, write nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        project: ProjectArg,
        /// Files and directories (recursively, `*.flow`).
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Run the tests (`test "..." { ... }` blocks) of files and directories
    /// (recursively, `*.flow`) on the interpreter, in memory and in virtual
    /// time: recipes answer as the tests mock them, approvals are decided
    /// as they say.
    ///
    /// Exit 0 when every test passed, 1 when a test failed or a file does
    /// not check, 2 for usage and IO errors.
    Test {
        /// Run only the tests whose name contains TEXT.
        #[arg(long, value_name = "TEXT")]
        filter: Option<String>,
        /// How to print the results.
        #[arg(long, value_enum, default_value_t = commands::test::TestFormat::Human)]
        format: commands::test::TestFormat,
        /// Report, per workflow, each branch (if/else arms, error handlers,
        /// approval decisions, loops with no and several items, parallel
        /// branches failing) and the tests that took it.
        #[arg(long)]
        coverage: bool,
        /// Fail (exit 1) when a workflow's branch coverage is below N
        /// percent, from 0 to 100; implies `--coverage`.
        #[arg(long, value_name = "N", value_parser = percent)]
        min_coverage: Option<f64>,
        /// Answer the recipe calls a test does not mock with the offline
        /// provider's made-up values (deterministic, fitting the recipe's
        /// output type) instead of failing the test.
        #[arg(long)]
        offline: bool,
        #[command(flatten)]
        project: ProjectArg,
        /// Files and directories to test (default: the current folder).
        #[arg(value_name = "PATH", default_value = ".")]
        paths: Vec<PathBuf>,
    },
    /// Print a Mermaid flowchart of a workflow (steps, branches, loops,
    /// parallel joins and approval gates).
    Graph {
        /// The file that declares the workflow.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The workflow to draw, when the file declares several.
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Print a shell's completion script for `flowc`: `flowc completions
    /// bash > ~/.local/share/bash-completion/completions/flowc`.
    Completions { shell: clap_complete::Shell },
    /// Write `flowc`'s man pages (`flowc.1`, `flowc-check.1`, ...) into a
    /// folder.
    Man {
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
}

/// The project whose files a program may import.
#[derive(Debug, clap::Args)]
struct ProjectArg {
    /// The project folder: imports may not lead outside it (no absolute
    /// paths, no `..` or symbolic link out of it). Default: the folder
    /// named, or the folder of the file named.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

/// Output formats of `check` and `build`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Graphical reports with source snippets, on stderr.
    Human,
    /// One JSON document on stdout.
    Json,
    /// GitHub Actions annotations (`::error file=...::message`) on stdout.
    Github,
}

fn main() -> ExitCode {
    // Transparent huge pages off, as in the runtime's processes
    // (runtime/src/allocator.rs): with them, a cold check of a large file
    // now and then stalled while the kernel compacted memory for a huge
    // page (docs/benchmarks.md, B6), for the same median time. This covers
    // what the system would make huge unasked; mimalloc, built with
    // `no_thp`, never asks.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let cli = Cli::parse();
    let exit = match cli.command {
        Command::Check {
            format,
            deny_warnings,
            watch: false,
            project,
            paths,
        } => commands::check::run(&paths, project.root.as_deref(), format, deny_warnings),
        Command::Check {
            format,
            deny_warnings,
            watch: true,
            project,
            paths,
        } => commands::check::watch(&paths, project.root.as_deref(), format, deny_warnings),
        Command::Init { dir } => commands::init::run(&dir),
        Command::Test {
            filter,
            format,
            coverage,
            min_coverage,
            offline,
            project,
            paths,
        } => commands::test::run(
            &paths,
            project.root.as_deref(),
            commands::test::Options {
                filter: filter.as_deref(),
                format: Some(format),
                coverage,
                min_coverage,
                offline,
            },
        ),
        Command::Build {
            file,
            output,
            workflow,
            format,
            project,
        } => commands::build::run(
            &file,
            project.root.as_deref(),
            output.as_deref(),
            workflow.as_deref(),
            format,
        ),
        Command::Diff {
            old,
            new,
            workflow,
            format,
            project,
        } => commands::diff::run(
            &old,
            &new,
            project.root.as_deref(),
            workflow.as_deref(),
            format,
        ),
        Command::Explain { code, list } => commands::explain::run(code.as_deref(), list),
        Command::Fmt {
            check,
            project,
            paths,
        } => commands::fmt::run(&paths, project.root.as_deref(), check),
        Command::Graph {
            file,
            workflow,
            project,
        } => commands::graph::run(&file, project.root.as_deref(), workflow.as_deref()),
        Command::Lock {
            timeout,
            dry_run,
            project,
            paths,
        } => commands::lock::run(
            &paths,
            project.root.as_deref(),
            std::time::Duration::from_secs(timeout),
            dry_run,
        ),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "flowc", &mut std::io::stdout());
            Exit::Ok
        }
        Command::Man { dir } => match clap_mangen::generate_to(Cli::command(), &dir) {
            Ok(()) => {
                // Said, as `flow man` says it: without --dir they land in
                // the current folder.
                outln!(
                    "wrote flowc.1 and a page for each command (flowc-check.1, ...) in {}",
                    dir.display()
                );
                Exit::Ok
            }
            Err(error) => {
                eprintln!(
                    "error: cannot write man pages to {}: {error}",
                    dir.display()
                );
                Exit::Usage
            }
        },
    };
    exit.into()
}

/// A percentage, from 0 to 100 (`--min-coverage 101` could never be met).
fn percent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=100.0).contains(&value) => Ok(value),
        Ok(_) => Err("a percentage is from 0 to 100".to_string()),
        Err(_) => Err("not a number".to_string()),
    }
}
