//! Deploys compile in a process of their own, `flowd compile-worker`,
//! which flowd starts from its own executable for each source it is sent.
//!
//! A source is a tenant's. The compiler's known costs are bounded (E212,
//! the checker's budgets, `[limits] plan_bytes`), but a cost nobody has
//! found yet, a panic that aborts or a stack overflow would otherwise be
//! paid by the process that drives every account's runs. The worker is
//! held to `[limits] compile_seconds` of CPU (`RLIMIT_CPU`, and killed at
//! twice that of wall-clock time, plus a second) and to `compile_memory`
//! bytes of heap and other writable memory (`RLIMIT_DATA`), writes no
//! file and dumps no core, and is killed when the deploy's request goes
//! away. It starts with an empty environment (flowd's holds secrets) and
//! inherits no descriptor but its three pipes.
//!
//! The protocol: the worker reads a [`Request`] as JSON from its standard
//! input to its end, and writes to its standard output `plan\n` and the
//! plan's JSON, or `problem\n` and the body of the 422 that says why there
//! is none. It exits 0 with either; anything else (a signal, an exit code,
//! output that is neither) is the compiler failing, not the source. Its
//! plan is read back with `Plan::from_json` (the hash checked); the worker
//! validated it against flowd's bounds before writing it.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use axum::http::StatusCode;
use flow_plan::Plan;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::server::Problem;
use crate::sources::DeployedFiles;

/// The command line's word for the worker (`flowd compile-worker`); not
/// in `flowd --help`, as no person runs it.
pub const COMMAND: &str = "compile-worker";

/// What a worker is held to (`[limits]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CompileLimits {
    /// CPU seconds (`compile_seconds`).
    pub(crate) cpu_seconds: u64,
    /// Bytes of writable memory (`compile_memory`).
    pub(crate) memory_bytes: u64,
    /// The plan's JSON at most (`plan_bytes`).
    pub(crate) plan_bytes: u64,
}

/// What the worker compiles: `root` of `files`, held to `plan_bytes`.
#[derive(Serialize, Deserialize)]
struct Request {
    root: String,
    files: DeployedFiles,
    plan_bytes: u64,
}

/// The most of a worker's standard error flowd keeps for its log: a panic's
/// message and where it was.
const KEPT_STDERR: usize = 16 * 1024;

/// `root` of `files` compiled and validated in a worker, or the problem
/// that says why there is no plan: the source's (422), the limits' (422
/// `compile_limit`), or the compiler's (500 `compiler_failed`, with what
/// it said in flowd's log). With the plan, the size of its JSON, which the
/// worker wrote. `place` (a deploy's place among those compiling at once)
/// is held until the worker's plan is read, which goes on after a client
/// hangs up.
pub(crate) async fn compile_in_worker(
    root: String,
    files: DeployedFiles,
    limits: CompileLimits,
    place: tokio::sync::OwnedSemaphorePermit,
) -> Result<(Plan, u64), Problem> {
    let request = serde_json::to_vec(&Request {
        root: root.clone(),
        files,
        plan_bytes: limits.plan_bytes,
    })
    .map_err(|error| compiler_failed(&root, &format!("the request did not encode: {error}")))?;
    let mut command = tokio::process::Command::new(own_executable());
    command
        .arg(COMMAND)
        .arg(limits.cpu_seconds.to_string())
        .arg(limits.memory_bytes.to_string())
        .env_clear()
        // mimalloc commits each arena it reserves (a gigabyte) where the
        // kernel overcommits, and RLIMIT_DATA counts what is committed:
        // the worker would fail at a gigabyte reserved, not at the bytes
        // it uses. Committed as used, the limit is what the compile takes.
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0");
    // The one variable flowd's own executable may need to start.
    if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
        command.env("LD_LIBRARY_PATH", path);
    }
    let mut worker = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| {
            compiler_failed(
                &root,
                &format!("the compiler's process did not start: {error}"),
            )
        })?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (
        worker.stdin.take(),
        worker.stdout.take(),
        worker.stderr.take(),
    ) else {
        return Err(compiler_failed(&root, "the compiler's pipes were not made"));
    };
    // A plan of `plan_bytes` and its tag; a problem is far smaller.
    let most_output = usize::try_from(limits.plan_bytes.max(4 << 20))
        .unwrap_or(usize::MAX)
        .saturating_add(64);
    let finished = async {
        let write = async {
            // A worker that stops early closes its input: what it said, or
            // how it ended, tells why, not the broken pipe.
            let _ = stdin.write_all(&request).await;
            drop(stdin);
        };
        let ((), output, said) = tokio::join!(
            write,
            read_bounded(stdout, most_output),
            read_bounded(stderr, KEPT_STDERR)
        );
        (worker.wait().await, output, said)
    };
    let wall = Duration::from_secs(limits.cpu_seconds.saturating_mul(2).saturating_add(1));
    // Past the wall-clock time, `worker` is dropped on return, which kills it.
    let (status, (output, output_cut), (said, _)) =
        tokio::time::timeout(wall, finished).await.map_err(|_| {
            // A source past its CPU seconds ends by SIGXCPU before this;
            // a worker still running here was short of CPU (a loaded
            // machine) or stopped, which the operator should know of.
            tracing::warn!(
                root = %root,
                "a compile worker ran past {} s of wall-clock time and was killed",
                wall.as_secs()
            );
            limit_problem(
                &root,
                &format!(
                    "compiling took more than {} s ([limits] compile_seconds is {} s of CPU)",
                    wall.as_secs(),
                    limits.cpu_seconds
                ),
            )
        })?;
    let said = said.joined();
    let said = String::from_utf8_lossy(&said);
    let status = status.map_err(|error| {
        compiler_failed(&root, &format!("waiting for the compiler failed: {error}"))
    })?;
    if !status.success() {
        return Err(ended_badly(&root, status, &said, limits));
    }
    if output_cut {
        return Err(compiler_failed(
            &root,
            &format!("the compiler wrote more than {most_output} bytes"),
        ));
    }
    // Reading a plan of tens of megabytes takes a core for a while.
    let root_again = root.clone();
    crate::server::joined(tokio::task::spawn_blocking(move || {
        let _place = place;
        answer_of(&root_again, &output.joined())
    }))
    .await
    .inspect_err(|problem| {
        if problem.status() == StatusCode::INTERNAL_SERVER_ERROR && !said.is_empty() {
            tracing::error!(root = %root, "the compile worker said: {said}");
        }
    })
}

/// The worker's answer: its plan (and the size of its JSON) or its problem.
fn answer_of(root: &str, output: &[u8]) -> Result<(Plan, u64), Problem> {
    let text = std::str::from_utf8(output)
        .map_err(|_| compiler_failed(root, "the compiler's answer is not UTF-8"))?;
    match text.split_once('\n') {
        Some(("plan", plan)) => Plan::from_json(plan)
            .map(|read| (read, plan.len() as u64))
            .map_err(|error| {
                compiler_failed(root, &format!("the compiler's plan does not read: {error}"))
            }),
        // The worker answers 422s only: the source's problems.
        Some(("problem", body)) => Err(serde_json::from_str(body)
            .ok()
            .and_then(Problem::from_body)
            .filter(|problem| problem.status() == StatusCode::UNPROCESSABLE_ENTITY)
            .unwrap_or_else(|| compiler_failed(root, "the compiler's problem does not read"))),
        _ => Err(compiler_failed(
            root,
            "the compiler answered neither a plan nor a problem",
        )),
    }
}

/// Why a worker that did not exit 0 stopped: past a limit, or failing.
fn ended_badly(
    root: &str,
    status: std::process::ExitStatus,
    said: &str,
    limits: CompileLimits,
) -> Problem {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        // RLIMIT_CPU's soft limit sends SIGXCPU, which ends the worker. A
        // SIGKILL is someone else's (the kernel short of memory, a
        // person): the compiler's failure, logged below.
        if status.signal() == Some(rustix::process::Signal::XCPU.as_raw()) {
            return limit_problem(
                root,
                &format!(
                    "compiling took more than {} s of CPU ([limits] compile_seconds)",
                    limits.cpu_seconds
                ),
            );
        }
    }
    // Rust's words when an allocation fails, which past RLIMIT_DATA it does.
    if said.contains("memory allocation of") {
        return limit_problem(
            root,
            &format!(
                "compiling took more than {} MiB of memory ([limits] compile_memory)",
                limits.memory_bytes >> 20
            ),
        );
    }
    tracing::error!(root = %root, %status, "the compile worker failed; it said: {said}");
    compiler_failed(root, &format!("the compiler stopped ({status})"))
}

/// 422 `compile_limit`: the source took more than flowd gives a compile.
fn limit_problem(root: &str, why: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "compile_limit",
        &format!("{root}: {why}; a source that takes this much to check is refused"),
    )
}

/// 500 `compiler_failed`: a bug of flow's, not the source's.
fn compiler_failed(root: &str, why: &str) -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "compiler_failed",
        &format!(
            "the compiler failed on {root}: {why}. This is a bug in flow, not in the source; flowd's log has what the compiler said"
        ),
    )
}

/// All a reader gives, keeping the first `most` bytes: the rest is read
/// and dropped, so that a writer past the bound is never blocked on a full
/// pipe. Whether anything was dropped comes second.
///
/// Kept in the pieces it came in, to be joined off the async worker
/// ([`Pieces::joined`]): a plan of tens of megabytes grown in one buffer
/// was copied whole at each doubling, pauses of milliseconds for every run
/// and request the worker drives.
async fn read_bounded(mut reader: impl AsyncRead + Unpin, most: usize) -> (Pieces, bool) {
    const PIECE: usize = 64 * 1024;
    let mut kept = Pieces::default();
    let mut cut = false;
    while kept.len < most {
        let mut piece = Vec::with_capacity(PIECE);
        match reader.read_buf(&mut piece).await {
            Ok(0) | Err(_) => return (kept, cut),
            Ok(read) => {
                let room = most - kept.len;
                piece.truncate(read.min(room));
                cut |= read > room;
                kept.push(piece);
            }
        }
    }
    // The bound reached: the rest drained through one small buffer.
    let past = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
    (kept, cut || past.is_ok_and(|past| past > 0))
}

/// Bytes read in pieces (`read_bounded`).
#[derive(Debug, Default)]
struct Pieces {
    pieces: Vec<Vec<u8>>,
    len: usize,
}

impl Pieces {
    fn push(&mut self, piece: Vec<u8>) {
        if !piece.is_empty() {
            self.len += piece.len();
            self.pieces.push(piece);
        }
    }

    /// The bytes in one buffer: a copy of them all, so off the async
    /// worker when they are many.
    fn joined(self) -> Vec<u8> {
        self.pieces.concat()
    }
}

/// The executable this process runs: where Linux's `/proc` is mounted,
/// the running file itself, even if an upgrade has since replaced or
/// removed it (a deploy is compiled by the compiler of the flowd that will
/// run it); elsewhere, the file at the path flowd started from.
fn own_executable() -> std::path::PathBuf {
    let running = std::path::Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && running.exists() {
        running.into()
    } else {
        std::env::current_exe().unwrap_or_else(|_| "flowd".into())
    }
}

/// `flowd compile-worker CPU_SECONDS MEMORY_BYTES`: the worker's side.
pub fn serve(args: &[String]) -> ExitCode {
    let [cpu_seconds, memory_bytes] = args else {
        eprintln!(
            "usage: flowd {COMMAND} CPU_SECONDS MEMORY_BYTES (flowd runs it; a request on stdin)"
        );
        return ExitCode::from(2);
    };
    let (Ok(cpu_seconds), Ok(memory_bytes)) = (cpu_seconds.parse(), memory_bytes.parse()) else {
        eprintln!("flowd {COMMAND}: CPU_SECONDS and MEMORY_BYTES are whole numbers");
        return ExitCode::from(2);
    };
    if let Err(error) = hold_to(cpu_seconds, memory_bytes) {
        eprintln!("flowd {COMMAND}: cannot set its limits: {error}");
        return ExitCode::from(2);
    }
    let mut input = Vec::new();
    if let Err(error) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("flowd {COMMAND}: cannot read the request: {error}");
        return ExitCode::from(2);
    }
    let request: Request = match serde_json::from_slice(&input) {
        Ok(request) => request,
        Err(error) => {
            eprintln!("flowd {COMMAND}: the request does not read: {error}");
            return ExitCode::from(2);
        }
    };
    drop(input);
    let answer = compile_valid(&request.root, &request.files, request.plan_bytes);
    drop(request);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let written = match answer {
        Ok(plan) => out
            .write_all(b"plan\n")
            .and_then(|()| serde_json::to_writer(&mut out, &plan).map_err(std::io::Error::from)),
        Err(problem) => out.write_all(b"problem\n").and_then(|()| {
            serde_json::to_writer(&mut out, &problem.into_body()).map_err(std::io::Error::from)
        }),
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flowd {COMMAND}: cannot write the answer: {error}");
            ExitCode::from(2)
        }
    }
}

/// The most stack the worker's thread may grow to: RLIMIT_DATA does not
/// count it, and a flowd started with an unlimited stack would pass that
/// on. The compiler's nesting bounds keep it within a thread's 2 MiB.
const MOST_STACK: u64 = 64 << 20;

/// Sets the worker's own limits before it reads what it is sent. Each is
/// lowered only: a limit the operator set lower stays (raising one past
/// its hard limit would fail, and every deploy with it).
fn hold_to(cpu_seconds: u64, memory_bytes: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lower = |resource: Resource, soft: u64, hard: u64| {
        let now = getrlimit(resource);
        let under = |most: u64| now.maximum.map_or(most, |now| now.min(most));
        setrlimit(
            resource,
            Rlimit {
                current: Some(under(soft)),
                maximum: Some(under(hard)),
            },
        )
    };
    // A flowd killed mid-deploy takes its compile with it (one killed
    // before this line leaves it to its CPU seconds).
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    lower(Resource::Core, 0, 0)?;
    lower(Resource::Fsize, 0, 0)?;
    lower(Resource::Data, memory_bytes, memory_bytes)?;
    let stack = getrlimit(Resource::Stack);
    if stack.current.is_none_or(|now| now > MOST_STACK) {
        setrlimit(
            Resource::Stack,
            Rlimit {
                current: Some(MOST_STACK),
                maximum: stack.maximum,
            },
        )?;
    }
    // The soft limit's SIGXCPU ends the worker; the hard one, a second
    // later, is for a worker that would ignore it.
    lower(Resource::Cpu, cpu_seconds, cpu_seconds.saturating_add(1))?;
    Ok(())
}

/// How many of a source's errors a `does_not_check` lists.
const MOST_DIAGNOSTICS: usize = 100;

/// `root` of `files` compiled as `flowc build` would, and held to flowd's
/// bounds, or a 422 saying why not.
fn compile_valid(root: &str, files: &DeployedFiles, most_bytes: u64) -> Result<Plan, Problem> {
    let plan = compile(root, files, most_bytes)?;
    plan.validate_within(most_bytes).map_err(|problems| {
        crate::api::invalid_plan(
            &format!("{root} compiles to a plan flowd refuses"),
            &problems,
        )
    })?;
    Ok(plan)
}

/// `root` checked (through the compiler's one entry point, its imports and
/// `flow.lock` from `files`) and lowered, or a 422 listing its errors.
fn compile(path: &str, files: &DeployedFiles, most_bytes: u64) -> Result<Plan, Problem> {
    let (checked, plan) =
        flow_compiler::check_and_lower_within(path, files, most_bytes).map_err(|error| {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "does_not_check",
                &format!("{}: {}", error.path, error.message),
            )
        })?;
    if checked.has_errors() {
        let count = checked.diagnostics.iter().filter(|d| d.is_error()).count();
        // The first errors: a source of a few megabytes can have a hundred
        // thousand, and a person reads the first.
        let errors: Vec<Value> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .take(MOST_DIAGNOSTICS)
            .map(|d| {
                let file = checked.file(d.primary.file);
                let (line, column) =
                    flow_compiler::diagnostic::line_col(&file.text, d.primary.span.start);
                json!({ "code": d.code.as_str(), "message": d.message, "file": file.path, "line": line, "column": column })
            })
            .collect();
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            &format!("{path} has {count} error(s)"),
        )
        .with("diagnostics", Value::Array(errors))
        .with(
            "diagnostics_omitted",
            Value::from(count.saturating_sub(MOST_DIAGNOSTICS)),
        ));
    }
    plan.ok_or_else(|| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            "the source could not be lowered to a plan",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bounded_read_drains_past_its_bound() {
        let data = vec![7u8; 300_000];
        let (kept, cut) = read_bounded(&data[..], 1000).await;
        assert_eq!((kept.joined().len(), cut), (1000, true));
        let (kept, cut) = read_bounded(&data[..], 300_000).await;
        assert_eq!((kept.joined(), cut), (data, false));
    }

    #[test]
    fn answers_other_than_a_plan_or_a_problem_are_the_compilers_failure() {
        // A problem of any status but 422 is not one the worker writes.
        let created = br#"problem
{"status": 201, "code": "created"}"#;
        for output in [
            &b""[..],
            b"plan\n{",
            b"problem\n[]",
            created,
            b"what\n{}",
            b"\xff\n",
        ] {
            let problem = answer_of("a.flow", output).unwrap_err();
            assert_eq!(problem.code(), "compiler_failed", "{output:?}");
        }
        let body = Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "does_not_check", "x")
            .into_body()
            .to_string();
        let problem = answer_of("a.flow", format!("problem\n{body}").as_bytes()).unwrap_err();
        assert_eq!(
            (problem.status(), problem.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "does_not_check")
        );
    }
}
