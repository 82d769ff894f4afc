//! Runs driven by this process: each in a task of its own, counted among its
//! account's runs in flight, its decisions applied and its spans exported.

use super::*;

impl Daemon {
    /// Refuses to go on with run `run_id` here when it began with a model
    /// provider this flowd has none of (restarted without its
    /// `[provider]`): a decision or a redrive would be taken, and the run
    /// then left claimed and undriven (`spawn_run`).
    pub(crate) async fn answerable_here(&self, run_id: &str) -> Result<(), Problem> {
        let missing = flow_runtime::runner::missing_provider(
            self.store.as_ref(),
            run_id,
            &self.provider_kind,
        )
        .await
        .map_err(store_problem)?;
        match missing {
            None => Ok(()),
            Some(provider) => Err(Problem::new(
                StatusCode::CONFLICT,
                "provider_missing",
                &format!(
                    "run `{run_id}` began with the `{provider}` model provider, and this flowd has none configured: it goes on on a flowd that has one"
                ),
            )),
        }
    }

    /// Decides the approval at `path` of `run`, then continues the run here
    /// unless a live process is executing it (that one picks the decision up
    /// when it parks). Done in a task of its own: a client that hangs up
    /// cannot strand a decided run. Answers once the decision is stored;
    /// the run goes on once its account has a place among its runs in
    /// flight (`run_place_once_free`).
    pub(crate) async fn decide(
        self: &Arc<Daemon>,
        run: RunRow,
        path: String,
        decision: Decision,
    ) -> Result<(), Problem> {
        // A group decides through its members: its name is no person, in
        // any case (regression: `BILLING-LEADS` decided as the group
        // `billing-leads`, which a gate's approvers match without case).
        if let Some(members) = self
            .config
            .people(&run.account)
            .approver_groups
            .iter()
            .find(|(group, _)| group.eq_ignore_ascii_case(&decision.approver))
            .map(|(_, members)| members)
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
        self.answerable_here(&run.id).await?;
        let daemon = Arc::clone(self);
        let (stored, decided) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            // Noted as waiting here from before the decision makes the run
            // this process's: this process's own sweep leaves it (a review:
            // a slow export below let its lease run out first).
            let _awaiting = daemon.awaiting_place.count(&run.id);
            // The plan before the decision: the decision makes the run this
            // process's, so nothing that can fail comes between it and the
            // claim (a plan that would not load then left the run `running`
            // here, driven by nobody, until a restart).
            let recorded = async {
                let plan = daemon
                    .plan(&run.account, &run.plan_hash)
                    .await
                    .map_err(store_problem)?;
                daemon
                    .store
                    .decide(&run.id, &path, &decision)
                    .await
                    .map_err(store_problem)?
                    .map_err(|refused| refusal(&refused))?;
                Ok(plan)
            };
            let plan = match recorded.await {
                Ok(plan) => plan,
                Err(problem) => {
                    let _ = stored.send(Err(problem));
                    return;
                }
            };
            let _ = stored.send(Ok(()));
            // A decided gate's record is the store's, not an invocation's:
            // its span goes now.
            daemon.export_decision(&run, &path).await;
            daemon.go_on_decided(plan, run).await;
        });
        decided.await.unwrap_or_else(|_| {
            Err(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the decision's task stopped before it was stored",
            ))
        })
    }

    /// Drives decided run `run` here once nothing here drives it and its
    /// account has a place among its runs in flight. Stored `running` and
    /// this process's, it waits; if the process stops first, it is resumed
    /// as any run left running is (on PostgreSQL, by a flowd once its
    /// lease runs out).
    async fn go_on_decided(self: &Arc<Daemon>, plan: Arc<Plan>, run: RunRow) {
        // A run this process drives now (a gate decided while another
        // branch still ran) picks the decision up as it parks
        // (`runner::drive`), and its claim would succeed here too: driven
        // twice, on SQLite unfenced (a review). Its drive is waited out.
        while self.drives(&run.id) {
            if self.stopping() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let place = self.run_place_once_free(&run.account).await;
        // A stopping flowd's places come back as its runs stop: not taken
        // then (`release_runs` leaves the run to whichever flowd goes on).
        if self.stopping() {
            return;
        }
        match self
            .store
            .claim_run(&run.id, &[RunStatus::PendingApproval, RunStatus::Running])
            .await
        {
            Ok(true) => self.spawn_run(plan, place, run.workflow, run.id, run.input, None),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(
                    run = %run.id,
                    "the decided run could not be claimed, and is left for a sweep to resume: {error}"
                );
                self.give_up(&run.id).await;
            }
        }
    }

    /// Gives run `id` up, still `running` and with no owner, rather than
    /// leave it this live process's, driven by nobody: a sweep (or the next
    /// start) resumes it. A give-up that fails too (the store cut off)
    /// leaves it to the lease on PostgreSQL, to the next start on SQLite.
    async fn give_up(&self, id: &str) {
        let _ = self
            .store
            .finish_run(
                id,
                RunStatus::Running,
                &serde_json::Value::Null,
                Duration::ZERO,
            )
            .await;
    }

    /// Whether a task of this process drives run `id` now.
    pub(super) fn drives(&self, id: &str) -> bool {
        self.driving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .is_some_and(|driven| !driven.handle.is_finished())
    }

    /// Returns at once unless this flowd is stopping; then never (the run's
    /// task is stopped in it). Asked by a model or tool call that has
    /// waited for its turn (a permit among the account's model calls, the
    /// MCP connection's), just before it goes out: a stopping flowd lets the
    /// steps in flight finish but sends no call that had not gone out, which
    /// its grace period may cut and the run's next process would send again
    /// (an audit: a tool call queued for its connection went out 9 s into a
    /// stop, was cut at 10 s, and ran twice).
    pub(crate) async fn unless_stopping(&self, account: &str) {
        /// Counts its step as held back while the run's task waits here.
        struct HeldBack<'a>(&'a Daemon, &'a str);
        impl Drop for HeldBack<'_> {
            fn drop(&mut self) {
                let mut places = self.0.step_places.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(count) = places.held_back.get_mut(self.1) {
                    *count = count.saturating_sub(1);
                }
            }
        }
        {
            let mut places = self.step_places.lock().unwrap_or_else(|p| p.into_inner());
            if !places.closed {
                return;
            }
            *places.held_back.entry(account.to_string()).or_default() += 1;
        }
        let _counted = HeldBack(self, account);
        std::future::pending::<()>().await
    }

    /// Whether this flowd is stopping: no attempt starts any more
    /// (`close_step_places`).
    fn stopping(&self) -> bool {
        self.step_places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed
    }

    /// Exports the spans of an invocation's steps, and the run's own span
    /// once it has ended, when an OTLP endpoint is configured.
    pub(super) async fn export_trace(
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
    pub(super) async fn export_decision(&self, run: &RunRow, path: &str) {
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

    /// `account`'s places for steps executing at once; closed from the
    /// start if the daemon is stopping (`close_step_places`).
    pub(super) fn step_places(&self, account: &str) -> Arc<tokio::sync::Semaphore> {
        let mut places = self.step_places.lock().unwrap_or_else(|p| p.into_inner());
        let closed = places.closed;
        Arc::clone(
            places
                .by_account
                .entry(account.to_string())
                .or_insert_with(|| {
                    let made =
                        tokio::sync::Semaphore::new(self.config.quotas(account).steps_in_flight);
                    if closed {
                        made.close();
                    }
                    Arc::new(made)
                }),
        )
    }

    /// Closes every account's places for steps, and those made after, so
    /// that no attempt starts in this process any more: a step waiting for
    /// a place (or for its next attempt) waits until its run's task is
    /// stopped, and runs where the run resumes, rather than starting
    /// during the stop to be cut at its end and sent to the model again.
    /// Resolves once every step in flight has left its place, or waits for
    /// a call the stop holds back (`unless_stopping`): then no step runs
    /// here, and a stopping daemon's runs end between two steps, with
    /// every step they completed in their journals (sent as their tasks
    /// stop).
    pub(super) fn close_step_places(self: &Arc<Self>) -> impl Future<Output = ()> + use<> {
        let mut places = self.step_places.lock().unwrap_or_else(|p| p.into_inner());
        places.closed = true;
        let closed: Vec<(String, Arc<tokio::sync::Semaphore>, usize)> = places
            .by_account
            .iter()
            .map(|(account, places)| {
                places.close();
                (
                    account.clone(),
                    Arc::clone(places),
                    self.config.quotas(account).steps_in_flight,
                )
            })
            .collect();
        drop(places);
        let daemon = Arc::clone(self);
        async move {
            // A closed semaphore has no waiters to wake as its places come
            // back, so their count is watched; a stop waits on it for at
            // most its grace period.
            for (account, places, all) in closed {
                loop {
                    let held_back = {
                        let step_places =
                            daemon.step_places.lock().unwrap_or_else(|p| p.into_inner());
                        step_places.held_back.get(&account).copied().unwrap_or(0)
                    };
                    if places.available_permits() + held_back >= all {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// Counts a deploy of `account` while the answer lives, or refuses it
    /// when the account has [`DEPLOYS_AT_ONCE`] under way: deploys take
    /// the places for compiles in turn, whatever their account, so one
    /// account's queue of slow deploys kept every other account's waiting
    /// (an audit: a tiny deploy answered after a minute, or not at all).
    pub(crate) fn count_deploy(&self, account: &str) -> Result<Counted, Problem> {
        self.deploys_under_way
            .count_within(account, DEPLOYS_AT_ONCE)
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "deploys_in_flight",
                    &format!(
                        "this account has {DEPLOYS_AT_ONCE} deploys under way, the most it may: deploy again once one has answered"
                    ),
                )
                .retry_after(1)
            })
    }

    /// A place among `account`'s runs in flight, while fewer than its
    /// quota (`runs_in_flight`) are: held by a start, a redrive or a sweep
    /// until its run is driven, then counted as such. Counted and checked
    /// at once, so that starts at the same moment cannot all pass a count
    /// taken before any of them ran (an audit: ten at once against a
    /// quota of 3 started five).
    ///
    /// None while the account's decided runs wait for places: they go
    /// first (a review: starts at the quota took every place freed, and a
    /// decided run could wait for good).
    pub(crate) fn reserve_run(&self, account: &str) -> Option<Counted> {
        if self.decided_waiting.holds(account) {
            return None;
        }
        let most = self.config.quotas(account).runs_in_flight;
        self.in_flight.count_within(account, most)
    }

    /// A place among `account`'s runs in flight once there is one: what a
    /// decided run waits for. Its decision is not refused for want of
    /// room (a person answered; a 429 would have them answer again), and
    /// the run goes on as soon as one of the account's ends or parks.
    async fn run_place_once_free(&self, account: &str) -> Counted {
        let _waiting = self.decided_waiting.count(account);
        let most = self.config.quotas(account).runs_in_flight;
        self.in_flight.count_once_within(account, most).await
    }

    /// A place among `account`'s runs in flight whatever the quota: for
    /// the runs a restart resumes, which were in flight when it stopped.
    pub(super) fn count_run(&self, account: &str) -> Counted {
        self.in_flight.count(account)
    }

    /// Stops driving run `id` here, if this process is (a cancelled run).
    pub(crate) fn stop_driving(&self, id: &str) {
        let driven = self
            .driving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(driven) = driven {
            driven.handle.abort();
        }
    }

    /// The steps run `id` executes now, if this process drives it: `None`
    /// when it does not (another flowd sharing the store may).
    pub(crate) fn steps_now(&self, id: &str) -> Option<Vec<StepNow>> {
        let steps = self
            .driving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|driven| Arc::clone(&driven.steps))?;
        Some(steps.now())
    }

    /// Drives a run this process has created (`created`: just now, with
    /// when `create_run` was asked, so nothing of it is read back) or
    /// claimed (`None`), in the background, in `place` among its account's
    /// runs in flight (the place's key is the account) until its task ends.
    pub(crate) fn spawn_run(
        self: &Arc<Daemon>,
        plan: Arc<Plan>,
        place: Counted,
        workflow: String,
        run_id: String,
        input: serde_json::Value,
        created: Option<std::time::Instant>,
    ) {
        let daemon = Arc::clone(self);
        // The run's steps in flight: its interpreter's table, read by
        // `steps_now`.
        let in_flight = Arc::new(StepsInFlight::default());
        let table = Arc::clone(&in_flight);
        let account = place.key().to_string();
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        // Finished runs leave their results in the set until collected.
        while runs.try_join_next().is_some() {}
        let id = run_id.clone();
        // Held until the handle is in: a run that ends at once removes its
        // entry only after it was added.
        let mut driving = self.driving.lock().unwrap_or_else(|p| p.into_inner());
        let handle = runs.spawn(async move {
            // Counted until the task ends, aborted or not.
            let _place = place;
            // A cancel that came between the claim and this task found
            // nothing to stop: the run is not driven if it is no longer
            // running. (A run created just now is in `driving` before
            // anyone knows its id.)
            let cancelled = created.is_none()
                && !matches!(
                    daemon.store.run(&run_id).await,
                    Ok(Some(row)) if row.status == RunStatus::Running
                );
            'drive: {
                if cancelled {
                    break 'drive;
                }
                // A run begun with a model, resumed by a flowd with none
                // (restarted without its [provider]), is left claimed and
                // not driven: its steps would get the offline provider's
                // made-up answers. It waits for a start with the provider
                // (on PostgreSQL, another flowd takes it as its lease runs
                // out), and a run of another provider goes on meanwhile.
                // (A history that does not read is left to the drive, which
                // reads the store too and gives the run up if it fails.)
                if created.is_none()
                    && let Ok(Some(provider)) = flow_runtime::runner::missing_provider(
                        daemon.store.as_ref(),
                        &run_id,
                        &daemon.provider_kind,
                    )
                    .await
                {
                    tracing::error!(
                        run = %run_id,
                        "the run began with the `{provider}` provider and this flowd has no [provider]: it waits for a flowd that has one"
                    );
                    break 'drive;
                }
                let started = std::time::Instant::now();
                // Metrics of each step; a handoff has something to mail at once;
                // the steps of this invocation are its trace spans.
                let traced: Arc<std::sync::Mutex<Vec<StepRecord>>> = Arc::default();
                let observer: Observer = {
                    let (metrics, daemon) = (daemon.metrics.observer(&account), Arc::clone(&daemon));
                    let stored = daemon.stored.meter(&daemon, &account);
                    let traced = Arc::clone(&traced);
                    let tracing = daemon.config.otlp_endpoint.is_some();
                    Arc::new(move |record: &StepRecord| {
                        // Past the account's quota the run stops after
                        // this record (written: the step has acted): a
                        // quota checked at starts alone let one run store
                        // a hundred times it.
                        stored(record)?;
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
                        Ok(())
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
                        daemon: Arc::clone(&daemon),
                        account: account.clone(),
                    }),
                    limiter: Arc::clone(&daemon.limiter),
                    account: account.clone(),
                });
                let invocation = match created {
                    Some(asked_at) => Invocation::Created {
                        account: account.clone(),
                        asked_at,
                    },
                    None => Invocation::Resume,
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
                    Some(in_flight),
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
                        daemon.give_up(&run_id).await;
                    }
                }
            }
            // Only this task's entry: a decision may have started a new one.
            {
                let mut driving = daemon.driving.lock().unwrap_or_else(|p| p.into_inner());
                if driving
                    .get(&run_id)
                    .is_some_and(|driven| driven.handle.id() == tokio::task::id())
                {
                    driving.remove(&run_id);
                }
            }
            // The plan may have left the cache while this run held it: the
            // last run of it frees it, off the async worker.
            crate::freed_off_worker::release(plan);
        });
        driving.insert(
            id,
            Driven {
                handle,
                steps: table,
            },
        );
    }
}

/// A run this process drives.
pub(crate) struct Driven {
    handle: tokio::task::AbortHandle,
    /// The steps it executes now (its interpreter's table).
    steps: Arc<StepsInFlight>,
}

/// An account's deploys compiling or waiting to at once, in one process:
/// one compiles while the next waits, and another account's deploy waits
/// for at most these two of each account before it.
const DEPLOYS_AT_ONCE: usize = 2;

/// Each account's places for steps executing at once, and whether they
/// are closed (a stopping daemon): those made after the close are closed
/// too.
#[derive(Default)]
pub(super) struct StepPlaces {
    by_account: HashMap<String, Arc<tokio::sync::Semaphore>>,
    closed: bool,
    /// Each account's steps whose call the stop holds back
    /// (`unless_stopping`): their places count as given back, since they
    /// never go on here.
    held_back: HashMap<String, usize>,
}
