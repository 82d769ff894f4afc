//! A PostgreSQL schema of its own for one test, dropped when the test ends.
//!
//! The tests use the server that the project's machines and CI run on
//! 127.0.0.1:5432 (trust authentication, database `test`), or the one that
//! `FLOW_TEST_POSTGRES_URL` names. Each test's store lives in a schema named
//! after the process and a count (`flow_test_<pid>_<n>`), which the store
//! creates and the guard drops, also when the test panics. A test process
//! killed outright drops nothing: the first schema a later process makes
//! drops those of processes that are gone.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The client, for a test that reads a store's rows itself.
pub use tokio_postgres;

/// The database the tests use, without a schema.
pub fn server_url() -> String {
    std::env::var("FLOW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A client of the test server, its connection driven on the caller's
/// runtime: for a test or a bench that reads or changes rows itself.
pub async fn client() -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) =
        tokio_postgres::connect(&server_url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A schema unique to this test; dropped with everything in it on drop.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
}

impl TestSchema {
    pub fn new() -> TestSchema {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let swept = on_own_runtime(|client| async move {
                let schemas = client
                    .query(
                        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'flow\\_test\\_%'",
                        &[],
                    )
                    .await?;
                for row in schemas {
                    let name: String = row.get(0);
                    if owner_is_gone(&name) {
                        client
                            .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                            .await?;
                    }
                }
                Ok(())
            });
            if let Err(error) = swept {
                eprintln!("cannot drop the schemas of earlier test processes: {error}");
            }
        });
        TestSchema {
            name: format!(
                "flow_test_{}_{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store URL of this schema (the store's `schema=` parameter).
    pub fn url(&self) -> String {
        let server = server_url();
        let separator = if server.contains('?') { '&' } else { '?' };
        format!("{server}{separator}schema={}", self.name)
    }
}

impl Default for TestSchema {
    fn default() -> TestSchema {
        TestSchema::new()
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        let dropped = on_own_runtime(|client| async move {
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .await
        });
        if let Err(error) = dropped {
            eprintln!("cannot drop the test schema {}: {error}", self.name);
        }
    }
}

/// Whether test schema `name` (`flow_test_<pid>_<n>`) belongs to a process
/// that no longer runs on this machine.
fn owner_is_gone(name: &str) -> bool {
    let pid = name
        .strip_prefix("flow_test_")
        .and_then(|rest| rest.split('_').next())
        .and_then(|pid| pid.parse::<u32>().ok());
    pid.is_some_and(|pid| {
        pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
}

/// Runs `work` on a connection to the test server, from a thread with a
/// runtime of its own: the callers (a drop, a first use) may be inside a
/// test's runtime, which cannot be blocked on.
fn on_own_runtime<F, Fut>(work: F) -> Result<(), String>
where
    F: FnOnce(tokio_postgres::Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), tokio_postgres::Error>>,
{
    let joined = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let client = client().await.map_err(|e| e.to_string())?;
            work(client).await.map_err(|e| e.to_string())
        })
    })
    .join();
    joined.unwrap_or_else(|_| Err("the thread panicked".to_string()))
}
