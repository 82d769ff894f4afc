//! `flowd serve`: the store opened, unfinished runs resumed, the HTTP API
//! served until a shutdown signal, then the runs in flight given time to
//! settle (whatever does not settle is in the journal and resumes on the
//! next start).

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
use flow_runtime::services::Provider;
use flow_runtime::store::{Deployment, EventsOf, RunRow, RunStatus, Store, StoreError};
use serde_json::json;
use tokio::task::JoinSet;

use crate::config::{Config, Secret, StoreLocation};

/// What every request handler shares.
pub struct Daemon {
    pub config: Config,
    pub store: Arc<dyn Store>,
    pub provider: Arc<dyn Provider>,
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
    /// Each account's deployments, read once and dropped when the account
    /// deploys: every run start looks them up. Only when this flowd is the
    /// only writer of deployments to its store (SQLite): flowds sharing a
    /// PostgreSQL database deploy behind each other's backs, so there each
    /// start reads the deployments.
    deployments: std::sync::Mutex<HashMap<String, Arc<Vec<Deployment>>>>,
    /// Whether `deployments` is used (see there).
    cache_deployments: bool,
    /// Counts deploys, so that a list read before one is not cached after it.
    deploys: std::sync::atomic::AtomicU64,
    /// How to stop each run this process is driving (a cancel request).
    driving: std::sync::Mutex<HashMap<String, tokio::task::AbortHandle>>,
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
    step_places: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Each account's runs this process drives now (`Quotas`).
    in_flight: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    /// The (account, plan hash) pairs whose MCP servers and tools the
    /// account may use under this process's configuration.
    pub(crate) mcp_passed: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Each account's data in the store, against its `stored_bytes`.
    pub(crate) stored: crate::storage::StoredBytes,
}

/// The account a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountId(pub String);

/// Whom a request's API key belongs to, within its account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyHolder {
    /// An account-wide key: a service, which names the person it acts for.
    Service,
    /// A user's key (`[[accounts.users]]`): it acts as that person only.
    Person(String),
}

impl KeyHolder {
    /// The person a request acts as: the key's own person, or the one a
    /// service names in `field`. A user's key naming someone else is
    /// refused: a decision through it is its person's and nobody else's.
    pub(crate) fn acting_as(&self, named: Option<String>, field: &str) -> Result<String, Problem> {
        match (self, named) {
            (KeyHolder::Person(person), None) => Ok(person.clone()),
            (KeyHolder::Person(person), Some(named)) if named.eq_ignore_ascii_case(person) => {
                Ok(person.clone())
            }
            (KeyHolder::Person(person), Some(named)) => Err(Problem::new(
                StatusCode::FORBIDDEN,
                "not_this_person",
                &format!(
                    "this API key is {person}'s: it acts as them, not as `{named}` (leave out `{field}`)"
                ),
            )),
            (KeyHolder::Service, Some(named)) => Ok(named),
            (KeyHolder::Service, None) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "no_person",
                &format!(
                    "name the person in `{field}`: this API key is the account's, not a person's"
                ),
            )),
        }
    }
}

/// How often parked runs are looked at for an expired gate: an approval's
/// expiry applies within this much of being due.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

/// How often the runs of processes that are gone are looked for: with the
/// PostgreSQL store's 10 s leases, a dead flowd's runs move again within
/// about 15 s.
const ORPHAN_SWEEP: Duration = Duration::from_secs(5);

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
const BODY_LIMIT: usize = 2 * 1024 * 1024;

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
            step_places: std::sync::Mutex::new(HashMap::new()),
            in_flight: Arc::default(),
            mcp_passed: std::sync::Mutex::new(std::collections::HashSet::new()),
            stored: crate::storage::StoredBytes::default(),
            links,
            mail,
            mail_wake: tokio::sync::Notify::new(),
            events_wake: tokio::sync::Notify::new(),
            public_url: std::sync::OnceLock::new(),
            config,
            store,
            provider,
            keys,
            runs: std::sync::Mutex::new(JoinSet::new()),
            driving: std::sync::Mutex::new(HashMap::new()),
            plans: crate::plan_cache::PlanCache::new(PLAN_CACHE_BYTES),
            deployments: std::sync::Mutex::new(HashMap::new()),
            cache_deployments: !shared,
            deploys: std::sync::atomic::AtomicU64::new(0),
            metrics,
            limiter,
            mcp,
            http: reqwest::Client::new(),
        }))
    }

    /// Resumes every run a stopped flowd left unfinished (and parked runs
    /// whose approval expired).
    async fn recover(self: &Arc<Daemon>) -> Result<usize, String> {
        let due = flow_runtime::runner::claim_runs_to_recover(self.store.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        let resumed = due.len();
        for (row, plan) in due {
            self.spawn_run(
                Arc::new(plan),
                row.account,
                row.workflow,
                row.id,
                row.input,
                false,
            );
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
        {
            // The plan first: a run claimed and then not driven would be
            // stranded, owned by a live process, until the next start.
            let plan = self.plan(&run.plan_hash).await?;
            if self
                .store
                .claim_run(&run.id, &[RunStatus::PendingApproval])
                .await?
            {
                self.spawn_run(plan, run.account, run.workflow, run.id, run.input, false);
            }
        }
        Ok(())
    }

    /// Resumes the runs that no live process holds any more (another flowd
    /// sharing the store died, or lost it for longer than its lease), so
    /// that they go on here without waiting for a restart. Runs this
    /// process drives are left alone.
    async fn resume_orphaned(self: &Arc<Daemon>) -> Result<(), StoreError> {
        let mut taken = 0;
        for run in self.store.orphaned_runs().await? {
            let driven_here = self
                .driving
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&run.id);
            if driven_here {
                continue;
            }
            // The plan first, as in `resume_expired`.
            let plan = self.plan(&run.plan_hash).await?;
            if self.store.claim_run(&run.id, &[RunStatus::Running]).await? {
                taken += 1;
                self.spawn_run(plan, run.account, run.workflow, run.id, run.input, false);
            }
        }
        // One line, not one per run: a takeover can be thousands of runs.
        if taken > 0 {
            tracing::info!("took over {taken} run(s) from processes that are gone");
        }
        Ok(())
    }

    /// The stored plan `hash`, parsed once per process.
    pub(crate) async fn plan(&self, hash: &str) -> Result<Arc<Plan>, StoreError> {
        if let Some(plan) = self.plans.get(hash) {
            return Ok(plan);
        }
        let plan = self.store.plan(hash).await?;
        // A plan stored before flowd checked deployed plans (or written to
        // the store by hand) is held to the same bounds as a deploy: past
        // them it could exhaust this process for every account.
        if let Err(problems) = plan.validate() {
            tracing::warn!("stored plan {hash} refused: {problems}");
            let first = problems
                .problems
                .first()
                .map_or_else(String::new, ToString::to_string);
            return Err(StoreError::Damaged(format!(
                "the stored plan {hash} is not one flowc could have built (first of {} problem(s): {first}); deploy this version again",
                problems.problems.len()
            )));
        }
        let plan = Arc::new(plan);
        self.plans.insert(hash, Arc::clone(&plan));
        Ok(plan)
    }

    /// Decides the approval at `path` of `run`, then continues the run here
    /// unless a live process is executing it (that one picks the decision up
    /// when it parks). Done in a task of its own: a client that hangs up
    /// cannot strand a decided run.
    pub(crate) async fn decide(
        self: &Arc<Daemon>,
        run: RunRow,
        path: String,
        decision: Decision,
    ) -> Result<(), Problem> {
        // A group decides through its members: its name is no person.
        if let Some(members) = self
            .config
            .people(&run.account)
            .approver_groups
            .get(&decision.approver)
        {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "not_an_approver",
                &format!(
                    "`{}` is an approver group, not a person: one of its members decides ({})",
                    decision.approver,
                    members.join(", ")
                ),
            ));
        }
        let daemon = Arc::clone(self);
        let decided = tokio::spawn(async move {
            daemon
                .store
                .decide(&run.id, &path, &decision)
                .await
                .map_err(store_problem)?
                .map_err(|refused| refusal(&refused))?;
            // A decided gate's record is the store's, not an invocation's:
            // its span goes now.
            daemon.export_decision(&run, &path).await;
            // The plan before the claim, as in `resume_expired`.
            let plan = daemon.plan(&run.plan_hash).await.map_err(store_problem)?;
            if daemon
                .store
                .claim_run(&run.id, &[RunStatus::PendingApproval])
                .await
                .map_err(store_problem)?
            {
                daemon.spawn_run(plan, run.account, run.workflow, run.id, run.input, false);
            }
            Ok(())
        });
        joined(decided).await
    }

    /// Where links to this flowd point, without a trailing slash.
    pub fn public_url(&self) -> &str {
        self.public_url.get().map_or(
            self.config.public_url.as_deref().unwrap_or_default(),
            |url| url,
        )
    }

    /// Exports the spans of an invocation's steps, and the run's own span
    /// once it has ended, when an OTLP endpoint is configured.
    async fn export_trace(
        &self,
        plan_hash: &str,
        workflow: &str,
        run_id: &str,
        outcome: &Outcome,
        steps: Vec<StepRecord>,
    ) {
        let Some(endpoint) = &self.config.otlp_endpoint else {
            return;
        };
        let run = crate::traces::RunContext {
            run_id,
            workflow,
            plan_hash,
        };
        let mut spans: Vec<_> = steps.iter().map(|record| run.step_span(record)).collect();
        let failure = match outcome {
            Outcome::Parked { .. } => None,
            Outcome::Completed { .. } => Some(None),
            Outcome::Failed { error, .. } => Some(Some(error.message.as_str())),
        };
        if let Some(failure) = failure
            && let Ok(Some(row)) = self.store.run(run_id).await
        {
            if let Ok(records) = self.store.step_records(run_id).await {
                spans.extend(run.container_spans(&records));
            }
            spans.push(run.run_span(row.created_ms, row.updated_ms, failure));
        }
        crate::traces::export(&self.http, endpoint, spans, self.metrics.export_counter());
    }

    /// Exports the span of the gate at `path` of `run`, just decided.
    async fn export_decision(&self, run: &RunRow, path: &str) {
        let Some(endpoint) = &self.config.otlp_endpoint else {
            return;
        };
        let Ok(records) = self.store.step_records(&run.id).await else {
            return;
        };
        let context = crate::traces::RunContext {
            run_id: &run.id,
            workflow: &run.workflow,
            plan_hash: &run.plan_hash,
        };
        let spans = records
            .iter()
            .filter(|record| record.path == path)
            .map(|record| context.step_span(record))
            .collect();
        crate::traces::export(&self.http, endpoint, spans, self.metrics.export_counter());
    }

    /// The account's deployments, by workflow then version.
    pub(crate) async fn deployments(
        &self,
        account: &str,
    ) -> Result<Arc<Vec<Deployment>>, StoreError> {
        let cached = self
            .deployments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(account)
            .cloned();
        if let Some(deployments) = cached {
            return Ok(deployments);
        }
        if !self.cache_deployments {
            return Ok(Arc::new(self.store.deployments(account).await?));
        }
        let before = self.deploys.load(std::sync::atomic::Ordering::SeqCst);
        let deployments = Arc::new(self.store.deployments(account).await?);
        let mut cache = self.deployments.lock().unwrap_or_else(|p| p.into_inner());
        if self.deploys.load(std::sync::atomic::Ordering::SeqCst) == before {
            cache.insert(account.to_string(), Arc::clone(&deployments));
        }
        Ok(deployments)
    }

    /// Deploys `workflow` of the stored plan `plan_hash` for `account`, in a
    /// task of its own: a client that hangs up between the write and the
    /// cache's update must not leave the cache behind the store.
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
            // Under the lock: a list read before this deploy is not cached
            // once the count has moved.
            let mut cache = daemon.deployments.lock().unwrap_or_else(|p| p.into_inner());
            daemon
                .deploys
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            cache.remove(&account);
            deployed
        });
        task.await
            .map_err(|e| StoreError::Database(format!("the deploy's task stopped: {e}")))?
    }

    /// Retires `account`'s deployments of `workflow` (`Store::undeploy`)
    /// and forgets the account's cached list.
    pub(crate) async fn undeploy(
        &self,
        account: &str,
        workflow: &str,
        version: Option<u32>,
    ) -> Result<usize, StoreError> {
        let retired = self.store.undeploy(account, workflow, version).await;
        let mut cache = self.deployments.lock().unwrap_or_else(|p| p.into_inner());
        self.deploys
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        cache.remove(account);
        retired
    }

    /// `account`'s places for steps executing at once.
    fn step_places(&self, account: &str) -> Arc<tokio::sync::Semaphore> {
        let mut places = self.step_places.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(places.entry(account.to_string()).or_insert_with(|| {
            Arc::new(tokio::sync::Semaphore::new(
                self.config.quotas(account).steps_in_flight,
            ))
        }))
    }

    /// How many of `account`'s runs this process drives now.
    pub(crate) fn runs_in_flight(&self, account: &str) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(account)
            .copied()
            .unwrap_or(0)
    }

    /// Stops driving run `id` here, if this process is (a cancelled run).
    pub(crate) fn stop_driving(&self, id: &str) {
        let handle = self
            .driving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(handle) = handle {
            handle.abort();
        }
    }

    /// Drives a run this process has created (`created`: just now, so
    /// nothing of it is read back) or claimed, in the background.
    pub(crate) fn spawn_run(
        self: &Arc<Daemon>,
        plan: Arc<Plan>,
        account: String,
        workflow: String,
        run_id: String,
        input: serde_json::Value,
        created: bool,
    ) {
        let daemon = Arc::clone(self);
        // Counted from now until the task ends, aborted or not.
        let counted = InFlight::count(&self.in_flight, &account);
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        // Finished runs leave their results in the set until collected.
        while runs.try_join_next().is_some() {}
        let id = run_id.clone();
        // Held until the handle is in: a run that ends at once removes its
        // entry only after it was added.
        let mut driving = self.driving.lock().unwrap_or_else(|p| p.into_inner());
        let handle = runs.spawn(async move {
            let _counted = counted;
            // A cancel that came between the claim and this task found
            // nothing to stop: the run is not driven if it is no longer
            // running. (A run created just now is in `driving` before
            // anyone knows its id.)
            let cancelled = !created
                && !matches!(
                    daemon.store.run(&run_id).await,
                    Ok(Some(row)) if row.status == RunStatus::Running
                );
            'drive: {
                if cancelled {
                    break 'drive;
                }
                let started = std::time::Instant::now();
                // Metrics of each step; a handoff has something to mail at once;
                // the steps of this invocation are its trace spans.
                let traced: Arc<std::sync::Mutex<Vec<StepRecord>>> = Arc::default();
                let observer: Observer = {
                    let (metrics, daemon) = (daemon.metrics.observer(&account), Arc::clone(&daemon));
                    let traced = Arc::clone(&traced);
                    let tracing = daemon.config.otlp_endpoint.is_some();
                    Arc::new(move |record: &StepRecord| {
                        metrics(record);
                        if record.kind == StepKind::Handoff {
                            daemon.mail_wake.notify_one();
                        }
                        if tracing && !record.status.is_replaceable() {
                            // A span needs the record's shape, not its data:
                            // inputs and outputs are not kept for it.
                            let mut kept = record.clone();
                            kept.input = serde_json::Value::Null;
                            kept.output = None;
                            traced.lock().unwrap_or_else(|p| p.into_inner()).push(kept);
                        }
                    })
                };
                // The account's MCP servers only, on this run's connections.
                let mcp: Arc<dyn flow_runtime::services::McpClient> = Arc::new(
                    crate::tenant_mcp::TenantMcp::new(Arc::clone(&daemon), &account, &run_id),
                );
                let steps = daemon.step_places(&account);
                // Each LLM call takes a permit of the run's account first.
                let provider: Arc<dyn Provider> = Arc::new(LimitedProvider {
                    inner: Arc::new(crate::tenant_provider::TenantProvider {
                        inner: Arc::clone(&daemon.provider),
                    }),
                    limiter: Arc::clone(&daemon.limiter),
                    account: account.clone(),
                });
                let invocation = match created {
                    true => Invocation::Created {
                        account: account.clone(),
                    },
                    false => Invocation::Resume,
                };
                let driven = flow_runtime::runner::drive(
                    &daemon.store,
                    &plan,
                    &workflow,
                    &run_id,
                    invocation,
                    input,
                    provider,
                    Some(mcp),
                    Some(observer),
                    Some(steps),
                )
                .await;
                match driven {
                    Ok(outcome) => {
                        daemon.metrics.run_ended(
                            &account,
                            &workflow,
                            RunStatus::of(&outcome),
                            started.elapsed(),
                        );
                        // The store noted each gate's approvers with the gate
                        // itself; they are mailed now.
                        if let Outcome::Parked { .. } = &outcome {
                            daemon.mail_wake.notify_one();
                        }
                        let steps =
                            std::mem::take(&mut *traced.lock().unwrap_or_else(|p| p.into_inner()));
                        daemon
                            .export_trace(&plan.hash, &workflow, &run_id, &outcome, steps)
                            .await;
                        // The store kept the run's event with its status,
                        // if anyone takes it (`EventsOf`); a wake-up for
                        // nothing costs the deliverer's claim, a write.
                        if plan.delivers()
                            || daemon.config.people(&account).events_of() == EventsOf::EveryRun
                        {
                            daemon.events_wake.notify_one();
                        }
                    }
                    // Another process has the run now (this one was paused
                    // or cut off past its lease), or it was cancelled:
                    // nothing of this invocation was kept, nothing to undo.
                    Err(flow_runtime::runner::DriveError::Lost) => {
                        tracing::info!(
                            run = %run_id,
                            "the run passed to another process or was cancelled; this process dropped it"
                        );
                    }
                    Err(error) => {
                        tracing::error!(run = %run_id, "the run stopped: {error}");
                        // Give the run up, still `running`: the next start
                        // resumes it rather than leaving it owned by a live
                        // process that no longer drives it.
                        let _ = daemon
                            .store
                            .finish_run(
                                &run_id,
                                RunStatus::Running,
                                &serde_json::Value::Null,
                                Duration::ZERO,
                            )
                            .await;
                    }
                }
            }
            // Only this task's entry: a decision may have started a new one.
            let mut driving = daemon.driving.lock().unwrap_or_else(|p| p.into_inner());
            if driving
                .get(&run_id)
                .is_some_and(|handle| handle.id() == tokio::task::id())
            {
                driving.remove(&run_id);
            }
        });
        driving.insert(id, handle);
    }
}

/// One run counted among its account's runs in flight while it lives.
struct InFlight {
    counts: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    account: String,
}

impl InFlight {
    fn count(counts: &Arc<std::sync::Mutex<HashMap<String, usize>>>, account: &str) -> InFlight {
        *counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(account.to_string())
            .or_default() += 1;
        InFlight {
            counts: Arc::clone(counts),
            account: account.to_string(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.account) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.account);
            }
        }
    }
}

/// `/metrics` for Prometheus, then the API's routes, every one behind
/// API-key authentication.
pub fn router(daemon: Arc<Daemon>) -> Router {
    let metrics = Router::new().route(
        "/metrics",
        axum::routing::get(
            |State(daemon): State<Arc<Daemon>>, headers: axum::http::HeaderMap| async move {
                if let Some(Secret(token)) = &daemon.config.metrics_token {
                    let sent = bearer_token(&headers);
                    // Compared in constant time, as a MAC is.
                    if !sent.is_some_and(|sent| same_secret(sent, token)) {
                        return problem(
                            StatusCode::UNAUTHORIZED,
                            "unauthenticated",
                            "/metrics needs `Authorization: Bearer` with the metrics_token",
                        );
                    }
                }
                // The store is the truth of what waits: a restart or another
                // process deciding keeps it right, as a counter here would not.
                match daemon.store.pending_approvals().await {
                    Ok(counts) => daemon.metrics.set_pending_approvals(&counts),
                    Err(error) => {
                        tracing::error!("metrics: cannot count pending approvals: {error}")
                    }
                }
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    daemon.metrics.encode(),
                )
                    .into_response()
            },
        ),
    );
    let api = Router::new()
        .route(
            "/v1/workflows",
            axum::routing::post(crate::api::deploy).get(crate::api::workflows),
        )
        .route(
            "/v1/workflows/{workflow}",
            axum::routing::delete(crate::api::undeploy),
        )
        .route(
            "/v1/workflows/{workflow}/migrate",
            axum::routing::post(crate::migrate::migrate),
        )
        .route(
            "/v1/kb/documents",
            axum::routing::delete(crate::api::delete_document),
        )
        .route(
            "/v1/runs",
            axum::routing::post(crate::api::start_run).get(crate::api::runs),
        )
        .route("/v1/runs/{id}/trace", axum::routing::get(crate::api::trace))
        .route("/v1/runs/{id}/graph", axum::routing::get(crate::api::graph))
        .route(
            "/v1/runs/{id}/test",
            axum::routing::get(crate::api::test_from),
        )
        .route(
            "/v1/runs/{id}/cancel",
            axum::routing::post(crate::api::cancel),
        )
        .route(
            "/v1/runs/{id}/redrive",
            axum::routing::post(crate::api::redrive),
        )
        .route(
            "/v1/runs/{id}",
            axum::routing::get(crate::api::get_run).delete(crate::api::delete_run),
        )
        .route(
            "/v1/runs/{id}/approvals/{*step_path}",
            axum::routing::post(crate::api::decide),
        )
        .route(
            "/v1/approvals",
            axum::routing::get(crate::api::my_approvals),
        )
        .route(
            "/v1/notifications",
            axum::routing::get(crate::api::notifications),
        )
        .route(
            "/v1/notifications/read",
            axum::routing::post(crate::api::mark_read),
        )
        .fallback(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; the API is under /v1 (see /v1/openapi.json)",
            )
        })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&daemon),
            authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT));
    // The API's description is public, like the API's existence.
    let openapi = Router::new().route(
        "/v1/openapi.json",
        axum::routing::get(|| async {
            axum::Json(<crate::api::ApiDoc as utoipa::OpenApi>::openapi())
        }),
    );
    // An approval link's token is its credential: no API key.
    let links = Router::new().route(
        "/approvals/{token}",
        axum::routing::get(crate::pages::show).post(crate::pages::confirm),
    );
    // The inspector's files hold no data: no API key (the page sends one).
    metrics
        .merge(openapi)
        .merge(links)
        .merge(crate::inspector::routes())
        .merge(api)
        .layer(middleware::map_response(plain_errors_as_problems))
        .layer(middleware::from_fn(refuse_nul_in_uri))
        .with_state(daemon)
}

/// Refuses a path or query that holds a NUL byte (`%00`): no id, name or
/// key of flow has one, and PostgreSQL cannot even compare one, so both
/// stores answer the same 400 instead of a 404 on one and a 503 on the
/// other.
async fn refuse_nul_in_uri(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let raw = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    if raw.to_ascii_lowercase().contains("%00") {
        return problem(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "a path or query cannot hold a NUL byte (%00)",
        );
    }
    next.run(request).await
}

/// Errors that axum answers itself come as plain text or nothing: a method
/// a route does not have (405), a body over the limit (413), a form of
/// another media type (415), a path that does not decode (`%ff`, 400).
/// They become problems like every other error, keeping their status and
/// their `Allow` header; pages that answer HTML keep their own.
async fn plain_errors_as_problems(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let plain = match response.headers().get(header::CONTENT_TYPE) {
        None => true,
        Some(kind) => kind
            .to_str()
            .is_ok_and(|kind| kind.starts_with("text/plain")),
    };
    if !plain {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let said = axum::body::to_bytes(response.into_body(), 2048)
        .await
        .map(|text| String::from_utf8_lossy(&text).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::NOT_FOUND => "not_found",
        status if status.is_client_error() => "bad_request",
        _ => "internal_error",
    };
    let detail = if said.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        said
    };
    let mut answer = problem(status, code, &detail);
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

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
    let mailer = tokio::spawn(crate::mailer::run(Arc::clone(&daemon)));
    let webhooks = tokio::spawn(crate::webhooks::run(Arc::clone(&daemon)));
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
    mailer.abort();
    webhooks.abort();
    expiry.abort();
    orphans.abort();
    measuring.abort();
    if let Some(retention) = retention {
        retention.abort();
    }
    // Runs still going after the grace period are dropped mid-step: their
    // journals hold every completed step, and the next start resumes them.
    let mut runs = std::mem::take(&mut *daemon.runs.lock().unwrap_or_else(|p| p.into_inner()));
    let settle = async { while runs.join_next().await.is_some() {} };
    if tokio::time::timeout(SETTLE, settle).await.is_err() {
        tracing::warn!(
            "{} run(s) still in flight after {SETTLE:?}; they resume on the next start",
            runs.len()
        );
    }
    // MCP: the servers the runs used are closed with flowd.
    daemon.mcp.shutdown().await;
    Ok(())
}

/// The credentials of `Authorization: Bearer TOKEN`. The scheme's name is
/// case-insensitive (RFC 9110, section 11.1), so `bearer` and `BEARER` are
/// the same scheme; spaces around the token are not part of it.
fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Finds the request's account from `Authorization: Bearer KEY`.
async fn authenticate(
    State(daemon): State<Arc<Daemon>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(key) = bearer_token(request.headers()) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send an API key as `Authorization: Bearer KEY`",
        );
    };
    let Some((account, holder)) = daemon.keys.get(&key_digest(key)) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "this API key belongs to no account",
        );
    };
    request.extensions_mut().insert(account.clone());
    request.extensions_mut().insert(holder.clone());
    next.run(request).await
}

/// An error answer: a JSON problem object (RFC 9457) with a stable `code`,
/// and whatever fields say more (`diagnostics`, `mismatches`).
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    body: serde_json::Value,
    /// Seconds for a `Retry-After` header (a 429).
    retry_after: Option<u32>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &str, detail: &str) -> Problem {
        Problem {
            status,
            body: json!({
                "type": format!("https://flow.dev/problems/{code}"),
                "title": status.canonical_reason().unwrap_or("error"),
                "status": status.as_u16(),
                "code": code,
                "detail": detail,
            }),
            retry_after: None,
        }
    }

    /// Says in `Retry-After` when to try again.
    pub fn retry_after(mut self, seconds: u32) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with(mut self, field: &str, value: serde_json::Value) -> Problem {
        self.body[field] = value;
        self
    }

    /// The stable code clients branch on.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What went wrong, in words.
    pub fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or_default()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            self.body.to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// A decision the rules refuse, as the problem that says why: no such gate
/// (404), not this person's to decide (403), or not any more (409).
fn refusal(refused: &DecideError) -> Problem {
    let (status, code) = match refused {
        DecideError::UnknownStep(_) => (StatusCode::NOT_FOUND, "unknown_step"),
        DecideError::NotAnApprover { .. } => (StatusCode::FORBIDDEN, "not_an_approver"),
        DecideError::NotPending(_) | DecideError::Expired(_) | DecideError::RunEnded { .. } => {
            (StatusCode::CONFLICT, "decision_refused")
        }
    };
    Problem::new(status, code, &refused.to_string())
}

/// A store that failed to answer: the request may succeed when retried.
pub(crate) fn store_problem(error: StoreError) -> Problem {
    match error {
        // Data that cannot be used is not a store that will come back.
        StoreError::Damaged(_) => Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_damaged",
            &error.to_string(),
        ),
        error => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            &error.to_string(),
        ),
    }
}

/// The result of a store task spawned by a handler, as the handler's.
pub(crate) async fn joined<T>(
    task: tokio::task::JoinHandle<Result<T, Problem>>,
) -> Result<T, Problem> {
    match task.await {
        Ok(result) => result,
        Err(error) => Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &format!("the request's task stopped: {error}"),
        )),
    }
}

/// An API key as the daemon looks it up: its SHA-256, so that the lookup's
/// timing says nothing about the keys themselves.
fn key_digest(key: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `sent` is `secret`, compared in constant time (both hashed
/// first, so that neither length nor content leaks through timing).
fn same_secret(sent: &str, secret: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (
        Sha256::digest(sent.as_bytes()),
        Sha256::digest(secret.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A problem as a response, for middleware and fallbacks.
pub fn problem(status: StatusCode, code: &str, detail: &str) -> Response {
    Problem::new(status, code, detail).into_response()
}
