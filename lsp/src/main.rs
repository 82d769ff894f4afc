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
        // The blocking pool runs the checks and tokio's stdin and stdout:
        // a read of stdin waits there for the next message, holding a thread.
        // With two threads, a debounced check of a large file took the other
        // and a completion request waited for it to end (its answer too, as
        // writes to stdout go through the pool). Three leave one thread for
        // the requests and the writes while a check runs (the server runs one
        // debounced check at a time). Each extra thread would keep a malloc
        // arena of freed check memory, which took the server from 34 MB to
        // 70 MB over a thousand requests without a cap.
        .max_blocking_threads(3)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    runtime.block_on(flow_lsp::serve(tokio::io::stdin(), tokio::io::stdout()));
}
