//! `flow-lsp`: the language server for `.flow` files.
//!
//! A thin adapter: every answer comes from `flow_compiler` (the same `check`
//! as `flowc check`, and the queries of `flow_compiler::ide`); this crate
//! converts positions and types, keeps the open documents, and decides when
//! to check. It is the only crate that knows LSP types.

mod capabilities;
pub mod convert;
pub mod documents;
mod framing;
mod kinds;
pub mod server;
mod workspace;

use tower_lsp_server::{LspService, Server};

/// Serves the protocol on `input` and `output` until the client exits.
/// Malformed messages are answered with an error and skipped
/// (`framing.rs`). Returns the status the process should exit with.
pub async fn serve<I, O>(input: I, output: O) -> std::process::ExitCode
where
    I: tokio::io::AsyncRead + Unpin,
    O: tokio::io::AsyncWrite + Unpin,
{
    let (service, socket) = LspService::new(server::Backend::new);
    framing::screened(input, output, |input, output| {
        // One message at a time, in the order sent: an edit must be applied
        // before the completion request that follows it. The handlers are
        // quick (checks run on the blocking pool, diagnostics in their own
        // tasks).
        Server::new(input, output, socket)
            .concurrency_level(1)
            .serve(service)
    })
    .await
}
