//! `flowd`: the runtime daemon.
//!
//! * `flowd serve [--config flowd.toml]` serves the API until SIGINT/SIGTERM.
//! * `flowd check-config [--config flowd.toml]` checks the configuration.
//! * `flowd --help`, `flowd --version`.
//! * `flowd compile-worker`: what `serve` runs for each deploy it compiles
//!   (`flow_daemon::compile_worker`), not a command for people.
//!
//! Exit codes: 0 done, 2 a usage or configuration error (every problem listed).
//!
//! `serve` logs to standard error through `tracing`: `FLOWD_LOG` sets the
//! level (`info` by default; `debug`, or per module as
//! `warn,flow_runtime::mcp=debug`), `FLOWD_LOG_FORMAT` the form (`human`, the
//! default, or `json`: one object per line). Its first line at `info` is
//! `listening on ADDRESS`.

use std::process::ExitCode;

use flow_daemon::compile_worker;
use flow_daemon::config::{self, Config};
use flow_daemon::server;

/// See the workspace Cargo.toml for why the binaries use mimalloc; in
/// flowd, glibc's malloc and free took a fifth of the CPU of B9
/// (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `flowd --help`.
const HELP: &str = "\
flowd: the flow runtime as a service: deployed workflows started over HTTP,
approvals by email, webhooks, metrics, traces and a run inspector.

Usage: flowd <COMMAND> [--config FILE]

Commands:
  serve         Serve the API until SIGINT or SIGTERM (logs to standard error)
  check-config  Check the configuration; list every problem with its place

Options:
  --config FILE  The configuration file [default: flowd.toml]
  -h, --help     Print this help
  -V, --version  Print the version

Environment:
  FLOWD_*           Override the file's settings (FLOWD_LISTEN, FLOWD_STORE, ...)
  FLOWD_LOG         The log level: info (default), debug, or per module
  FLOWD_LOG_FORMAT  human (default) or json: one object per line
";

fn main() -> ExitCode {
    flow_runtime::allocator::configure_process();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // flowd's own child, one per deploy it compiles (not for people).
    if args.first().map(String::as_str) == Some(compile_worker::COMMAND) {
        return compile_worker::serve(&args[1..]);
    }
    // Asking for help or the version is answered whatever else is on the
    // line (`flowd serve --help`), as clap-based tools do.
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
    {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-V" | "--version"))
    {
        println!("flowd {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let mut args = args.into_iter();
    let (Some(command), rest) = (args.next(), args.collect::<Vec<_>>()) else {
        eprintln!("usage: flowd serve|check-config [--config flowd.toml] (flowd --help says more)");
        return ExitCode::from(2);
    };
    let path = match rest.as_slice() {
        [] => "flowd.toml".to_string(),
        [flag, path] if flag == "--config" => path.clone(),
        _ => {
            eprintln!("usage: flowd {command} [--config flowd.toml]");
            return ExitCode::from(2);
        }
    };
    if !matches!(command.as_str(), "serve" | "check-config") {
        eprintln!(
            "flowd: unknown command `{command}`; the commands are: serve, check-config (flowd --help says more)"
        );
        return ExitCode::from(2);
    }
    let config = match load(&path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    if command == "check-config" {
        println!(
            "{path}: ok ({} accounts, listening on {}, store {})",
            config.accounts.len(),
            config.listen,
            config.store
        );
        return ExitCode::SUCCESS;
    }
    let log = flow_runtime::log::LogSettings::parse(
        std::env::var("FLOWD_LOG").ok().as_deref(),
        std::env::var("FLOWD_LOG_FORMAT").ok().as_deref(),
        ["FLOWD_LOG", "FLOWD_LOG_FORMAT"],
    );
    match log {
        Ok(log) => flow_runtime::log::init(log),
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    }
    // SQLite's journal writer is a thread of its own: it gets a core.
    let runtime = if config.store.is_shared() {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_stack_size(flow_plan::limits::STACK_BYTES)
            .build()
    } else {
        flow_runtime::sqlite::async_runtime()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flowd: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let served = runtime.block_on(async {
        let daemon = server::Daemon::open(config).await?;
        server::serve(daemon, shutdown_signal(), |address| {
            tracing::info!("listening on {address}");
        })
        .await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("flowd: {message}");
            ExitCode::from(2)
        }
    }
}

fn load(path: &str) -> Result<Config, ExitCode> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        eprintln!("flowd: cannot read {path}: {error}");
        ExitCode::from(2)
    })?;
    config::load(path, &text, &config::Environment::of_process()).map_err(|problems| {
        for problem in &problems {
            eprintln!("error: {problem}");
        }
        ExitCode::from(2)
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
