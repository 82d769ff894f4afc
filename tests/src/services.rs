//! What a test needs beyond a Rust toolchain, and whether this machine has it.
//!
//! `cargo test --workspace` must pass on a machine with only a Rust toolchain
//! (a contributor's laptop), so a test that needs PostgreSQL, Redis, Node.js
//! packages, Chromium or Neovim starts with [`require!`]: where the service is
//! missing, the test returns early and the process prints one line per
//! service saying what was skipped and why. `FLOW_TEST_SERVICES=1` (which
//! `.ci/run` sets) turns a missing service into a failure, so that CI never
//! passes by not running a test.
//!
//! Nothing here installs anything: `bash tests/setup.sh` installs what the
//! project can install itself (Debian's Chromium, the npm packages, Neovim);
//! the services are the machine's.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::root;

/// The environment variable that makes every service mandatory.
pub const MANDATORY: &str = "FLOW_TEST_SERVICES";

/// The Redis the tests use: the machine's, on its standard port, unless
/// `FLOW_TEST_REDIS_URL` names another.
pub fn redis_url() -> String {
    std::env::var("FLOW_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// One thing a test may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// The PostgreSQL server of [`crate::postgres::server_url`].
    Postgres,
    /// The Redis server of [`redis_url`].
    Redis,
    /// The `redis-server` program, for tests that start and kill their own.
    RedisServer,
    /// Node.js and the pinned MCP servers of `runtime/tests/mcp`.
    McpServers,
    /// Debian's Chromium, for what drives a browser.
    Chromium,
    /// Node.js and the pinned `playwright-core` of
    /// `runtime/daemon/tests/browser`, for the inspector's test.
    Playwright,
    /// Neovim in `lsp/tests/nvim/.venv`, for the editor's test.
    Neovim,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Postgres => "PostgreSQL",
            Service::Redis => "Redis",
            Service::RedisServer => "redis-server",
            Service::McpServers => "the MCP servers",
            Service::Chromium => "Chromium",
            Service::Playwright => "playwright-core",
            Service::Neovim => "Neovim",
        }
    }

    /// Why the service cannot be used here, or `None` when it can.
    fn missing(self) -> Option<String> {
        const SETUP: &str = "run `bash tests/setup.sh`";
        match self {
            Service::Postgres => {
                let url = crate::postgres::server_url();
                unreachable(host_and_port(&url, 5432))
            }
            Service::Redis => unreachable(host_and_port(&redis_url(), 6379)),
            Service::RedisServer => {
                (!on_path("redis-server")).then(|| "`redis-server` is not on PATH".to_string())
            }
            Service::McpServers => {
                node_project("runtime/tests/mcp").map(|why| format!("{why}; {SETUP}"))
            }
            Service::Chromium => {
                (!on_path("chromium")).then(|| format!("`chromium` is not on PATH; {SETUP}"))
            }
            Service::Playwright => {
                node_project("runtime/daemon/tests/browser").map(|why| format!("{why}; {SETUP}"))
            }
            Service::Neovim => {
                let nvim = root().join("lsp/tests/nvim/.venv/bin/nvim");
                (!nvim.is_file()).then(|| format!("{} is not installed; {SETUP}", nvim.display()))
            }
        }
    }
}

/// Whether every one of `services` is here. For each that is not: under
/// `FLOW_TEST_SERVICES=1` the test fails; otherwise the process says once, in
/// one line on standard error, that the tests needing it are skipped and
/// why, and this answers `false`.
pub fn ready(services: &[Service], test: &str) -> bool {
    // What each service's first test found: asking again for every test (a
    // connection each, seconds against a host that drops packets) would
    // learn nothing new within one test process.
    static FOUND: Mutex<Option<HashMap<Service, Option<String>>>> = Mutex::new(None);
    let mut all_here = true;
    for &service in services {
        let mut found = FOUND
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let found = found.get_or_insert_with(HashMap::new);
        let first = !found.contains_key(&service);
        let Some(why) = found.entry(service).or_insert_with(|| service.missing()) else {
            continue;
        };
        if std::env::var(MANDATORY).is_ok_and(|value| value == "1") {
            panic!(
                "{test} needs {}: {why} ({MANDATORY}=1 makes it mandatory)",
                service.name()
            );
        }
        all_here = false;
        if first {
            // Straight to the stream: the test harness captures `eprintln!`
            // of passing tests, and this line is for the person running them.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the tests of {} that need {}: {why}",
                test.split("::").next().unwrap_or(test),
                service.name()
            );
        }
    }
    all_here
}

/// Returns from the calling test when one of the named [`Service`]s is
/// missing (see [`ready`]): `flow_tests::require!(Postgres, Redis);`.
#[macro_export]
macro_rules! require {
    ($($service:ident),+ $(,)?) => {
        if !$crate::services::ready(
            &[$($crate::services::Service::$service),+],
            module_path!(),
        ) {
            return;
        }
    };
}

/// `host:port` of a `scheme://[user@]host[:port][/...]` URL.
fn host_and_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        host.to_string()
    } else {
        format!("{host}:{default_port}")
    }
}

/// Why nothing answers on `address`, or `None` when something does.
fn unreachable(address: String) -> Option<String> {
    let resolved: Vec<SocketAddr> = match address.to_socket_addrs() {
        Ok(resolved) => resolved.collect(),
        Err(error) => return Some(format!("cannot resolve {address}: {error}")),
    };
    let mut last = format!("{address} resolves to no address");
    for candidate in resolved {
        match TcpStream::connect_timeout(&candidate, Duration::from_secs(2)) {
            Ok(_) => return None,
            Err(error) => last = format!("nothing answers on {address} ({error})"),
        }
    }
    Some(last)
}

fn on_path(name: &str) -> bool {
    program(name).is_some()
}

/// Where `name` is on PATH, if it is.
pub fn program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Debian's Chromium, for a test that has said `require!(Chromium)`.
pub fn chromium() -> String {
    program("chromium")
        .expect("chromium is on PATH (`bash tests/setup.sh`)")
        .to_string_lossy()
        .into_owned()
}

/// Why the npm project at `dir` (from the repository root) cannot run, or
/// `None`: Node.js is on PATH and `npm ci` ran since its lock last changed
/// (npm writes `node_modules/.package-lock.json` on every install).
fn node_project(dir: &str) -> Option<String> {
    if !on_path("node") {
        return Some("`node` is not on PATH (Node.js 20 or newer is needed)".to_string());
    }
    let dir = root().join(dir);
    let modified = |path: &Path| {
        std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .ok()
    };
    let installed = modified(&dir.join("node_modules/.package-lock.json"));
    match (installed, modified(&dir.join("package-lock.json"))) {
        (Some(installed), Some(lock)) if installed >= lock => None,
        (Some(_), _) => Some(format!(
            "{} changed since its packages were installed",
            dir.join("package-lock.json").display()
        )),
        (None, _) => Some(format!(
            "the packages of {} are not installed",
            dir.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::host_and_port;

    #[test]
    fn host_and_port_reads_the_authority_of_a_url() {
        for (url, expected) in [
            ("postgres://postgres@127.0.0.1:5432/test", "127.0.0.1:5432"),
            ("postgres://u:p@db/test?sslmode=disable", "db:5432"),
            ("redis://127.0.0.1:6380", "127.0.0.1:6380"),
            ("redis://localhost", "localhost:5432"),
        ] {
            assert_eq!(host_and_port(url, 5432), expected, "{url}");
        }
    }
}
