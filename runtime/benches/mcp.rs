//! The MCP pool's overhead: a tool call through the pool against
//! the same call made directly on the pool's own rmcp connection, to
//! server-everything's `echo` over stdio. The difference is what the pool
//! adds (finding the slot, the call's turn, converting the result).
//! Direct and pooled calls alternate in blocks, so that drift in the server
//! (its JIT warming up, the machine's load) falls on both alike.
//!
//! `cargo bench -p flow-runtime --bench mcp [-- --quick]`, after
//! `bash tests/setup.sh`.

use std::path::Path;
use std::time::{Duration, Instant};

use flow_plan::{McpServer, McpTransport};
use flow_runtime::mcp::{McpPool, McpPoolConfig, PoolClient};
use flow_runtime::services::McpClient as _;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/server-everything")
            .is_dir(),
        "the MCP servers are not installed: run `bash tests/setup.sh`"
    );
    let server = McpServer {
        name: "everything".to_string(),
        transport: McpTransport::Stdio {
            command: "node".to_string(),
            args: vec![
                dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
                    .to_string_lossy()
                    .into_owned(),
                "stdio".to_string(),
            ],
            env: Vec::new(),
        },
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let pool = PoolClient(std::sync::Arc::new(McpPool::new(McpPoolConfig::default())));
        let peer = pool.0.peer(&server).await.expect("the server starts");
        let args = json!({ "message": "benchmark" });
        let params = CallToolRequestParams::new("echo")
            .with_arguments(args.as_object().expect("a record").clone());

        let (blocks, per_block, warm_up) = if quick {
            (4, 50, 100)
        } else {
            (40, 250, 2_000)
        };
        for _ in 0..warm_up {
            peer.call_tool(params.clone()).await.expect("echo");
            pool.call_tool(&server, "echo", &args, "echo", None)
                .await
                .expect("echo");
        }
        let mut direct = Vec::with_capacity(blocks * per_block);
        let mut pooled = Vec::with_capacity(blocks * per_block);
        for _ in 0..blocks {
            for _ in 0..per_block {
                let started = Instant::now();
                peer.call_tool(params.clone()).await.expect("echo");
                direct.push(started.elapsed());
            }
            for _ in 0..per_block {
                let started = Instant::now();
                pool.call_tool(&server, "echo", &args, "echo", None)
                    .await
                    .expect("echo");
                pooled.push(started.elapsed());
            }
        }
        direct.sort();
        pooled.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let at = |sorted: &[Duration], q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
        println!(
            "echo over stdio, {} calls each (after {warm_up} warm-up calls each):",
            direct.len()
        );
        println!("| path | p50 | p99 |");
        println!("|---|---|---|");
        for (name, sorted) in [
            ("direct (rmcp peer)", &direct),
            ("pooled (McpPool)", &pooled),
        ] {
            println!(
                "| {name} | {:.3} ms | {:.3} ms |",
                ms(at(sorted, 0.5)),
                ms(at(sorted, 0.99))
            );
        }
        println!(
            "| added by the pool | {:+.3} ms | {:+.3} ms |",
            ms(at(&pooled, 0.5)) - ms(at(&direct, 0.5)),
            ms(at(&pooled, 0.99)) - ms(at(&direct, 0.99))
        );
        pool.0.shutdown().await;
    });
}
