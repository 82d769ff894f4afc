//! The per-account limit on LLM calls in flight: a batch workflow cannot take
//! all of an account's model capacity, and a sick Redis never stops a run.
//!
//! `LimitedProvider` wraps the provider of one run: each recipe call first
//! takes a permit from a `Limiter` for the run's account and holds it for the
//! call. The wait is bounded by the step attempt's timeout (the interpreter
//! cancels the attempt, and with it the wait).
//!
//! * `LocalLimiter`: a FIFO semaphore per account in this process; what
//!   `flow run` and a flowd without Redis use.
//! * `RedisLimiter`: one limit across every process that shares a Redis.
//!   Holders are a sorted set of leases (deadline = score), renewed while the
//!   call runs, so the permit of a process that dies comes back when its
//!   lease ends. Waiters take a ticket in a second sorted set and are served
//!   in ticket order, so no run starves; a waiter that stops asking (its
//!   process died, its attempt timed out) drops out of the line. Both are
//!   changed only by Lua scripts, atomically, on Redis's clock. Within a
//!   process, a call first takes a place in a local line (a `LocalLimiter`
//!   of the same limit): a process never holds more permits of an account
//!   than the limit, so only that many of its waiters need to ask Redis, and
//!   a thousand runs waiting in one process cost Redis what `limit` do.
//!   **Fail-open**:
//!   on any Redis error or slow answer the call goes ahead without Redis,
//!   holding its place in the local line, so that the process's own limit
//!   still holds; a warning is logged and `LimitEvents::failed_open` is told.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{ErrorKind, StepError};
use crate::services::{BoxFuture, Provider, RecipeCall};
use crate::tls::{TlsMode, TlsSettings};

/// The default number of LLM calls in flight per account, the one
/// `flowc check` assumes.
pub const DEFAULT_LIMIT: usize = flow_plan::limits::DEFAULT_MODEL_CALLS as usize;

/// What a limiter tells the metrics: how long calls waited, and each time it
/// let a call through without a permit because Redis failed.
pub trait LimitEvents: Send + Sync {
    fn waited(&self, account: &str, wait: Duration);
    fn failed_open(&self, account: &str);
}

/// Events nobody listens to.
pub struct Unobserved;

impl LimitEvents for Unobserved {
    fn waited(&self, _: &str, _: Duration) {}
    fn failed_open(&self, _: &str) {}
}

/// A permit to make one LLM call; given back when dropped.
pub struct Permit {
    _release: Option<Box<dyn Send + Sync>>,
}

/// Where permits come from.
pub trait Limiter: Send + Sync {
    /// Waits for a permit for one LLM call of `account`.
    fn acquire<'a>(&'a self, account: &'a str) -> BoxFuture<'a, Permit>;
}

/// The limit of each account: a default, and some accounts' own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub default: usize,
    pub accounts: HashMap<String, usize>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            default: DEFAULT_LIMIT,
            accounts: HashMap::new(),
        }
    }
}

impl Limits {
    pub fn of(&self, account: &str) -> usize {
        self.accounts
            .get(account)
            .copied()
            .unwrap_or(self.default)
            .max(1)
    }
}

/// A FIFO semaphore per account, in this process.
pub struct LocalLimiter {
    limits: Limits,
    semaphores: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    events: Arc<dyn LimitEvents>,
}

impl LocalLimiter {
    pub fn new(limits: Limits, events: Arc<dyn LimitEvents>) -> LocalLimiter {
        LocalLimiter {
            limits,
            semaphores: Mutex::new(HashMap::new()),
            events,
        }
    }
}

impl Limiter for LocalLimiter {
    fn acquire<'a>(&'a self, account: &'a str) -> BoxFuture<'a, Permit> {
        let semaphore = {
            let mut semaphores = self.semaphores.lock().unwrap_or_else(|p| p.into_inner());
            // Looked up by `&str` first: the entry API copies the name on
            // every call, and this is every model call's.
            match semaphores.get(account) {
                Some(semaphore) => Arc::clone(semaphore),
                None => Arc::clone(semaphores.entry(account.to_string()).or_insert_with(|| {
                    Arc::new(tokio::sync::Semaphore::new(self.limits.of(account)))
                })),
            }
        };
        Box::pin(async move {
            let started = Instant::now();
            // Tokio's semaphore serves waiters in order; it is never closed.
            let permit = semaphore.acquire_owned().await.ok();
            self.events.waited(account, started.elapsed());
            Permit {
                _release: permit.map(|p| Box::new(p) as Box<dyn Send + Sync>),
            }
        })
    }
}

/// Takes a permit when the caller is first in line among those that fit.
/// KEYS: holders, waiters (ticket order), alive (waiters' deadlines), the
/// ticket counter. ARGV: limit, id, lease ms, waiter ttl ms.
/// Returns 1 when granted, 0 to ask again.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, id = tonumber(ARGV[1]), ARGV[2]
local lease, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, waiter in ipairs(gone) do
  redis.call('ZREM', KEYS[2], waiter)
  redis.call('ZREM', KEYS[3], waiter)
end
if not redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), id)
end
redis.call('ZADD', KEYS[3], now + ttl, id)
local free = limit - redis.call('ZCARD', KEYS[1])
if free > 0 and redis.call('ZRANK', KEYS[2], id) < free then
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('PEXPIRE', KEYS[1], lease * 2)
  return 1
end
for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl * 10) end
return 0
";

/// Extends a holder's lease; 0 when it had lost it (expired meanwhile).
/// KEYS: holders. ARGV: id, lease ms.
const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return renewed
";

/// Settings of a `RedisLimiter`.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub url: String,
    /// Every key starts with it (tests take a unique one).
    pub prefix: String,
    /// How long a permit outlives its holder's last renewal.
    pub lease: Duration,
    /// How long Redis may take to answer before the call fails open.
    pub answer_within: Duration,
}

impl RedisSettings {
    pub fn new(url: &str) -> RedisSettings {
        RedisSettings {
            url: url.to_string(),
            prefix: "flow".to_string(),
            lease: Duration::from_secs(10),
            answer_within: Duration::from_millis(250),
        }
    }
}

/// The client of the Redis at `url`. A `rediss://` URL is TLS, checked as
/// its `sslmode` says (`verify-full` by default; see `crate::tls`), against
/// the authorities of its `sslrootcert` or the machine's.
pub fn redis_client(url: &str) -> Result<redis::Client, String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut parameters: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let tls = TlsSettings::take(&mut parameters, TlsMode::VerifyFull)?;
    let rest = if parameters.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", parameters.join("&"))
    };
    let asked_for_tls = rest.len() != url.len();
    if !rest.starts_with("rediss://") {
        if asked_for_tls {
            return Err("sslmode and sslrootcert are for a rediss:// URL".to_string());
        }
        return redis::Client::open(rest).map_err(|e| e.to_string());
    }
    // The authorities first: redis replaces the address's TLS parameters
    // with those of the certificates, so the checks are set after.
    let client = match &tls.root_cert {
        None => redis::Client::open(rest.as_str()),
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("sslrootcert `{}`: {e}", path.display()))?;
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            redis::Client::build_with_tls(rest.as_str(), certificates)
        }
    }
    .map_err(|e| e.to_string())?;
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    match tls.mode {
        TlsMode::Disable => {
            return Err("sslmode=disable contradicts rediss://; write redis://".to_string());
        }
        TlsMode::VerifyFull => return Ok(client),
        TlsMode::VerifyCa => addr.set_danger_accept_invalid_hostnames(true),
        TlsMode::Require | TlsMode::Prefer if tls.root_cert.is_some() => {
            addr.set_danger_accept_invalid_hostnames(true);
        }
        TlsMode::Require | TlsMode::Prefer => {
            if let redis::ConnectionAddr::TcpTls { insecure, .. } = &mut addr {
                *insecure = true;
            }
        }
    }
    redis::Client::open(info.set_addr(addr)).map_err(|e| e.to_string())
}

/// One limit per account across every process sharing a Redis.
pub struct RedisLimiter {
    settings: RedisSettings,
    limits: Limits,
    client: redis::Client,
    /// The connection, once made; made again after it fails.
    connection: tokio::sync::Mutex<Option<redis::aio::ConnectionManager>>,
    /// When connecting last failed: tried again at most once a second.
    failed_at: Mutex<Option<Instant>>,
    acquire: redis::Script,
    renew: redis::Script,
    events: Arc<dyn LimitEvents>,
    /// Unique among holders: this process and a counter.
    next_id: AtomicU64,
    process: String,
    fail_opens: AtomicU64,
    /// Wakes this process's waiters of an account when it gives a permit
    /// back: they ask at once instead of at their next poll (another
    /// process's releases are seen at the next poll).
    released: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// The local line in front of Redis's: at most `limit` of this
    /// process's calls of an account wait in Redis or hold a permit there.
    /// It holds when Redis fails too: failing open skips Redis, not this
    /// process's own limit.
    local: LocalLimiter,
}

impl RedisLimiter {
    /// A limiter on the Redis at `settings.url`. It does not connect yet: a
    /// Redis that is down at start is the same as one that goes down later
    /// (calls fail open until it answers).
    pub fn new(
        settings: RedisSettings,
        limits: Limits,
        events: Arc<dyn LimitEvents>,
    ) -> Result<RedisLimiter, String> {
        let client = redis_client(&settings.url)
            .map_err(|e| format!("redis URL `{}`: {e}", crate::mcp::masked_url(&settings.url)))?;
        Ok(RedisLimiter {
            settings,
            client,
            connection: tokio::sync::Mutex::new(None),
            failed_at: Mutex::new(None),
            acquire: redis::Script::new(ACQUIRE),
            renew: redis::Script::new(RENEW),
            events,
            next_id: AtomicU64::new(0),
            process: format!(
                "{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros())
            ),
            fail_opens: AtomicU64::new(0),
            released: Mutex::new(HashMap::new()),
            // Its waits are part of the whole wait, which `acquire` reports.
            local: LocalLimiter::new(limits.clone(), Arc::new(Unobserved)),
            limits,
        })
    }

    fn released(&self, account: &str) -> Arc<tokio::sync::Notify> {
        Arc::clone(
            self.released
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(account.to_string())
                .or_default(),
        )
    }

    /// Whether Redis answers now (what it said otherwise, naming its URL).
    pub async fn probe(&self) -> Result<(), String> {
        let mut connection = self.connection().await?;
        match tokio::time::timeout(
            self.settings.answer_within,
            redis::cmd("PING").query_async::<String>(&mut connection),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("redis {}: {error}", self.settings.url)),
            Err(_) => Err(format!("redis {} did not answer", self.settings.url)),
        }
    }

    /// How many calls went ahead without a permit because Redis failed.
    pub fn fail_opens(&self) -> u64 {
        self.fail_opens.load(Ordering::Relaxed)
    }

    fn keys(&self, account: &str) -> [String; 4] {
        let base = format!("{}:llm:{account}", self.settings.prefix);
        [
            format!("{base}:holders"),
            format!("{base}:waiters"),
            format!("{base}:alive"),
            format!("{base}:tickets"),
        ]
    }

    /// The connection, connecting if there is none (not more than once a
    /// second after a failure).
    async fn connection(&self) -> Result<redis::aio::ConnectionManager, String> {
        let mut connection = self.connection.lock().await;
        if let Some(connection) = connection.as_ref() {
            return Ok(connection.clone());
        }
        let recently = self
            .failed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if recently {
            return Err(format!(
                "redis {} did not answer a moment ago",
                self.settings.url
            ));
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.answer_within))
            .set_response_timeout(Some(self.settings.answer_within))
            .set_number_of_retries(1);
        match tokio::time::timeout(
            self.settings.answer_within * 2,
            redis::aio::ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        {
            Ok(Ok(made)) => {
                *connection = Some(made.clone());
                Ok(made)
            }
            outcome => {
                *self.failed_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                Err(match outcome {
                    Ok(Err(error)) => format!("redis {}: {error}", self.settings.url),
                    _ => format!("redis {}: no answer", self.settings.url),
                })
            }
        }
    }

    /// Runs `script` with a deadline; any failure is the caller's cue to
    /// fail open.
    async fn run(
        &self,
        connection: &mut redis::aio::ConnectionManager,
        script: &redis::Script,
        keys: &[String],
        args: &[String],
    ) -> Result<i64, String> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        match tokio::time::timeout(
            self.settings.answer_within,
            invocation.invoke_async::<i64>(connection),
        )
        .await
        {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(format!("redis {}: {error}", self.settings.url)),
            Err(_) => Err(format!(
                "redis {} did not answer within {:?}",
                self.settings.url, self.settings.answer_within
            )),
        }
    }

    /// Lets a call go ahead without Redis, holding its place in this
    /// process's line (`local`), which it gives back when it ends.
    fn fail_open(&self, account: &str, why: &str, local: Permit) -> Permit {
        let count = self.fail_opens.fetch_add(1, Ordering::Relaxed) + 1;
        // One line per hundred, not one per call, when Redis is down.
        if count % 100 == 1 {
            tracing::warn!(
                account,
                "LLM concurrency limit not applied ({why}); calls go ahead (fail-open, {count} so far)"
            );
        }
        self.events.failed_open(account);
        local
    }
}

/// Waits between asking again, growing to this at most.
const LONGEST_POLL: Duration = Duration::from_millis(20);

impl Limiter for RedisLimiter {
    fn acquire<'a>(&'a self, account: &'a str) -> BoxFuture<'a, Permit> {
        Box::pin(async move {
            let started = Instant::now();
            let keys = self.keys(account);
            let id = format!(
                "{}-{}",
                self.process,
                self.next_id.fetch_add(1, Ordering::Relaxed)
            );
            let lease = self.settings.lease.as_millis().to_string();
            let ttl = WAITER_TTL.as_millis().to_string();
            let args = [self.limits.of(account).to_string(), id.clone(), lease, ttl];
            // A place in this process's line first: at most `limit` of its
            // calls ask Redis, and, Redis down, at most `limit` go ahead.
            let local = self.local.acquire(account).await;
            let mut connection = match self.connection().await {
                Ok(connection) => connection,
                Err(why) => return self.fail_open(account, &why, local),
            };
            // Until a permit is granted and held, leaving (a timeout, a
            // cancelled attempt, failing open) takes this id out of Redis: a
            // grant whose answer came too late must not hold a permit for a
            // whole lease, nor a gone waiter keep its place in line.
            let mut leave = LeaveOnDrop {
                connection: Some(connection.clone()),
                keys: keys.clone(),
                id: id.clone(),
            };
            let released = self.released(account);
            let mut poll = Duration::from_millis(1);
            loop {
                // Registered before asking, so that a release between the
                // answer and the wait is not missed.
                let woken = released.notified();
                let answer = self.run(&mut connection, &self.acquire, &keys, &args).await;
                match answer {
                    Ok(1) => {
                        leave.connection = None;
                        break;
                    }
                    Ok(_) => {
                        tokio::select! {
                            () = tokio::time::sleep(poll) => {}
                            () = woken => {}
                        }
                        poll = (poll * 2).min(LONGEST_POLL);
                    }
                    Err(why) => return self.fail_open(account, &why, local),
                }
            }
            self.events.waited(account, started.elapsed());
            let [holders, ..] = keys;
            let held = Held::start(self, connection, holders, id, released, Some(local));
            Permit {
                _release: Some(Box::new(held)),
            }
        })
    }
}

/// How long a waiter that stopped asking keeps its place in line: much longer
/// than a poll (20 ms) or a slow answer (250 ms), since a waiter put back at
/// the end of the line could wait for ever.
const WAITER_TTL: Duration = Duration::from_secs(2);

/// Takes an id out of holders, waiters and the waiters' deadlines when
/// dropped, unless disarmed (`connection` taken).
struct LeaveOnDrop {
    connection: Option<redis::aio::ConnectionManager>,
    keys: [String; 4],
    id: String,
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else {
            return;
        };
        let (keys, id) = (self.keys.clone(), std::mem::take(&mut self.id));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _: Result<(), _> = redis::pipe()
                    .cmd("ZREM")
                    .arg(&keys[0])
                    .arg(&id)
                    .ignore()
                    .cmd("ZREM")
                    .arg(&keys[1])
                    .arg(&id)
                    .ignore()
                    .cmd("ZREM")
                    .arg(&keys[2])
                    .arg(&id)
                    .ignore()
                    .query_async(&mut connection)
                    .await;
            });
        }
    }
}

/// A permit held in Redis: renewed while held, removed when dropped.
struct Held {
    renewal: tokio::task::JoinHandle<()>,
}

impl Held {
    fn start(
        limiter: &RedisLimiter,
        mut connection: redis::aio::ConnectionManager,
        holders: String,
        id: String,
        released: Arc<tokio::sync::Notify>,
        local: Option<Permit>,
    ) -> Held {
        let renew = limiter.renew.clone();
        let lease = limiter.settings.lease;
        let answer_within = limiter.settings.answer_within;
        let release = ReleaseOnDrop {
            connection: connection.clone(),
            holders: holders.clone(),
            id: id.clone(),
            released,
            local,
        };
        let renewal = tokio::spawn(async move {
            // Held by the task: aborting it drops this, which releases.
            let _release = release;
            loop {
                tokio::time::sleep(lease / 3).await;
                let mut invocation = renew.prepare_invoke();
                invocation
                    .key(&holders)
                    .arg(&id)
                    .arg(lease.as_millis().to_string());
                // A renewal that fails leaves the lease to run out; the call
                // goes on either way.
                let _ = tokio::time::timeout(
                    answer_within,
                    invocation.invoke_async::<i64>(&mut connection),
                )
                .await;
            }
        });
        Held { renewal }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Aborting the renewal drops its `ReleaseOnDrop`, which gives the
        // permit back.
        self.renewal.abort();
    }
}

/// Removes a holder from Redis when dropped (in a task of its own: drop
/// cannot wait), then gives its place in the local line back: the next call
/// of this process asks Redis once the permit is free there.
struct ReleaseOnDrop {
    connection: redis::aio::ConnectionManager,
    holders: String,
    id: String,
    released: Arc<tokio::sync::Notify>,
    local: Option<Permit>,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let mut connection = self.connection.clone();
        let (holders, id) = (
            std::mem::take(&mut self.holders),
            std::mem::take(&mut self.id),
        );
        let released = Arc::clone(&self.released);
        let local = self.local.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _: Result<i64, _> = redis::cmd("ZREM")
                    .arg(&holders)
                    .arg(&id)
                    .query_async(&mut connection)
                    .await;
                drop(local);
                released.notify_waiters();
            });
        }
    }
}

/// The limiter `flow run` uses: `FLOW_LLM_CONCURRENCY` calls in flight
/// (default 10), through the Redis at `FLOW_REDIS_URL` when it is set (shared
/// with every process using it), in this process otherwise.
pub fn limiter_from_env() -> Result<Arc<dyn Limiter>, String> {
    let limit = match std::env::var("FLOW_LLM_CONCURRENCY") {
        Ok(text) => match text.parse::<usize>() {
            Ok(limit) if limit > 0 => limit,
            _ => {
                return Err(format!(
                    "FLOW_LLM_CONCURRENCY `{text}` is not a number of calls above 0"
                ));
            }
        },
        Err(_) => DEFAULT_LIMIT,
    };
    let limits = Limits {
        default: limit,
        accounts: HashMap::new(),
    };
    Ok(match std::env::var("FLOW_REDIS_URL") {
        Ok(url) => Arc::new(RedisLimiter::new(
            RedisSettings::new(&url),
            limits,
            Arc::new(Unobserved),
        )?),
        Err(_) => Arc::new(LocalLimiter::new(limits, Arc::new(Unobserved))),
    })
}

/// The end of an attempt's time in which a call waiting for a permit is no
/// longer let out: too little for any model to answer.
const LAST_MOMENT: std::time::Duration = std::time::Duration::from_millis(50);

/// A provider whose calls take a permit of the run's account first.
pub struct LimitedProvider {
    pub inner: Arc<dyn Provider>,
    pub limiter: Arc<dyn Limiter>,
    pub account: String,
}

impl Provider for LimitedProvider {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            let acquire = self.limiter.acquire(&self.account);
            let _permit = match call.deadline {
                // The step's timeout can pass in this wait: said as what it
                // is, where the step's own timeout blamed the model, which
                // was never asked. The wait ends a moment before the
                // attempt's deadline: at the deadline itself the step's
                // timer and this one raced (the step's won on a runtime of
                // several threads), and a call let out in the last
                // milliseconds is cut before any model answers.
                // A stop of the process is not the wait's, as it is not
                // the attempt's (`stall`).
                Some(deadline) => {
                    let wait_until = deadline.checked_sub(LAST_MOMENT).unwrap_or(deadline);
                    let wait = wait_until.saturating_duration_since(tokio::time::Instant::now());
                    crate::stall::timeout(wait, acquire)
                        .await
                        .ok_or_else(|| {
                            StepError::new(
                                ErrorKind::Timeout,
                                "the attempt's timeout passed while it waited for a place among the account's model calls in flight (`FLOW_LLM_CONCURRENCY`, flowd's `llm_concurrency`); the model was not asked",
                            )
                        })?
                }
                None => acquire.await,
            };
            // The wait for the permit can outlast the run's lease: a process
            // paused or starved meanwhile must not send the call of a step
            // that another process now runs.
            if let Some(journal) = call.journal {
                journal.admit().await?;
            }
            self.inner.complete(call).await
        })
    }

    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        self.inner.check_models(aliases)
    }
}
