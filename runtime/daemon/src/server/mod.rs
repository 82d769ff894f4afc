//! `flowd serve`: the store opened, unfinished runs resumed, the HTTP API
//! served until a shutdown signal, then the runs in flight given time to
//! settle (whatever does not settle is in the journal and resumes on the
//! next start).
//!
//! This file opens the daemon and serves it; `driving` runs each run in a
//! task of its own, `routes` is the HTTP surface, `auth` who a request is,
//! `problem` how errors are answered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use flow_plan::Plan;
use flow_plan::StepKind;
use flow_runtime::approval::{DecideError, Decision};
use flow_runtime::journal::{Outcome, StepRecord};
use flow_runtime::limit::{
    LimitedProvider, Limiter, Limits, LocalLimiter, RedisLimiter, RedisSettings,
};
use flow_runtime::llm::ProviderConfig;
use flow_runtime::runner::{Invocation, Observer};
use flow_runtime::services::{Provider, StepNow, StepsInFlight};
use flow_runtime::store::{Deployment, EventsOf, RunRow, RunStatus, Store, StoreError};
use serde_json::json;
use tokio::task::JoinSet;

use crate::config::{Config, Secret, StoreLocation};

mod auth;
mod driving;
mod problem;
mod routes;

pub(crate) use crate::counts::Counted;
use crate::counts::Counts;
use auth::*;
pub use auth::{AccountId, KeyHolder};
use problem::*;
pub use problem::{Problem, problem};
pub(crate) use problem::{joined, store_problem};
pub use routes::router;

/// What every request handler shares.
pub struct Daemon {
    pub config: Config,
    pub store: Arc<dyn Store>,
    pub provider: Arc<dyn Provider>,
    /// `provider`'s kind (`offline`, `openai`, `anthropic`), kept in each
    /// run's history as it starts (`RunChange::Began`).
    pub(crate) provider_kind: String,
    /// The per-account limit on LLM calls in flight.
    limiter: Arc<dyn Limiter>,
    /// MCP: the connections to MCP servers that every run of this
    /// process shares; closed at shutdown, after the runs settled.
    pub(crate) mcp: Arc<flow_runtime::mcp::McpPool>,
    /// API key (its digest, `key_digest`) to the account it belongs to and
    /// the person, for a user's key.
    keys: HashMap<[u8; 32], (AccountId, KeyHolder)>,
    /// The runs this process is driving; shutdown waits for them to settle.
    runs: std::sync::Mutex<JoinSet<()>>,
    pub metrics: crate::metrics::Metrics,
    /// The client of webhook deliveries.
    pub(crate) http: reqwest::Client,
    /// Plans by hash: a hash names one plan for ever, so it is parsed once
    /// while it stays among the recently used.
    plans: crate::plan_cache::PlanCache,
    /// Stored plans that did not load, by hash, with when and why (see
    /// [`REFUSED_PLAN_KEPT`]).
    refused_plans: std::sync::Mutex<HashMap<String, (std::time::Instant, StoreError)>>,
    /// Each account's deployments, with the count of deploys they were
    /// read at, for as long as it stays the same: every run start looks
    /// them up. On SQLite only (`deploy_count`).
    deployments: std::sync::Mutex<HashMap<String, CountedDeployments>>,
    /// The deploys of every flowd on this SQLite file; `None` on
    /// PostgreSQL, where flowds need not share a machine and each start
    /// reads its deployment.
    deploy_count: Option<crate::deploy_count::DeployCount>,
    /// The runs this process is driving: how to stop each (a cancel
    /// request), and the steps each executes now.
    driving: std::sync::Mutex<HashMap<String, driving::Driven>>,
    /// The SMTP client, when `[smtp]` is configured.
    pub(crate) mail: Option<crate::mailer::Transport>,
    /// The configured public URL, or the address bound at start.
    public_url: std::sync::OnceLock<String>,
    /// Wakes the mailer when there is something to mail.
    pub(crate) mail_wake: tokio::sync::Notify,
    /// Wakes the webhook deliverer: a run's status changed.
    pub(crate) events_wake: tokio::sync::Notify,
    /// The keys of approval links (`links`).
    pub(crate) links: crate::links::LinkKeys,
    /// Each account's places for steps executing at once (`Quotas`).
    step_places: std::sync::Mutex<driving::StepPlaces>,
    /// Each account's runs this process drives now (`Quotas`).
    in_flight: Arc<Counts>,
    /// The decided runs waiting here for a place among their account's
    /// runs in flight: this process's in the store, though it drives them
    /// not yet (`Daemon::decide`).
    awaiting_place: Arc<Counts>,
    /// The same runs by account: while any wait, starts and sweeps take
    /// no place of the account's (`Daemon::reserve_run`).
    decided_waiting: Arc<Counts>,
    /// The (account, plan hash) pairs whose MCP servers and tools the
    /// account may use under this process's configuration.
    pub(crate) mcp_passed: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Each account's data in the store, against its `stored_bytes`.
    pub(crate) stored: crate::storage::StoredBytes,
    /// Places for deploys compiling or validating at once (see
    /// [`half_the_cores`]).
    pub(crate) compiles: Arc<tokio::sync::Semaphore>,
    /// Each account's deploys under way (`Daemon::count_deploy`).
    deploys_under_way: Arc<Counts>,
}

/// How many deploys compile at once, and how many plans not kept are
/// loaded at once (two at least): half the cores, and at least one. Either
/// takes a core for as long as its plan is large (seconds at the largest);
/// past this they wait their turn rather than take the cores that every
/// account's runs are driven on.
fn half_the_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

/// How often parked runs are looked at for an expired gate: an approval's
/// expiry applies within this much of being due.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

/// How often the runs of processes that are gone are looked for: with the
/// PostgreSQL store's 10 s leases, a dead flowd's runs move again within
/// about 15 s.
const ORPHAN_SWEEP: Duration = Duration::from_secs(5);

/// How long a stored plan that did not load (damaged, or refused by
/// validation) is answered from memory before it is loaded again: the
/// sweeps look for its runs each second, and loading a large plan takes a
/// core for a second. A deploy of the plan forgets the refusal at once;
/// another flowd's deploy to a shared store, within this.
const REFUSED_PLAN_KEPT: Duration = Duration::from_secs(60);

/// How often ended runs past `[limits] retention_days` are deleted, and
/// how many at a time.
const RETENTION_SWEEP: Duration = Duration::from_secs(60);
const RETENTION_BATCH: usize = 500;

/// How long runs in flight get to settle after a shutdown signal.
const SETTLE: Duration = Duration::from_secs(10);

/// The plans kept parsed, as JSON bytes (`plan_cache`): thousands of
/// ordinary plans, or a few dozen of the largest a deploy can bring.
const PLAN_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Largest request body accepted (a `.flow` source or a run's input).
pub(crate) const BODY_LIMIT: usize = 2 * 1024 * 1024;

impl Daemon {
    /// Opens the store and the provider that `config` names.
    pub async fn open(config: Config) -> Result<Arc<Daemon>, String> {
        let StoreLocation(location) = &config.store;
        // The location prints through `StoreLocation`, without a password.
        let cannot_open = |e: StoreError| format!("cannot open the store {}: {e}", config.store);
        let shared = config.store.is_shared();
        let store: Arc<dyn Store> = if shared {
            flow_runtime::postgres::PostgresStore::connect(location)
                .await
                .map_err(cannot_open)?
        } else {
            flow_runtime::sqlite::SqliteStore::open(std::path::Path::new(location))
                .map_err(cannot_open)?
        };
        let deploy_count = match shared {
            true => None,
            false => Some(
                crate::deploy_count::DeployCount::beside(std::path::Path::new(location)).map_err(
                    |error| {
                        format!(
                            "cannot keep the count of deploys beside the store {} ({location}-deploys): {error}",
                            config.store
                        )
                    },
                )?,
            ),
        };
        let provider: Arc<dyn Provider> = match &config.provider {
            None => {
                tracing::warn!(
                    "no [provider] configured; recipes answer with the offline provider's fabricated outputs"
                );
                Arc::new(flow_runtime::offline::OfflineProvider::default())
            }
            Some(provider) => {
                tracing::info!(
                    "model provider: {} at {} ({} model alias(es))",
                    provider.kind,
                    flow_runtime::mcp::masked_url(&provider.base_url),
                    provider.models.len()
                );
                let settings = ProviderConfig {
                    base_url: provider.base_url.clone(),
                    api_key: provider.api_key.as_ref().map(|Secret(key)| key.clone()),
                    models: provider.models.clone(),
                };
                match provider.kind.as_str() {
                    "anthropic" => {
                        Arc::new(flow_runtime::anthropic::AnthropicProvider::new(settings)?)
                    }
                    _ => Arc::new(flow_runtime::openai::OpenAiProvider::new(settings)?),
                }
            }
        };
        if config.metrics_token.is_none() {
            tracing::warn!(
                "/metrics answers anyone, and its labels name every account's workflows: set metrics_token (or FLOWD_METRICS_TOKEN) to require it as a bearer token"
            );
        }
        let keys = config
            .accounts
            .iter()
            .flat_map(|account| {
                let id = || AccountId(account.id.clone());
                let services = account
                    .api_keys
                    .iter()
                    .map(move |Secret(key)| (key_digest(key), (id(), KeyHolder::Service)));
                let people = account.users.iter().flat_map(move |user| {
                    user.api_keys.iter().map(move |Secret(key)| {
                        (
                            key_digest(key),
                            (id(), KeyHolder::Person(user.email.clone())),
                        )
                    })
                });
                services.chain(people)
            })
            .collect();
        let mail = config
            .smtp
            .as_ref()
            .map(crate::mailer::transport)
            .transpose()?;
        let metrics = crate::metrics::Metrics::default();
        let limits = Limits {
            default: config.limits.llm_concurrency,
            accounts: config
                .accounts
                .iter()
                .filter_map(|a| Some((a.id.clone(), a.llm_concurrency?)))
                .collect(),
        };
        let events = Arc::new(metrics.limit_events());
        let mcp = Arc::new(flow_runtime::mcp::McpPool::new(config.mcp.pool_config()));
        let limiter: Arc<dyn Limiter> = match &config.limits.redis_url {
            Some(url) => {
                let mut settings = RedisSettings::new(url);
                settings.prefix = config.limits.redis_prefix.clone();
                let redis = RedisLimiter::new(settings, limits, events)?;
                // Not a reason to refuse to start: calls fail open until it answers.
                if let Err(why) = redis.probe().await {
                    tracing::warn!(
                        "{why}; LLM calls go ahead without the concurrency limit (fail-open, counted) until Redis answers"
                    );
                }
                Arc::new(redis)
            }
            None => Arc::new(LocalLimiter::new(limits, events)),
        };
        let links = crate::links::LinkKeys::new(
            &config.link_secret.0,
            &config
                .previous_link_secrets
                .iter()
                .map(|Secret(secret)| secret.clone())
                .collect::<Vec<_>>(),
        );
        Ok(Arc::new(Daemon {
            step_places: std::sync::Mutex::default(),
            compiles: Arc::new(tokio::sync::Semaphore::new(half_the_cores())),
            deploys_under_way: Arc::default(),
            in_flight: Arc::default(),
            awaiting_place: Arc::default(),
            decided_waiting: Arc::default(),
            mcp_passed: std::sync::Mutex::new(std::collections::HashSet::new()),
            stored: crate::storage::StoredBytes::default(),
            links,
            mail,
            mail_wake: tokio::sync::Notify::new(),
            events_wake: tokio::sync::Notify::new(),
            public_url: std::sync::OnceLock::new(),
            provider_kind: config
                .provider
                .as_ref()
                .map_or("offline".to_string(), |provider| provider.kind.clone()),
            config,
            store,
            provider,
            keys,
            runs: std::sync::Mutex::new(JoinSet::new()),
            driving: std::sync::Mutex::new(HashMap::new()),
            // Two loads at least: a small plan's first start need not wait
            // for a large plan's load to end.
            plans: crate::plan_cache::PlanCache::new(PLAN_CACHE_BYTES, half_the_cores().max(2)),
            refused_plans: std::sync::Mutex::default(),
            deployments: std::sync::Mutex::new(HashMap::new()),
            deploy_count,
            metrics,
            limiter,
            mcp,
            http: reqwest::Client::new(),
        }))
    }

    /// Resumes every run a stopped flowd left unfinished (and parked runs
    /// whose approval expired). Runs whose plan does not load stay as they
    /// are, said in one line per plan; the rest resume without them.
    async fn recover(self: &Arc<Daemon>) -> Result<usize, String> {
        let recovery = flow_runtime::runner::claim_runs_to_recover(
            self.store.as_ref(),
            |account| self.config.serves(account),
            |hash| async move {
                // The process's own work, not an account's.
                self.plan("", &hash).await
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut unloadable: HashMap<&str, (usize, &StoreError)> = HashMap::new();
        for (row, error) in &recovery.unloadable {
            unloadable.entry(&row.plan_hash).or_insert((0, error)).0 += 1;
        }
        for (hash, (runs, error)) in unloadable {
            tracing::warn!("{runs} unfinished run(s) of plan {hash} stay as they are: {error}");
        }
        let resumed = recovery.claimed.len();
        for (row, plan) in recovery.claimed {
            let place = self.count_run(&row.account);
            self.spawn_run(plan, place, row.workflow, row.id, row.input, None);
        }
        Ok(resumed)
    }

    /// Resumes the parked runs whose gate has expired by now, so that its
    /// `on_expire` applies when it is due rather than at the next start.
    async fn resume_expired(self: &Arc<Daemon>) -> Result<(), StoreError> {
        for run in self
            .store
            .expired_gates(flow_runtime::time::now_ms())
            .await?
            .into_iter()
            .filter(|run| self.config.serves(&run.account))
        {
            // The plan first: a run claimed and then not driven would be
            // stranded, owned by a live process, until the next start.
            let Some(plan) = self.plan_to_resume(&run).await else {
                continue;
            };
            // Left parked, to expire on a flowd with its model provider.
            if self.answerable_here(&run.id).await.is_err() {
                continue;
            }
            // Left parked while the account has no room, for a later sweep.
            let Some(place) = self.reserve_run(&run.account) else {
                continue;
            };
            if self
                .store
                .claim_run(&run.id, &[RunStatus::PendingApproval])
                .await?
            {
                self.spawn_run(plan, place, run.workflow, run.id, run.input, None);
            }
        }
        Ok(())
    }

    /// Resumes the runs that no live process holds any more (another flowd
    /// sharing the store died, or lost it for longer than its lease; this
    /// one gave a run up while the store was cut off), so that they go on
    /// here without waiting for a restart. Runs this process drives, or
    /// whose decision waits here for a place, are left alone, and so are
    /// runs begun with a model provider this flowd has none of.
    async fn resume_orphaned(self: &Arc<Daemon>) -> Result<(), StoreError> {
        let mut taken = 0;
        for run in self.store.orphaned_runs().await? {
            // Another account's, or none's: a killed `flow run`'s run in a
            // SQLite file this flowd shares is left to `flow recover`.
            if !self.config.serves(&run.account) {
                continue;
            }
            if self.drives(&run.id) || self.awaiting_place.holds(&run.id) {
                continue;
            }
            // The plan first, as in `resume_expired`.
            let Some(plan) = self.plan_to_resume(&run).await else {
                continue;
            };
            // Left for a flowd with its model provider: taken here, it
            // would be left again at once, sweep after sweep.
            if self.answerable_here(&run.id).await.is_err() {
                continue;
            }
            // Left to another flowd, or a later sweep, while the account
            // has no room here.
            let Some(place) = self.reserve_run(&run.account) else {
                continue;
            };
            if self.store.claim_run(&run.id, &[RunStatus::Running]).await? {
                taken += 1;
                self.spawn_run(plan, place, run.workflow, run.id, run.input, None);
            }
        }
        // One line, not one per run: a takeover can be thousands of runs.
        if taken > 0 {
            tracing::info!("took over {taken} run(s) that no live process drove");
        }
        Ok(())
    }

    /// The plan of `run`, which a sweep resumes; none when it does not
    /// load. The run then stays as it is, for a later sweep: one run's plan
    /// (perhaps another account's) holds back no other run. Why it did not
    /// load was logged when it was loaded ([`Daemon::plan`]).
    async fn plan_to_resume(&self, run: &RunRow) -> Option<Arc<Plan>> {
        match self.plan(&run.account, &run.plan_hash).await {
            Ok(plan) => Some(plan),
            Err(error) => {
                tracing::debug!("run {} waits: its plan does not load: {error}", run.id);
                None
            }
        }
    }

    /// Runs `work` with the store on a blocking thread, where it may wait
    /// for the store's futures: SQLite's store does its work as it is
    /// called, and a plan of tens of megabytes read, parsed or written
    /// takes a tenth of a second to a second, which on the async workers
    /// (one, with SQLite on two cores) every run and request would wait.
    pub(crate) fn with_store_off_worker<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store, &tokio::runtime::Handle) -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        let (store, runtime) = (Arc::clone(&self.store), tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || work(store.as_ref(), &runtime))
    }

    /// The stored plan `hash`, parsed once per process; loading it is
    /// `account`'s, within its places (`plan_cache`). A plan that does not
    /// load is refused again without loading for a while
    /// ([`REFUSED_PLAN_KEPT`]), and logged once for that while.
    pub(crate) async fn plan(&self, account: &str, hash: &str) -> Result<Arc<Plan>, StoreError> {
        // A start of a kept plan (every run start) takes no other lock
        // than the cache's; the refusals are looked at only when the plan
        // is not kept, and before any place for a load: a plan refused is
        // answered at once, not behind its account's loads.
        if let Some(plan) = self.plans.get(hash) {
            return Ok(plan);
        }
        if let Some(error) = self.refusal_of_plan(hash) {
            return Err(error);
        }
        // Read, parsed, validated and weighed off the async workers
        // (`with_store_off_worker`), once for every start that wants it
        // (`plan_cache`).
        let load = async {
            // Those who waited for a load that was refused find the
            // refusal here, and do not parse the plan again.
            if let Some(error) = self.refusal_of_plan(hash) {
                return Err(error);
            }
            let owned = hash.to_string();
            let loaded = self.with_store_off_worker(move |store, runtime| {
                let plan = runtime.block_on(store.plan(&owned))?;
                // A plan stored before flowd checked deployed plans (or
                // written to the store by hand) is held to the same bounds
                // as a deploy: past them it could exhaust this process for
                // every account. What would only fail a run at a step is
                // left to that step, for the runs parked before it.
                if let Err(problems) = plan.validate_stored() {
                    let first = problems
                        .problems
                        .first()
                        .map_or_else(String::new, ToString::to_string);
                    return Err(StoreError::Damaged(format!(
                        "the stored plan {owned} is not one flowc could have built (first of {} problem(s): {first}); deploy this version again",
                        problems.problems.len()
                    )));
                }
                let weight = crate::plan_cache::weight(&plan);
                Ok((Arc::new(plan), weight))
            })
            .await
            .map_err(|error| {
                StoreError::Database(format!("loading plan {hash} stopped: {error}"))
            })?;
            // Kept only when loading again would fail again, and cost a
            // parse: not a store that failed for a moment (`Database`,
            // `WriterStopped`), nor a plan missing, which a query answers
            // and which another flowd sharing the store may be storing now.
            // Stamped here, on a fresh failure only: a refusal answered
            // from memory above does not lengthen its own while.
            if let Err(error @ StoreError::Damaged(_)) = &loaded {
                tracing::warn!(
                    "plan {hash} does not load, and its runs cannot start or go on until it is deployed again: {error}"
                );
                self.refused_plans
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(hash.to_string(), (std::time::Instant::now(), error.clone()));
            }
            loaded
        };
        self.plans.get_or_load(account, hash, load).await
    }

    /// Why the plan `hash` was refused, if it was within
    /// [`REFUSED_PLAN_KEPT`]; a refusal older than that is forgotten.
    fn refusal_of_plan(&self, hash: &str) -> Option<StoreError> {
        let mut refused = self.refused_plans.lock().unwrap_or_else(|p| p.into_inner());
        let (since, error) = refused.get(hash)?;
        if since.elapsed() < REFUSED_PLAN_KEPT {
            return Some(error.clone());
        }
        refused.remove(hash);
        None
    }

    /// Forgets that the plan `hash` was refused: it was stored again.
    pub(crate) fn forget_refusal_of_plan(&self, hash: &str) {
        self.refused_plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(hash);
    }

    /// Where links to this flowd point, without a trailing slash.
    pub fn public_url(&self) -> &str {
        self.public_url.get().map_or(
            self.config.public_url.as_deref().unwrap_or_default(),
            |url| url,
        )
    }

    /// The account's deployments, by workflow then version: cached while
    /// no flowd on this SQLite file has deployed since they were read.
    pub(crate) async fn deployments(
        &self,
        account: &str,
    ) -> Result<Arc<Vec<Deployment>>, StoreError> {
        let Some(count) = self.deploy_count.as_ref().and_then(|count| count.now()) else {
            return Ok(Arc::new(self.store.deployments(account).await?));
        };
        let cached = self
            .deployments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(account)
            .filter(|(read_at, _)| *read_at == count)
            .map(|(_, deployments)| Arc::clone(deployments));
        if let Some(deployments) = cached {
            return Ok(deployments);
        }
        // Counted before the read: a deploy that commits meanwhile moves
        // the count past this entry's.
        let deployments = Arc::new(self.store.deployments(account).await?);
        self.deployments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(account.to_string(), (count, Arc::clone(&deployments)));
        Ok(deployments)
    }

    /// The deployment a start of `workflow` runs: `version` if one is
    /// named, else the latest. From the cache where flowd keeps one; else
    /// one row read, not the account's whole list.
    pub(crate) async fn deployment(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<Option<Deployment>, StoreError> {
        if self.deploy_count.is_none() {
            return self.store.deployment(account, workflow, version).await;
        }
        Ok(self
            .deployments(account)
            .await?
            .iter()
            .filter(|d| d.workflow == workflow)
            .filter(|d| version.is_none_or(|v| v == d.version))
            .max_by_key(|d| d.version)
            .cloned())
    }

    /// Deploys `workflow` of the stored plan `plan_hash` for `account`, and
    /// counts it before it is answered (`deploy_count`), in a task of its
    /// own: a client that hangs up between the commit and the count must
    /// not leave the other flowds' caches behind the store.
    pub(crate) async fn deploy(
        self: &Arc<Daemon>,
        account: &str,
        workflow: &str,
        plan_hash: &str,
    ) -> Result<Deployment, StoreError> {
        let daemon = Arc::clone(self);
        let (account, workflow, plan_hash) = (
            account.to_string(),
            workflow.to_string(),
            plan_hash.to_string(),
        );
        let task = tokio::spawn(async move {
            let deployed = daemon.store.deploy(&account, &workflow, &plan_hash).await;
            daemon.count_deploy_done();
            deployed
        });
        task.await
            .map_err(|e| StoreError::Database(format!("the deploy's task stopped: {e}")))?
    }

    /// Retires `account`'s deployments of `workflow` (`Store::undeploy`),
    /// counted as a deploy.
    pub(crate) async fn undeploy(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<usize, StoreError> {
        let retired = self.store.undeploy(account, workflow, version).await;
        self.count_deploy_done();
        retired
    }

    fn count_deploy_done(&self) {
        if let Some(count) = &self.deploy_count {
            count.count();
        }
    }
}

/// An account's deployments and the count of deploys they were read at.
type CountedDeployments = (crate::deploy_count::Stamp, Arc<Vec<Deployment>>);

/// Serves until `shutdown` completes, then lets runs in flight settle.
/// `ready` gets the bound address (the configured port may be 0).
pub async fn serve(
    daemon: Arc<Daemon>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(daemon.config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", daemon.config.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let public_url = daemon
        .config
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{address}"));
    let _ = daemon.public_url.set(public_url);
    // Events are kept for every account, before any run of theirs moves:
    // an account without endpoints may deploy a workflow with destinations
    // (`deliver`), which ride the same outbox; only those runs' events are
    // kept for it.
    let accounts: Vec<(String, EventsOf)> = daemon
        .config
        .accounts
        .iter()
        .map(|account| (account.id.clone(), account.events_of()))
        .collect();
    daemon
        .store
        .keep_events_of(&accounts)
        .await
        .map_err(|e| format!("cannot prepare the webhook outbox: {e}"))?;
    let resumed = daemon.recover().await?;
    // The deliverers stop at a shutdown between deliveries, not in one:
    // aborted after an endpoint or a mail server took a message and before
    // that was recorded, they sent it again on the next start.
    let (stop_delivering, stopping) = tokio::sync::watch::channel(false);
    let mailer = tokio::spawn(crate::mailer::run(Arc::clone(&daemon), stopping.clone()));
    let webhooks = tokio::spawn(crate::webhooks::run(Arc::clone(&daemon), stopping));
    let expiry = {
        let daemon = Arc::clone(&daemon);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EXPIRY_SWEEP).await;
                if let Err(error) = daemon.resume_expired().await {
                    tracing::error!("cannot look for expired approvals: {error}");
                }
            }
        })
    };
    let orphans = {
        let daemon = Arc::clone(&daemon);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ORPHAN_SWEEP).await;
                if let Err(error) = daemon.resume_orphaned().await {
                    tracing::error!("cannot look for runs left by other processes: {error}");
                }
            }
        })
    };
    let measuring = {
        let daemon = Arc::clone(&daemon);
        tokio::spawn(async move {
            loop {
                daemon.stored.measure_all(&daemon).await;
                tokio::time::sleep(crate::storage::MEASURE_EVERY).await;
            }
        })
    };
    let retention = daemon.config.limits.retention_days.map(|days| {
        let daemon = Arc::clone(&daemon);
        tokio::spawn(async move {
            let keep_ms = i64::from(days) * 24 * 3600 * 1000;
            loop {
                tokio::time::sleep(RETENTION_SWEEP).await;
                let before =
                    i64::try_from(flow_runtime::time::now_ms()).unwrap_or(i64::MAX) - keep_ms;
                // A batch at a time, so that a store with a large backlog is
                // not held by one long transaction.
                loop {
                    match daemon
                        .store
                        .delete_ended_runs(before, RETENTION_BATCH)
                        .await
                    {
                        Ok(RETENTION_BATCH) => continue,
                        Ok(_) => break,
                        Err(error) => {
                            tracing::error!("cannot delete runs past their retention: {error}");
                            break;
                        }
                    }
                }
            }
        })
    });
    if resumed > 0 {
        tracing::info!("resumed {resumed} unfinished run(s)");
    }
    ready(address);
    crate::connections::serve(listener, router(Arc::clone(&daemon)), shutdown).await;
    let _ = stop_delivering.send(true);
    // Waited for once aborted: a sweep in the middle of a claim would
    // otherwise take a run after the runs are released below, and hold it
    // undriven until its lease ran out.
    for sweep in [Some(expiry), Some(orphans), Some(measuring), retention]
        .into_iter()
        .flatten()
    {
        sweep.abort();
        let _ = sweep.await;
    }
    // The runs finish the steps they are in and start no other: every
    // account's places for steps are closed, those steps leave them, and
    // their next steps wait for the next start or for another flowd
    // sharing the store, which then runs no step twice. A step still going
    // after the grace period is dropped mid-step (at least once: it runs
    // again there). Deliveries still out then are made again on the next
    // start, under the same message id (at least once, as the outbox
    // promises).
    let mut runs = std::mem::take(&mut *daemon.runs.lock().unwrap_or_else(|p| p.into_inner()));
    // The tasks of runs that ended are still in the set until reaped; the
    // count below said "1 run(s) in flight" with none running.
    while runs.try_join_next().is_some() {}
    // Said, so that an operator waiting on a stop knows what for.
    tracing::info!(
        "stopping: {} run(s) in flight get up to {SETTLE:?} to finish the steps they are in",
        runs.len()
    );
    let between_steps = daemon.close_step_places();
    let settle = async {
        tokio::select! {
            () = async { while runs.join_next().await.is_some() {} } => {}
            () = between_steps => {}
        }
    };
    let (aborts, delivered) = (mailer.abort_handle(), webhooks.abort_handle());
    let deliveries = async {
        let _ = tokio::join!(mailer, webhooks);
    };
    if tokio::time::timeout(SETTLE, async { tokio::join!(settle, deliveries) })
        .await
        .is_err()
    {
        aborts.abort();
        delivered.abort();
        if !runs.is_empty() {
            tracing::warn!(
                "{} run(s) still in a step after {SETTLE:?}: the step runs again when the run resumes, on the next start or on another flowd sharing the store",
                runs.len()
            );
        }
    }
    // Stopped, and then given up in the store: another process sharing it
    // takes them at its next sweep instead of once their leases run out.
    runs.shutdown().await;
    match daemon.store.release_runs().await {
        Ok(()) => {}
        Err(error) => tracing::warn!(
            "cannot give up the runs still in flight ({error}); another process takes them once their leases run out"
        ),
    }
    // MCP: the servers the runs used are closed with flowd.
    daemon.mcp.shutdown().await;
    Ok(())
}
