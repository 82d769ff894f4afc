//! The `flow-lsp` binary: the language server over standard input and output.

/// The allocator of the other binaries, for the same reason (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    runtime.block_on(flow_lsp::serve(tokio::io::stdin(), tokio::io::stdout()));
}
