//! The `flow-lsp` binary: the language server over standard input and output.
//!
//! Unlike `flowc` and `flow`, it keeps the system allocator: mimalloc's speed
//! on large inputs matters little for one document at a time, and its arenas
//! kept 50 MB resident after opening the examples and a 5,000-line file,
//! against 14 MB with glibc's malloc, at the same latency within the noise
//! (`cargo bench -p flow-lsp --bench lsp`, docs/benchmarks.md).

use std::io::Read as _;

use clap::Parser;
use tokio::io::AsyncWriteExt as _;

/// The language server for `.flow` files: diagnostics, completion, hover,
/// navigation, quick fixes, highlighting and formatting, over the Language
/// Server Protocol on standard input and output. An editor starts it; see
/// editors/nvim/flow.lua and editors/vscode.
#[derive(Parser)]
#[command(name = "flow-lsp", version)]
struct Args {
    /// Speak the protocol on standard input and output, which is what the
    /// server always does; accepted because many editors pass it.
    #[arg(long)]
    stdio: bool,
}

fn main() -> std::process::ExitCode {
    // Before the protocol starts: `--help` and `--version` answer and exit,
    // and an unknown argument is refused, rather than the server waiting
    // on a terminal for messages that will never come.
    let _ = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // The blocking pool runs the checks (one debounced check at a time,
        // and the requests' in order) and the writes to stdout. Each extra
        // thread would keep a malloc arena of freed check memory, which took
        // the server from 34 MB to 70 MB over a thousand requests.
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let input = stdin(runtime.handle());
    runtime.block_on(flow_lsp::serve(input, tokio::io::stdout()))
}

/// Standard input, read on a thread of its own. tokio's `stdin()` reads on
/// the blocking pool, where a read waiting for the next message holds a
/// thread: with a check on the other one, a request waited for the check to
/// end before it could run.
fn stdin(runtime: &tokio::runtime::Handle) -> tokio::io::DuplexStream {
    let (input, mut feed) = tokio::io::duplex(64 * 1024);
    let runtime = runtime.clone();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0; 64 * 1024];
        // The end of input, a read error or a server gone ends the feed, and
        // the server sees the end of its input.
        loop {
            let read = match stdin.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if runtime.block_on(feed.write_all(&buffer[..read])).is_err() {
                break;
            }
        }
    });
    input
}
