//! `flowc lock`: asks every MCP server that the given files declare for its
//! tools, and writes their names and input schemas to `flow.lock` beside the
//! files (one lock per folder), so that `flowc check` can check browser steps
//! offline. The servers are reached through the runtime's MCP pool, exactly
//! as a run would reach them; nothing of a failed folder is written.
//!
//! Locking runs programs: a stdio server is its `command`, started with its
//! `args` and `env`, and the files that declare it may be imports the user
//! has not read. So every command is printed (program, arguments and the
//! names of its environment variables, whose values may be secrets) before
//! it starts, and `--dry-run` lists them without starting anything.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flow_compiler::lock::{LOCK_FILE, LOCK_VERSION, LockedServer, LockedTool, ToolLock};
use flow_mcp::{McpPool, McpPoolConfig};
use flow_plan::{McpServer, McpTransport};

use crate::Exit;
use crate::loader::{expand_paths, io_reason, print_load_error, write_atomically};

pub(crate) fn run(
    paths: &[PathBuf],
    root: Option<&Path>,
    timeout: Duration,
    dry_run: bool,
) -> Exit {
    let (files, problems, without_sources) = expand_paths(paths, root);
    crate::loader::warn_of_no_sources(&without_sources);
    for problem in &problems {
        eprintln!("error: {problem}");
    }
    if !problems.is_empty() {
        return Exit::Usage;
    }
    // The servers each folder's files declare (or import), once each.
    let mut folders: BTreeMap<PathBuf, Vec<McpServer>> = BTreeMap::new();
    for file in &files {
        let checked = match flow_compiler::check(&file.path, &file.loader()) {
            Ok(checked) => checked,
            Err(error) => {
                print_load_error(&error);
                return Exit::Usage;
            }
        };
        let servers = folders.entry(folder_of(&file.path)).or_default();
        let mut names: Vec<&String> = checked.analysis.env.mcp_servers.keys().collect();
        names.sort();
        for name in names {
            let server = McpServer {
                name: name.clone(),
                transport: checked.analysis.env.mcp_servers[name].transport.clone(),
            };
            if !servers.contains(&server) {
                servers.push(server);
            }
        }
    }
    if dry_run {
        return list(&folders);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return Exit::Usage;
        }
    };
    runtime.block_on(lock_folders(folders, timeout))
}

/// `--dry-run`: what locking would start or reach, one line per server and
/// lock on stdout (for a reviewer or a script), nothing started or written.
fn list(folders: &BTreeMap<PathBuf, Vec<McpServer>>) -> Exit {
    let mut count = 0;
    for (folder, servers) in folders {
        let path = folder.join(LOCK_FILE);
        for server in servers {
            outln!("{}: would {}", path.display(), describe(server));
            count += 1;
        }
    }
    eprintln!(
        "flowc: dry run: {count} MCP server(s) for {} lock(s); nothing started, nothing written",
        // A folder whose files declare no server gets no lock.
        folders
            .values()
            .filter(|servers| !servers.is_empty())
            .count()
    );
    Exit::Ok
}

/// What asking `server` does, for a person (`mcp::describe_transport`:
/// environment variables by name, a URL without its secrets).
pub(crate) fn describe(server: &McpServer) -> String {
    let how = flow_mcp::describe_transport(&server.transport);
    match &server.transport {
        McpTransport::Stdio { .. } => format!("start MCP server `{}`: {how}", server.name),
        McpTransport::Http { .. } => format!("reach MCP server `{}` at {how}", server.name),
    }
}

async fn lock_folders(folders: BTreeMap<PathBuf, Vec<McpServer>>, timeout: Duration) -> Exit {
    let pool = Arc::new(McpPool::new(McpPoolConfig {
        connect_timeout: timeout,
        ..McpPoolConfig::default()
    }));
    let mut exit = Exit::Ok;
    let mut announced: HashSet<McpTransport> = HashSet::new();
    for (folder, servers) in folders {
        // The servers of a folder start at once: a lock waits for the
        // slowest, not for their sum.
        let mut asked = tokio::task::JoinSet::new();
        for (index, server) in servers.into_iter().enumerate() {
            // Said once per server: the pool keeps it for the next folder.
            if announced.insert(server.transport.clone()) {
                eprintln!("flowc: {}", describe(&server));
            }
            let pool = Arc::clone(&pool);
            asked.spawn(async move {
                let tools = pool.tools(&server, timeout).await;
                (index, server, tools)
            });
        }
        let mut answers = Vec::new();
        while let Some(joined) = asked.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        answers.sort_by_key(|(index, _, _)| *index);
        let mut locked = Vec::new();
        let mut failed = false;
        for (_, server, tools) in answers {
            match tools {
                Ok(tools) => {
                    eprintln!("flowc: `{}` has {} tool(s)", server.name, tools.len());
                    locked.push(LockedServer {
                        name: server.name,
                        transport: server.transport,
                        tools: tools
                            .into_iter()
                            .map(|tool| LockedTool {
                                name: tool.name,
                                description: tool.description,
                                input_schema: tool.input_schema,
                            })
                            .collect(),
                    });
                }
                Err(error) => {
                    eprintln!("error: {error}");
                    failed = true;
                }
            }
        }
        let path = folder.join(LOCK_FILE);
        if failed {
            eprintln!("error: {} not written", path.display());
            exit = Exit::Usage;
            continue;
        }
        let lock = ToolLock {
            version: LOCK_VERSION,
            servers: locked,
        };
        match write_atomically(&path, lock.to_json().as_bytes()) {
            Ok(()) => eprintln!(
                "flowc: wrote {} ({} server(s))",
                path.display(),
                lock.servers.len()
            ),
            Err(error) => {
                eprintln!(
                    "error: cannot write {}: {}",
                    path.display(),
                    io_reason(&error)
                );
                exit = Exit::Usage;
            }
        }
    }
    pool.shutdown().await;
    exit
}

/// The folder a file's lock is in: its own.
fn folder_of(file: &str) -> PathBuf {
    match Path::new(file).parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_described_with_env_names_but_not_values() {
        let server = McpServer {
            name: "x".to_string(),
            transport: McpTransport::Stdio {
                command: "node".to_string(),
                args: vec![
                    "server.js".to_string(),
                    "a b".to_string(),
                    "it's".to_string(),
                ],
                env: vec![("TOKEN".to_string(), "s3cret".to_string())],
            },
        };
        let text = describe(&server);
        assert_eq!(
            text,
            "start MCP server `x`: node server.js 'a b' 'it'\\''s' (environment: TOKEN)"
        );
        assert!(!text.contains("s3cret"));
    }

    #[test]
    fn a_url_is_described_without_its_password() {
        let server = McpServer {
            name: "web".to_string(),
            transport: McpTransport::Http {
                url: "https://me:token@example.com/mcp?x=1".to_string(),
            },
        };
        assert_eq!(
            describe(&server),
            "reach MCP server `web` at https://***@example.com/mcp?x=***"
        );
        let plain = McpServer {
            name: "web".to_string(),
            transport: McpTransport::Http {
                url: "http://127.0.0.1:8931/mcp".to_string(),
            },
        };
        assert_eq!(
            describe(&plain),
            "reach MCP server `web` at http://127.0.0.1:8931/mcp"
        );
    }
}
