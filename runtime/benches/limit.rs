//! B5: the Redis concurrency limit on the Redis at 127.0.0.1:6379.
//!
//! * acquire + release: 32 tasks of one process take and give back permits
//!   of one account with room for all (the cost of the limit itself), and
//!   one task alone gives the latency a call pays when a permit is free;
//! * 10 accounts × limit 5, 50 calls each of a 20 ms fake model at once:
//!   throughput against the ideal (10 × 5 / 20 ms = 2,500 calls/s) and the
//!   most calls any account had in flight.
//!
//! `cargo bench -p flow-runtime --bench limit [-- --quick]`

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow_runtime::error::StepError;
use flow_runtime::limit::{LimitedProvider, Limiter, Limits, RedisLimiter, RedisSettings};
use flow_runtime::services::{BoxFuture, Provider, RecipeCall};
use serde_json::{Value, json};

const REDIS: &str = "redis://127.0.0.1:6379";

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let prefix = format!("flow-bench-{}", std::process::id());
    runtime.block_on(async {
        let limiter = redis_limiter(&prefix, 1_000);
        // Connect and load the scripts before measuring.
        drop(limiter.acquire("bench").await);

        let rounds: usize = if quick { 200 } else { 5_000 };
        let mut alone = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            let permit = limiter.acquire("bench").await;
            alone.push(started.elapsed());
            drop(permit);
        }
        alone.sort();

        let tasks = 32;
        let per_task = if quick { 50 } else { 1_000 };
        let started = Instant::now();
        let workers: Vec<_> = (0..tasks)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        drop(limiter.acquire("bench").await);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
        let per_second = (tasks * per_task) as f64 / started.elapsed().as_secs_f64();
        println!(
            "| B5 | Redis permit acquire + release, {tasks} tasks of one process, loopback | {per_second:.0} per second | one task alone: p50 {:.3} ms, p99 {:.3} ms per acquire |",
            ms(alone[alone.len() / 2]),
            ms(alone[alone.len() * 99 / 100]),
        );

        let calls_each = if quick { 10 } else { 50 };
        let accounts = 10;
        let limited = redis_limiter(&prefix, 5);
        let model = Arc::new(SlowModel::default());
        let started = Instant::now();
        let mut calls = Vec::new();
        for account in 0..accounts {
            let provider: Arc<dyn Provider> = Arc::new(LimitedProvider {
                inner: model.clone(),
                limiter: Arc::clone(&limited),
                account: format!("account-{account}"),
            });
            for i in 0..calls_each {
                let provider = Arc::clone(&provider);
                calls.push(tokio::spawn(async move {
                    let (input, schema) = (json!({}), json!({}));
                    let call_id = format!("account-{account}:{i}");
                    let call = RecipeCall {
                        recipe: "r",
                        model: "default",
                        prompt: String::new(),
                        input: &input,
                        output_schema: &schema,
                        path: "step",
                        call_id: &call_id,
                        repair: None,
                        journal: None,
                        deadline: None,
                        progress: None,
                    };
                    provider.complete(&call).await.unwrap();
                }));
            }
        }
        for call in calls {
            call.await.unwrap();
        }
        let elapsed = started.elapsed();
        let throughput = (accounts * calls_each) as f64 / elapsed.as_secs_f64();
        let ideal = (accounts * 5) as f64 / SlowModel::LATENCY.as_secs_f64();
        let most = model.most.lock().unwrap().values().copied().max().unwrap_or(0);
        println!(
            "| B5 | {accounts} accounts x limit 5, {calls_each} calls each of a 20 ms model at once | {throughput:.0} calls/s, {:.0}% of the ideal {ideal:.0} | most in flight for one account: {most} |",
            throughput / ideal * 100.0
        );
    });
    clean(&prefix);
    assert_eq!(
        FAIL_OPENS.0.load(Ordering::Relaxed),
        0,
        "a call failed open: these figures would not be the limit's"
    );
}

/// Counts fail-opens: a bench that failed open would measure how fast the
/// limiter gives up, not the limit.
#[derive(Default)]
struct FailOpens(AtomicUsize);

impl flow_runtime::limit::LimitEvents for FailOpens {
    fn waited(&self, _: &str, _: Duration) {}
    fn failed_open(&self, _: &str) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

static FAIL_OPENS: std::sync::LazyLock<Arc<FailOpens>> = std::sync::LazyLock::new(Arc::default);

fn redis_limiter(prefix: &str, limit: usize) -> Arc<dyn Limiter> {
    let mut settings = RedisSettings::new(REDIS);
    settings.prefix = prefix.to_string();
    Arc::new(
        RedisLimiter::new(
            settings,
            Limits {
                default: limit,
                accounts: HashMap::new(),
            },
            Arc::clone(&*FAIL_OPENS) as Arc<dyn flow_runtime::limit::LimitEvents>,
        )
        .expect("a redis URL"),
    )
}

/// A model that answers after 20 ms and counts calls in flight per account
/// (the account is the call id's prefix).
#[derive(Default)]
struct SlowModel {
    now: Mutex<HashMap<String, usize>>,
    most: Mutex<HashMap<String, usize>>,
    calls: AtomicUsize,
}

impl SlowModel {
    const LATENCY: Duration = Duration::from_millis(20);
}

impl Provider for SlowModel {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            let account = call
                .call_id
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string();
            {
                let mut now = self.now.lock().unwrap();
                let in_flight = now.entry(account.clone()).or_default();
                *in_flight += 1;
                let mut most = self.most.lock().unwrap();
                let top = most.entry(account.clone()).or_default();
                *top = (*top).max(*in_flight);
            }
            tokio::time::sleep(Self::LATENCY).await;
            *self.now.lock().unwrap().get_mut(&account).unwrap() -= 1;
            self.calls.fetch_add(1, Ordering::Relaxed);
            Ok(json!({}))
        })
    }
}

/// Deletes the bench's keys.
fn clean(prefix: &str) {
    let Ok(client) = redis::Client::open(REDIS) else {
        return;
    };
    let Ok(mut connection) = client.get_connection() else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut connection)
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut connection);
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
