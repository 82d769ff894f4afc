//! The `flow-lsp` binary: the language server over standard input and output.
//!
//! Unlike `flowc` and `flow`, it keeps the system allocator: mimalloc's speed
//! on large inputs matters little for one document at a time, and its arenas
//! kept 50 MB resident after opening the examples and a 5,000-line file,
//! against 14 MB with glibc's malloc, at the same latency within the noise
//! (`cargo bench -p flow-lsp --bench lsp`, docs/benchmarks.md).

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // The checks run on the blocking pool, one at a time in practice
        // (messages are handled in order): two threads suffice, and each
        // extra thread would keep a malloc arena of freed check memory, which
        // took the server from 34 MB to 70 MB over a thousand requests.
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    runtime.block_on(flow_lsp::serve(tokio::io::stdin(), tokio::io::stdout()));
}
