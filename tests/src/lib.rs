//! The end-to-end test harness: locating the workspace's binaries, running
//! them, and temporary directories. The tests themselves are in `tests/`.

pub mod bench;
pub mod fake_llm;
pub mod mcp_servers;
pub mod postgres;
pub mod services;
pub mod smtp_sink;
pub mod tls_proxy;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The `flowc` binary, rebuilt when the compiler's sources change.
pub fn flowc_path() -> PathBuf {
    binary(
        "flowc",
        "flowc",
        &[
            "compiler/flowc/src",
            "compiler/core/src",
            "compiler/loader/src",
            "compiler/plan/src",
        ],
    )
}

/// The `flow` binary, rebuilt when the runtime's or compiler's sources change.
pub fn flow_path() -> PathBuf {
    binary(
        "flow",
        "flow-cli",
        &[
            "runtime/cli/src",
            "runtime/src",
            "compiler/core/src",
            "compiler/loader/src",
            "compiler/plan/src",
        ],
    )
}

/// The `flowd` binary, rebuilt when the daemon's or runtime's sources change.
pub fn flowd_path() -> PathBuf {
    binary(
        "flowd",
        "flow-daemon",
        &[
            "runtime/daemon/src",
            "runtime/src",
            "compiler/core/src",
            "compiler/loader/src",
            "compiler/plan/src",
        ],
    )
}

/// The binary `name` that `cargo test --workspace` built (its package's own
/// smoke test makes Cargo build it) in `target/<profile>/`, beside this test's
/// `deps/` folder.
///
/// A bin-only package cannot be a dependency, so `cargo test -p flow-tests`
/// alone does not rebuild it: a binary missing or older than `sources` (paths
/// from the repository root) fails here with the command to run, rather than
/// testing stale code.
pub fn binary(name: &str, package: &str, sources: &[&str]) -> PathBuf {
    static CHECKED: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut checked = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = checked.get_or_insert_with(HashMap::new).get(name) {
        return path.clone();
    }
    let exe = std::env::current_exe().expect("the test knows its own path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let built = std::fs::metadata(&path)
        .and_then(|meta| meta.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build -p {package}` (or `cargo test --workspace`)",
                path.display()
            )
        });
    if let Some(newer) = sources
        .iter()
        .filter_map(|dir| newest_file(&root().join(dir)))
        .find(|(modified, _)| *modified > built)
    {
        panic!(
            "{} is older than {}: run `cargo build -p {package}` (or `cargo test --workspace`)",
            path.display(),
            newer.1.display()
        );
    }
    checked
        .get_or_insert_with(HashMap::new)
        .insert(name.to_string(), path.clone());
    path
}

/// The most recently modified file below `dir`, with its time.
pub fn newest_file(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let candidate = if path.is_dir() {
            newest_file(&path)
        } else {
            entry
                .metadata()
                .and_then(|meta| meta.modified())
                .ok()
                .map(|time| (time, path))
        };
        if let Some(candidate) = candidate
            && newest.as_ref().is_none_or(|(time, _)| candidate.0 > *time)
        {
            newest = Some(candidate);
        }
    }
    newest
}

/// The repository root, where `examples/` lives.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// Sends signal `name` (`STOP`, `CONT`, `TERM`, `KILL`...) to process
/// `pid`, as `kill -NAME PID` does, and asserts that it was sent.
pub fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid}");
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Both streams, for assertions that do not care where a line went.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `binary` with `args` in `dir` with its stdout closed before it
/// writes, as `| head` leaves it: what a command does with a reader gone.
pub fn run_with_stdout_closed(binary: &Path, dir: &Path, args: &[&str]) -> Run {
    // The read end is closed before the child starts. Closed after the
    // spawn, it raced the child: a small output written into the pipe
    // before the close went through (regression: `explain E103` exited 0
    // on a loaded machine).
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = Command::new(binary)
        .args(args)
        .current_dir(dir)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the binary ends");
    Run {
        code: output
            .status
            .code()
            .expect("the binary exits normally, not by a signal"),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub fn run_in(binary: &Path, dir: &Path, args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(binary)
        .args(args)
        .current_dir(dir)
        // Keep the rendering independent of the developer's terminal setup.
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary starts");
    Run {
        code: status
            .code()
            .expect("the binary exits normally, not by a signal"),
        stdout: String::from_utf8(stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(stderr).expect("stderr is UTF-8"),
    }
}

/// Runs `binary` in `dir` like [`run_in`], with `env` added, and fails the
/// test if it has not ended within `limit` (killing it): for what could hang
/// or grow without end (an import of `/dev/stdin` or `/dev/zero`), so that a
/// regression fails rather than hangs. Its stdin is a pipe held open that
/// never delivers, as a CI runner's may be, so reading it would block. Output
/// that is not UTF-8 is kept, lossily, so that an assertion about what must
/// not be printed sees everything.
pub fn run_bounded(
    binary: &Path,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Run {
    let mut child = Command::new(binary)
        .args(args)
        .current_dir(dir)
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stdin = child.stdin.take();
    let collect = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut bytes);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = collect(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = collect(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            drop(stdin);
            panic!(
                "{} {args:?} did not end within {limit:?}; stderr so far:\n{}",
                binary.display(),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    drop(stdin);
    Run {
        code: status
            .code()
            .expect("the binary exits normally, not by a signal"),
        stdout: stdout.join().expect("stdout is read"),
        stderr: stderr.join().expect("stderr is read"),
    }
}

/// A temporary directory removed on drop; unique per process and test.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "flow-test-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("the temporary directory can be created");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("the parent directory can be created");
        }
        std::fs::write(&path, contents).expect("the file can be written");
        path
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).expect("the file can be read")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
