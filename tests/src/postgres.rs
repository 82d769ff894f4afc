//! A PostgreSQL schema of its own for one test, dropped when the test ends.
//!
//! The tests use the server that the project's machines and CI run on
//! 127.0.0.1:5432 (trust authentication, database `test`), or the one that
//! `FLOW_TEST_POSTGRES_URL` names. Each test's store lives in a schema named
//! after the process and a count (`flow_test_<pid>_<n>`), which the store
//! creates and the guard drops, also when the test panics.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The database the tests use, without a schema.
pub fn server_url() -> String {
    std::env::var("FLOW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A schema unique to this test; dropped with everything in it on drop.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
}

impl TestSchema {
    pub fn new() -> TestSchema {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
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
        // Drop may run inside a test's runtime, which cannot be blocked on:
        // the schema is dropped from a thread with a runtime of its own.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, connection) =
                    tokio_postgres::connect(&server_url(), tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(error)) = dropped {
            eprintln!("cannot drop the test schema {}: {error}", self.name);
        }
    }
}
