//! The per-account LLM limit, against the real Redis on 127.0.0.1:6379 (each
//! test under a key prefix of its own, deleted at the end) and against a
//! Redis of the test's own that it kills: real LLM calls to the fake server
//! on loopback, which records how many it answered at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flow_runtime::limit::{
    LimitEvents, LimitedProvider, Limiter, Limits, LocalLimiter, RedisLimiter, RedisSettings,
    Unobserved,
};
use flow_runtime::llm::ProviderConfig;
use flow_runtime::openai::OpenAiProvider;
use flow_runtime::services::{Provider, RecipeCall};
use flow_tests::fake_llm::FakeLlm;
use flow_tests::services::redis_url;
use serde_json::json;

/// A key prefix no other test (or test run) uses, and its keys deleted when
/// dropped.
struct Prefix(String);

impl Prefix {
    fn new(name: &str) -> Prefix {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Prefix(format!("flow-test-{name}-{}-{nanos}", std::process::id()))
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        let Ok(mut connection) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.0))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut connection);
        }
    }
}

fn limits(limit: usize) -> Limits {
    Limits {
        default: limit,
        accounts: Default::default(),
    }
}

fn redis_limiter(
    url: &str,
    prefix: &Prefix,
    limit: usize,
    events: Arc<dyn LimitEvents>,
) -> RedisLimiter {
    let mut settings = RedisSettings::new(url);
    settings.prefix = prefix.0.clone();
    RedisLimiter::new(settings, limits(limit), events).expect("a redis URL")
}

/// An OpenAI-compatible provider on the fake server, behind `limiter`.
fn limited(server: &FakeLlm, limiter: Arc<dyn Limiter>, account: &str) -> Arc<dyn Provider> {
    let inner = OpenAiProvider::new(ProviderConfig {
        base_url: server.url.clone(),
        api_key: None,
        models: [("default".to_string(), "fake".to_string())].into(),
    })
    .expect("a client");
    Arc::new(LimitedProvider {
        inner: Arc::new(inner),
        limiter,
        account: account.to_string(),
    })
}

/// `calls` recipe calls at once through `provider`; each must succeed.
async fn call_at_once(provider: &Arc<dyn Provider>, calls: usize) {
    let schema = json!({
        "type": "object",
        "properties": { "text": { "type": "string" } },
        "required": ["text"],
        "additionalProperties": false
    });
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let (provider, schema) = (Arc::clone(provider), schema.clone());
            tokio::spawn(async move {
                let input = json!({});
                let call_id = format!("call-{i}");
                let call = RecipeCall {
                    recipe: "r",
                    model: "default",
                    prompt: format!("call {i}"),
                    input: &input,
                    output_schema: &schema,
                    path: "step",
                    call_id: &call_id,
                    repair: None,
                    journal: None,
                    deadline: None,
                    progress: None,
                };
                provider.complete(&call).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("the call succeeds");
    }
}

async fn slow_llm() -> FakeLlm {
    FakeLlm::start(vec![], json!({ "text": "ok" }), Duration::from_millis(40)).await
}

/// Fail-opens counted, as the metrics would be.
#[derive(Default)]
struct Counted {
    fail_opens: AtomicU64,
    waits: AtomicU64,
}

impl LimitEvents for Counted {
    fn waited(&self, _: &str, _: Duration) {
        self.waits.fetch_add(1, Ordering::SeqCst);
    }
    fn failed_open(&self, _: &str) {
        self.fail_opens.fetch_add(1, Ordering::SeqCst);
    }
}

/// Also guards the local line: of the 45 calls waiting at any moment, only
/// as many as the limit wait in Redis (and poll it); the rest wait in the
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_calls_of_one_account_run_five_at_a_time_through_redis() {
    flow_tests::require!(Redis);
    let prefix = Prefix::new("fifty");
    let server = slow_llm().await;
    let events = Arc::new(Counted::default());
    let limiter: Arc<dyn Limiter> =
        Arc::new(redis_limiter(&redis_url(), &prefix, 5, events.clone()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, waiters) = (Arc::clone(&done), format!("{}:llm:acme:waiters", prefix.0));
        tokio::spawn(async move {
            let client = redis::Client::open(redis_url()).unwrap();
            let mut connection = client.get_multiplexed_async_connection().await.unwrap();
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                let waiting: i64 = redis::cmd("ZCARD")
                    .arg(&waiters)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                most = most.max(waiting);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            most
        })
    };
    call_at_once(&limited(&server, limiter, "acme"), 50).await;
    done.store(true, Ordering::SeqCst);
    let most_in_redis_line = sampler.await.unwrap();
    assert_eq!(server.requests(), 50);
    assert_eq!(server.most_at_once(), 5, "at most 5, and the limit is used");
    assert_eq!(events.fail_opens.load(Ordering::SeqCst), 0);
    assert_eq!(events.waits.load(Ordering::SeqCst), 50);
    // Often none: a place in the local line comes back only once Redis has
    // the permit back, so the next call is usually granted at once.
    assert!(
        most_in_redis_line <= 5,
        "at most the limit waits in Redis's line: {most_in_redis_line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_limiter_holds_the_same_limit() {
    let server = slow_llm().await;
    let limiter: Arc<dyn Limiter> = Arc::new(LocalLimiter::new(limits(5), Arc::new(Unobserved)));
    call_at_once(&limited(&server, limiter, "acme"), 50).await;
    assert_eq!(server.most_at_once(), 5);
}

/// Two limiters with connections of their own, as two processes would be,
/// share one account's limit; another account has a limit of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sharing_redis_respect_one_limit() {
    flow_tests::require!(Redis);
    let prefix = Prefix::new("shared");
    let server = slow_llm().await;
    let first: Arc<dyn Limiter> = Arc::new(redis_limiter(
        &redis_url(),
        &prefix,
        3,
        Arc::new(Unobserved),
    ));
    let second: Arc<dyn Limiter> = Arc::new(redis_limiter(
        &redis_url(),
        &prefix,
        3,
        Arc::new(Unobserved),
    ));
    let (a, b) = (
        limited(&server, Arc::clone(&first), "acme"),
        limited(&server, second, "acme"),
    );
    tokio::join!(call_at_once(&a, 20), call_at_once(&b, 20));
    assert_eq!(server.most_at_once(), 3, "one limit across both");

    let other = slow_llm().await;
    let (acme, globex) = (
        limited(&other, Arc::clone(&first), "acme"),
        limited(&other, first, "globex"),
    );
    tokio::join!(call_at_once(&acme, 12), call_at_once(&globex, 12));
    assert_eq!(other.most_at_once(), 6, "each account has its own 3");
}

/// A holder that died mid-call (its lease in Redis, nobody renewing it)
/// holds its permit until the lease ends, then the next caller gets it.
#[tokio::test]
async fn a_dead_holders_permit_comes_back_when_its_lease_ends() {
    flow_tests::require!(Redis);
    let prefix = Prefix::new("lease");
    let mut settings = RedisSettings::new(&redis_url());
    settings.prefix = prefix.0.clone();
    settings.lease = Duration::from_millis(600);
    let limiter = RedisLimiter::new(settings, limits(1), Arc::new(Unobserved)).unwrap();
    // The permit a killed process left: its lease, that nobody renews or
    // releases any more.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(format!("{}:llm:acme:holders", prefix.0))
        .arg(now_ms() + 600)
        .arg("a-process-that-was-killed")
        .query_async(&mut connection)
        .await
        .unwrap();

    let started = Instant::now();
    let _permit = limiter.acquire("acme").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400),
        "the lease was still running: {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "it came back: {waited:?}");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A `redis-server` of the test's own on a spare port, killed when dropped.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
}

impl OwnRedis {
    fn start(port: u16) -> OwnRedis {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts (Debian's redis-server is on the machine)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {port} never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        OwnRedis { child, port }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spare_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a spare port")
}

/// Redis killed between two batches of calls: every call still completes
/// (fail-open, counted); Redis back: the limit applies again. Redis down at
/// the start is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_open_while_redis_is_down_and_the_limit_returns_with_it() {
    flow_tests::require!(RedisServer);
    let prefix = Prefix::new("down");
    let port = spare_port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut redis = OwnRedis::start(port);
    let events = Arc::new(Counted::default());
    let limiter: Arc<dyn Limiter> = Arc::new(redis_limiter(&url, &prefix, 2, events.clone()));

    let server = slow_llm().await;
    call_at_once(&limited(&server, Arc::clone(&limiter), "acme"), 10).await;
    assert_eq!(server.most_at_once(), 2);
    assert_eq!(events.fail_opens.load(Ordering::SeqCst), 0);

    redis.kill();
    let open = slow_llm().await;
    call_at_once(&limited(&open, Arc::clone(&limiter), "acme"), 10).await;
    assert_eq!(open.requests(), 10, "every call went ahead");
    assert!(
        events.fail_opens.load(Ordering::SeqCst) >= 10,
        "each counted: {}",
        events.fail_opens.load(Ordering::SeqCst)
    );
    // Regression (issue 13): with Redis down, 16 calls were in flight at
    // once under a limit of 3; the process's own limit still holds.
    assert_eq!(open.most_at_once(), 2, "this process's limit holds");

    let _back = OwnRedis::start(redis.port);
    // The limiter tries Redis again at most once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let before = events.fail_opens.load(Ordering::SeqCst);
    let limited_again = slow_llm().await;
    call_at_once(&limited(&limited_again, limiter, "acme"), 10).await;
    assert_eq!(limited_again.most_at_once(), 2, "the limit is back");
    assert_eq!(events.fail_opens.load(Ordering::SeqCst), before);
}

/// A call waiting behind one that holds the only permit keeps waiting when
/// Redis dies (the process's own limit still holds), and goes ahead, failing
/// open, as soon as that call ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_when_redis_dies_goes_ahead_when_the_holder_ends() {
    flow_tests::require!(RedisServer);
    let prefix = Prefix::new("dies-while-held");
    let port = spare_port();
    let mut redis = OwnRedis::start(port);
    let events = Arc::new(Counted::default());
    let mut settings = RedisSettings::new(&format!("redis://127.0.0.1:{port}"));
    settings.prefix = prefix.0.clone();
    settings.lease = Duration::from_millis(900);
    let limiter = Arc::new(
        RedisLimiter::new(settings, limits(1), events.clone() as Arc<dyn LimitEvents>)
            .expect("a redis URL"),
    );
    let held = limiter.acquire("acme").await;
    assert_eq!(events.fail_opens.load(Ordering::SeqCst), 0);
    let waiting = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let _permit = limiter.acquire("acme").await;
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the limit is taken");
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !waiting.is_finished(),
        "the limit of 1 holds while Redis is down"
    );
    let released = Instant::now();
    drop(held);
    let through = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting call goes ahead once the holder ends")
        .unwrap();
    // Its own try of the dead Redis: an answer within 250 ms, or a refused
    // connection at once.
    let after = through - released;
    assert!(after < Duration::from_millis(1_500), "{after:?}");
    assert!(events.fail_opens.load(Ordering::SeqCst) >= 1);
}

/// Regression: a waiter whose wait was cancelled (its step timed out) kept
/// its place at the head of the line, holding a free permit from the next
/// caller; it now leaves the line at once.
#[tokio::test]
async fn a_cancelled_waiter_leaves_the_line() {
    flow_tests::require!(Redis);
    let prefix = Prefix::new("cancelled");
    // The holder in another process: this one's waiter waits in Redis's
    // line, not in its own process's.
    let holder = redis_limiter(&redis_url(), &prefix, 1, Arc::new(Unobserved));
    let limiter = Arc::new(redis_limiter(
        &redis_url(),
        &prefix,
        1,
        Arc::new(Unobserved),
    ));
    let held = holder.acquire("acme").await;
    let waited = tokio::time::timeout(Duration::from_millis(100), limiter.acquire("acme")).await;
    assert!(waited.is_err(), "the limit is taken");
    // The cleanup is sent when the wait is dropped; give it a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let waiting: i64 = redis::cmd("ZCARD")
        .arg(format!("{}:llm:acme:waiters", prefix.0))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "nobody is left in line");
    drop(held);
    let started = Instant::now();
    let _next = limiter.acquire("acme").await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

/// Regression: a step whose timeout passed while its call waited for a
/// permit of the account's limit was recorded as "the attempt ran past the
/// step's timeout", blaming the model, which was never asked. The wait is
/// now what the error names.
#[tokio::test]
async fn a_timeout_spent_waiting_for_a_permit_says_so() {
    let server = FakeLlm::start(
        vec![],
        json!({ "text": "slow" }),
        Duration::from_millis(400),
    )
    .await;
    let limiter: Arc<dyn Limiter> = Arc::new(LocalLimiter::new(limits(1), Arc::new(Unobserved)));
    let provider = limited(&server, limiter, "acme");
    let (input, schema) = (json!({}), json!({}));
    let call = |call_id: &'static str, deadline| RecipeCall {
        recipe: "r",
        model: "default",
        prompt: call_id.to_string(),
        input: &input,
        output_schema: &schema,
        path: "step",
        call_id,
        repair: None,
        journal: None,
        deadline,
        progress: None,
    };
    let holder = call("holder", None);
    let holding = provider.complete(&holder);
    let waiting = async {
        // The holder has the one permit by then.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let waiter = call(
            "waiter",
            Some(tokio::time::Instant::now() + Duration::from_millis(100)),
        );
        provider.complete(&waiter).await
    };
    let (held, waited) = tokio::join!(holding, waiting);
    assert!(held.is_ok(), "{held:?}");
    let error = waited.expect_err("the waiter's timeout passed");
    assert_eq!(error.kind, flow_runtime::error::ErrorKind::Timeout);
    assert!(
        error
            .message
            .contains("while it waited for a place among the account's model calls")
            && error.message.contains("the model was not asked"),
        "{}",
        error.message
    );
    assert_eq!(
        server.prompts(),
        ["holder"],
        "the waiter's call never went out"
    );
}

/// Regression: through the interpreter, a step whose timeout passed while
/// it waited for a permit was still recorded as "the attempt ran past the
/// step's timeout": the step's timer and the wait's fired at the same
/// instant, and on a runtime of several threads the step's won. Two
/// branches at once under a limit of one call, the model slower than the
/// steps' timeout: the branch that waited says so, and its call never went
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_timed_out_waiting_for_a_permit_says_so_through_the_interpreter() {
    let source = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string }
  prompt "{{input.q}}"
}
workflow w {
  parallel both {
    branch a { step s = answer { q: "a" } retry 1 timeout 300ms }
    branch b { step t = answer { q: "b" } retry 1 timeout 300ms }
  }
  output { done: true }
}"#;
    let checked = flow_compiler::check_source("p.flow", source);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    let plan = flow_compiler::lower(&checked).expect("lowers");
    for round in 0..5 {
        let server =
            FakeLlm::start(vec![], json!({ "text": "slow" }), Duration::from_secs(2)).await;
        let limiter: Arc<dyn Limiter> =
            Arc::new(LocalLimiter::new(limits(1), Arc::new(Unobserved)));
        let store = Arc::new(flow_runtime::memory::MemoryStore::default());
        let services = flow_runtime::services::Services {
            provider: limited(&server, limiter, "acme"),
            effects: store.clone(),
            mcp: None,
            journal: store.clone(),
            steps: None,
            in_flight: None,
        };
        let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
        assert!(
            matches!(outcome, flow_runtime::journal::Outcome::Failed { .. }),
            "{outcome:?}"
        );
        assert_eq!(server.requests(), 1, "round {round}: one call went out");
        let errors: Vec<String> = store
            .records()
            .iter()
            .flat_map(|record| record.attempts.iter().filter_map(|a| a.error.clone()))
            .collect();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("while it waited for a place")
                    && e.contains("the model was not asked")),
            "round {round}: {errors:?}"
        );
    }
}
