//! `/v1/runs`: starting a run (its input checked first, an idempotency key
//! honoured), reading it, its trace, graph and test, listing, cancelling,
//! redriving and deleting runs.

use super::*;
use crate::trace_step::TraceStep;

#[derive(Serialize, ToSchema)]
pub(super) struct RunSummary {
    pub(super) run_id: String,
    pub(super) workflow: String,
    pub(super) status: RunStatus,
    pub(super) created_ms: i64,
    pub(super) updated_ms: i64,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Runs {
    pub(super) runs: Vec<RunSummary>,
    /// Where the next page starts, when this one is full: pass it as
    /// `cursor`. It stays good when the run it was taken from is deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) next: Option<String>,
}

/// A place in an account's list of runs, newest first: just after the run
/// created at `created_ms` with `id`. A cursor names no run, only a place,
/// so that one taken from a run deleted since (retention deletes the
/// oldest, the last of a page) still leads on; and it reveals nothing of
/// another account, whose runs an account's list never holds.
struct Cursor {
    created_ms: i64,
    id: String,
}

impl Cursor {
    fn encode(&self) -> String {
        format!("{}_{}", self.created_ms, self.id)
    }

    fn decode(text: &str) -> Result<Cursor, Problem> {
        text.split_once('_')
            .and_then(|(created_ms, id)| {
                let created_ms = created_ms.parse::<i64>().ok()?;
                (!id.is_empty()).then(|| Cursor {
                    created_ms,
                    id: id.to_string(),
                })
            })
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    &format!(
                        "cursor `{text}` is not one this API gave: pass the `next` of a page as it came"
                    ),
                )
            })
    }
}

/// A run's journal: every step execution in the order recorded.
#[derive(Serialize, ToSchema)]
pub(super) struct Trace {
    pub(super) run_id: String,
    pub(super) steps: Vec<TraceStep>,
    /// What happened to the run besides its steps: redrives, moves to
    /// other versions.
    pub(super) history: Vec<flow_runtime::store::RunChange>,
    /// The steps the run executes now, which have no record yet, when
    /// this flowd drives it (absent when it does not: another flowd
    /// sharing the store may).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) in_flight: Option<Vec<flow_runtime::services::StepNow>>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StartRun {
    pub(super) workflow: String,
    /// The deployed version; the latest by default.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 4_294_967_295_u64)]
    pub(super) version: Option<u32>,
    /// The workflow's input, checked against its input schema. An object
    /// in it that gives a key twice is refused.
    #[serde(default, deserialize_with = "flow_plan::unique_keys::value")]
    #[schema(value_type = Option<Object>)]
    pub(super) input: Value,
}

/// A version number written as any JSON number with no fraction (`2` or
/// `2.0`), as JSON Schema's `integer` allows.
pub(super) fn whole_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    let number = Option::<f64>::deserialize(deserializer)?;
    number
        .map(|n| {
            if n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) {
                Ok(n as u32)
            } else {
                Err(serde::de::Error::custom(format!(
                    "version {n} is not a whole number from 0 to {}",
                    u32::MAX
                )))
            }
        })
        .transpose()
}

impl StartRun {
    /// The run's input; none is the empty object.
    pub(super) fn input(&self) -> Value {
        if self.input.is_null() {
            json!({})
        } else {
            self.input.clone()
        }
    }
}

/// Starts a run of a deployed workflow. The input is checked against the
/// workflow's input schema before anything is stored or runs. With an
/// `Idempotency-Key` header, a retried request answers the run the first one
/// started instead of starting another.
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs", request_body = StartRun,
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters")),
    responses(
        (status = 202, description = "Started", body = RunState),
        (status = 200, description = "Started before with this Idempotency-Key", body = RunState),
        (status = 404, description = "No such workflow or version (`unknown_workflow`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 422, description = "The input does not match (`invalid_input`, with at most 100 `mismatches` and `mismatches_omitted`), the key started another request (`idempotency_key_reused`), or the workflow names an MCP server or tool the operator no longer offers this account (`mcp_server_not_allowed`, `mcp_tool_not_allowed`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 429, description = "The account has as many runs in flight as its quota, or its data takes its quota of the store (`quota_exceeded`); `Retry-After` says when to try again", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn start_run(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    // What the run will store of the request: its input, at most this.
    let stores = body.as_ref().map_or(0, |bytes| bytes.len() as u64);
    let request: StartRun = json_body(&headers, body)?;
    let key = idempotency_key(&headers)?;
    let deployment = daemon
        .deployment(&account, &request.workflow, request.version)
        .await
        .map_err(store_problem)?;
    if let Some(key) = &key
        && let Some(first) = daemon
            .store
            .run_by_key(&account, key)
            .await
            .map_err(store_problem)?
    {
        return replayed(first, key, &request, deployment.as_ref());
    }
    let deployment = deployment.ok_or_else(|| {
        Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_workflow",
            &match request.version {
                Some(v) => format!(
                    "no version {v} of workflow `{}` is deployed",
                    request.workflow
                ),
                None => format!("no workflow `{}` is deployed", request.workflow),
            },
        )
    })?;
    let plan = daemon
        .plan(&account, &deployment.plan_hash)
        .await
        .map_err(store_problem)?;
    // The configuration may have changed since the deploy.
    mcp_allowed(&daemon, &account, &plan)?;
    let place = run_place(&daemon, &account, "start this one")?;
    daemon.stored.admit(&daemon, &account, stores).await?;
    let input = request.input();
    if let Some(workflow) = plan.workflow(&request.workflow) {
        // Bounded whatever the plan: at most 100 mismatches are listed, each
        // cut short, and the rest counted.
        let mismatches = flow_runtime::schema::validate(&workflow.input_schema, &input);
        if !mismatches.is_empty() {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                &format!(
                    "the input does not match workflow `{}`'s input{}",
                    request.workflow,
                    if mismatches.omitted > 0 {
                        format!(
                            " ({} mismatches; the first {} are listed)",
                            mismatches.len() + mismatches.omitted,
                            mismatches.len()
                        )
                    } else {
                        String::new()
                    }
                ),
            )
            .with(
                "mismatches",
                mismatches
                    .iter()
                    .map(|m| json!({ "path": m.path, "expected": m.expected, "found": m.found }))
                    .collect(),
            )
            .with("mismatches_omitted", Value::from(mismatches.omitted)));
        }
    }
    let run_id = flow_runtime::runner::new_run_id();
    // Stored and started in a task of its own: a client that hangs up
    // mid-request must not leave a stored run that nothing drives.
    let started = {
        let (daemon, run_id, account) = (Arc::clone(&daemon), run_id.clone(), account.clone());
        let run = NewRun {
            workflow: request.workflow.clone(),
            plan_hash: plan.hash.clone(),
            input,
            provider: Some(daemon.provider_kind.clone()),
        };
        let key = key.clone();
        tokio::spawn(async move {
            let asked_at = std::time::Instant::now();
            let created = daemon
                .store
                .create_run(&run_id, &account, &run, key.as_deref())
                .await
                .map_err(store_problem)?;
            if created {
                let asked_at = Some(asked_at);
                daemon.spawn_run(plan, place, run.workflow, run_id, run.input, asked_at);
            }
            Ok(created)
        })
    };
    if !joined(started).await? {
        // A request with the same key got in first, a moment ago.
        let key = key.unwrap_or_default();
        let first = daemon
            .store
            .run_by_key(&account, &key)
            .await
            .map_err(store_problem)?
            .ok_or_else(|| store_problem(StoreError::Missing(format!("no run has key `{key}`"))))?;
        return replayed(first, &key, &request, Some(&deployment));
    }
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/v1/runs/{run_id}"))],
        axum::Json(RunState {
            run_id,
            status: RunStatus::Running,
        }),
    )
        .into_response())
}

/// A place among the account's runs in flight for a run about to be
/// driven (`Daemon::reserve_run`), or the 429 that says there is none;
/// `then` says what to do once there is.
fn run_place(daemon: &Daemon, account: &str, then: &str) -> Result<Counted, Problem> {
    daemon.reserve_run(account).ok_or_else(|| {
        let quota = daemon.config.quotas(account).runs_in_flight;
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exceeded",
            &format!(
                "this account has {quota} runs in flight, its quota (runs_in_flight); {then} when one of them has ended or parked"
            ),
        )
        .retry_after(1)
    })
}

/// The `Idempotency-Key` header, if the request has one.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    // A blank was taken as part of the key, and of two keys the first
    // (an audit).
    let visible = |key: &str| key.bytes().all(|b| b.is_ascii_graphic());
    match value.to_str() {
        Ok(key) if values.next().is_none() && (1..=255).contains(&key.len()) && visible(key) => {
            Ok(Some(key.to_string()))
        }
        _ => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "an Idempotency-Key is one header of 1 to 255 visible ASCII characters (no blanks)",
        )),
    }
}

/// The answer to a retried start: the run the key's first request started,
/// if this request asks for the same thing. `deployment` is what this
/// request names (`request.version`'s, or the latest).
pub(super) fn replayed(
    first: RunRow,
    key: &str,
    request: &StartRun,
    deployment: Option<&Deployment>,
) -> Answer {
    // A version named must be the one the first request ran; with none
    // named, a retry after a deploy still answers the first run.
    let other_version = request.version.is_some()
        && deployment.is_none_or(|named| named.plan_hash != first.plan_hash);
    if first.workflow != request.workflow || first.input != request.input() || other_version {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            &format!(
                "Idempotency-Key `{key}` already started run `{}` of workflow `{}` with another request; use a new key for a new run",
                first.id, first.workflow
            ),
        ));
    }
    Ok((
        StatusCode::OK,
        [
            (header::LOCATION, format!("/v1/runs/{}", first.id)),
            (
                header::HeaderName::from_static("idempotent-replayed"),
                "true".to_string(),
            ),
        ],
        axum::Json(RunState {
            run_id: first.id,
            status: first.status,
        }),
    )
        .into_response())
}

/// The run: its status and its output, pending approvals or error.
#[utoipa::path(
    get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run", body = RunRecord),
        (status = 404, description = "No such run in this account (`unknown_run`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_run(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    let row = own_run(&daemon, &account, &id).await?;
    let outcome: Option<Outcome> = row
        .outcome
        .as_ref()
        .and_then(|o| serde_json::from_value(o.clone()).ok());
    let mut record = match (&outcome, row.status) {
        (Some(outcome), RunStatus::Completed | RunStatus::Failed | RunStatus::PendingApproval) => {
            runner::run_record(&row.id, outcome)
        }
        _ => RunRecord::new(&row.id, row.status),
    };
    record.workflow = Some(row.workflow);
    record.created_ms = Some(row.created_ms);
    record.updated_ms = Some(row.updated_ms);
    record.input = Some(row.input);
    Ok(axum::Json(record).into_response())
}

/// Every step execution of the run's journal, in the order recorded, with
/// inputs, output, status, timings and attempts.
#[utoipa::path(
    get, path = "/v1/runs/{id}/trace", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The trace", body = Trace),
        (status = 404, description = "No such run in this account", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn trace(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    own_run(&daemon, &account, &id).await?;
    let records = daemon
        .store
        .step_records(&id)
        .await
        .map_err(store_problem)?;
    let history = daemon.store.run_history(&id).await.map_err(store_problem)?;
    let in_flight = daemon.steps_now(&id);
    Ok(axum::Json(Trace {
        steps: records.into_iter().map(TraceStep::from).collect(),
        run_id: id,
        history,
        in_flight,
    })
    .into_response())
}

/// A run written as a `test` block of the flow language.
#[derive(Serialize, ToSchema)]
pub(super) struct RunTest {
    pub(super) run_id: String,
    /// The block, after an `import` of the workflow's file, laid out as
    /// `flowc fmt` writes it: save it as `NAME.test.flow` beside the
    /// workflow and `flowc test` runs it.
    pub(super) test: String,
}

/// The run as a regression test: its input, each recipe's and tool's
/// recorded answers as mocks, each approval's decision, and its status and
/// output as expectations (what `flow test-from RUN` writes).
#[utoipa::path(
    get, path = "/v1/runs/{id}/test", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The test block", body = RunTest),
        (status = 404, description = "No such run in this account", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 409, description = "The run's plan does not hold its workflow (`no_test`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn test_from(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    let row = own_run(&daemon, &account, &id).await?;
    let plan = daemon
        .plan(&account, &row.plan_hash)
        .await
        .map_err(store_problem)?;
    let records = daemon
        .store
        .step_records(&id)
        .await
        .map_err(store_problem)?;
    let no_test = |detail: &str| Problem::new(StatusCode::CONFLICT, "no_test", detail);
    let text = runner::test_from_row(&plan, &row, &records).map_err(|why| no_test(&why))?;
    let test = flow_compiler::format::format_source(&text).map_err(|error| {
        no_test(&format!(
            "the test written from the run does not parse: {error}"
        ))
    })?;
    Ok(axum::Json(RunTest { run_id: id, test }).into_response())
}

/// The workflow's flowchart from the run's plan (the shapes `flowc graph`
/// draws), laid out, with the path the run took and where it is marked:
/// what the inspector draws.
#[utoipa::path(
    get, path = "/v1/runs/{id}/graph", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The graph", body = crate::run_graph::RunGraph),
        (status = 404, description = "No such run in this account", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn graph(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    let row = own_run(&daemon, &account, &id).await?;
    let plan = daemon
        .plan(&account, &row.plan_hash)
        .await
        .map_err(store_problem)?;
    let workflow = plan
        .workflows
        .iter()
        .find(|w| w.name == row.workflow)
        .ok_or_else(|| {
            store_problem(StoreError::Damaged(format!(
                "the plan of run `{id}` has no workflow `{}`",
                row.workflow
            )))
        })?;
    let records = daemon
        .store
        .step_records(&id)
        .await
        .map_err(store_problem)?;
    let graph = flow_plan::graph::build(&flow_plan::graph::Outline::of_plan(&plan, workflow));
    let laid = crate::run_graph::run_graph(
        &id,
        &row.workflow,
        &graph,
        &records,
        row.status == RunStatus::Completed,
    );
    Ok(axum::Json(laid).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunFilter {
    /// Only runs of this workflow.
    workflow: Option<String>,
    /// Only runs with this status.
    status: Option<RunStatus>,
    /// At most this many, newest first (default 100; more is read as 1,000).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<usize>,
    /// The next page: only runs older than this run (the last of a page).
    /// A 404 once that run is deleted: `cursor` is the way that holds.
    before: Option<String>,
    /// The next page: the `next` of the page before.
    cursor: Option<String>,
}

/// The account's runs, newest first.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs", params(RunFilter),
    responses(
        (status = 200, description = "The runs", body = Runs),
        (status = 400, description = "A filter is not understood, a cursor is not one this API gave, or `before` and `cursor` are both given (`invalid_query`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "`before` names no run of this account (`unknown_run`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn runs(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    filter: Result<Query<RunFilter>, QueryRejection>,
) -> Answer {
    let Query(filter) = filter.map_err(invalid_query)?;
    let after = match (&filter.before, &filter.cursor) {
        (Some(_), Some(_)) => {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                "`before` and `cursor` both say where the page starts: give one",
            ));
        }
        (Some(id), None) => {
            let run = own_run(&daemon, &account, id).await?;
            Some(Cursor {
                created_ms: run.created_ms,
                id: run.id,
            })
        }
        (None, Some(cursor)) => Some(Cursor::decode(cursor)?),
        (None, None) => None,
    };
    let limit = filter.limit.unwrap_or(100).min(1_000);
    let query = RunQuery {
        workflow: filter.workflow,
        status: filter.status,
        limit,
        before: after.map(|cursor| (cursor.created_ms, cursor.id)),
    };
    let rows = daemon
        .store
        .account_runs(&account, &query)
        .await
        .map_err(store_problem)?;
    // A full page may have more after it; one that is not has none.
    let next = (limit > 0 && rows.len() == limit)
        .then(|| rows.last())
        .flatten()
        .map(|last| {
            Cursor {
                created_ms: last.created_ms,
                id: last.id.clone(),
            }
            .encode()
        });
    let runs = rows
        .into_iter()
        .map(|row| RunSummary {
            run_id: row.id,
            workflow: row.workflow,
            status: row.status,
            created_ms: row.created_ms,
            updated_ms: row.updated_ms,
        })
        .collect();
    Ok(axum::Json(Runs { runs, next }).into_response())
}

/// Deletes an ended run with its trace and notifications (a cancelled one
/// 30 s after its cancel): a run that has not ended must be cancelled first.
#[utoipa::path(
    delete, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "Deleted", body = Deleted),
        (status = 404, description = "No such run in this account (`unknown_run`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 409, description = "The run has not ended, or was cancelled less than 30 s ago (`run_not_ended`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn delete_run(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    match daemon
        .store
        .delete_run(&account, &id)
        .await
        .map_err(store_problem)?
    {
        Deletion::Deleted => {
            crate::storage::StoredBytes::measure_soon(&daemon, &account);
            Ok(axum::Json(Deleted { deleted: true }).into_response())
        }
        Deletion::NotEnded(status) => Err(Problem::new(
            StatusCode::CONFLICT,
            "run_not_ended",
            &match status {
                RunStatus::Cancelled => format!(
                    "run `{id}` was cancelled less than 30 s ago: it can be deleted 30 s after its cancel (a process cut off from the store may still be writing it)"
                ),
                status => format!(
                    "run `{id}` is {status}: cancel it first (a cancelled run can be deleted 30 s after its cancel)"
                ),
            },
        )),
        Deletion::Unknown => Err(unknown_run(&id)),
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Redrive {
    /// Go on on this version of the workflow (one where the run can go on
    /// from where it stopped); its own version by default.
    pub(super) version: Option<u32>,
}

/// Continues a failed or cancelled run from where it stopped: what completed
/// is kept (not called again); the steps that failed it run again with their
/// retry budget anew, then the rest; the workflow's deadline starts over.
/// The trace keeps every attempt. At most 10 times per run.
#[utoipa::path(
    post, path = "/v1/runs/{id}/redrive", tag = "runs", request_body(content = Option<Redrive>, description = "Optional: `{\"version\": N}`"),
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 202, description = "Redriven; the run continues", body = RunState),
        (status = 404, description = "No such run in this account (`unknown_run`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 409, description = "The run did not fail and was not cancelled (`not_redrivable`), was redriven as often as it may be (`redrives_exhausted`), or cannot go on on the version asked for (`incompatible_version`, with `problems`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn redrive(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    // No body, or `{"version": N}`.
    let request: Redrive = match &body {
        Ok(bytes) if bytes.is_empty() => Redrive { version: None },
        _ => json_body(&headers, body)?,
    };
    let row = own_run(&daemon, &account, &id).await?;
    // The plan before the claim: a run claimed and then not driven would
    // wait for the orphan sweep.
    let plan = match request.version {
        None => daemon
            .plan(&account, &row.plan_hash)
            .await
            .map_err(store_problem)?,
        Some(number) => {
            let versions = crate::migrate::versions_of(&daemon, &account, &row.workflow).await?;
            let target = crate::migrate::version(&versions, Some(number), &row.workflow)?;
            let plan = daemon
                .plan(&account, &target.plan_hash)
                .await
                .map_err(store_problem)?;
            let problems = crate::migrate::problems_moving(&daemon, &row, &plan).await?;
            if !problems.is_empty() {
                return Err(Problem::new(
                    StatusCode::CONFLICT,
                    "incompatible_version",
                    &format!(
                        "run `{id}` cannot go on on version {number} of `{}` from where it stopped",
                        row.workflow
                    ),
                )
                .with("problems", crate::migrate::problem_list(problems)));
            }
            plan
        }
    };
    daemon.answerable_here(&id).await?;
    // A redrive drives a run as a start does: held to the same quota (a
    // run started, cancelled and redriven passed it).
    let place = run_place(&daemon, &account, "redrive it")?;
    let to_plan = request.version.map(|_| plan.hash.as_str());
    if daemon
        .store
        .redrive_run(&id, to_plan)
        .await
        .map_err(store_problem)?
        .is_none()
    {
        // Refused as the run is now: another process may have redriven
        // it meanwhile.
        let now = daemon.store.run(&id).await.ok().flatten().unwrap_or(row);
        let refused = flow_runtime::store::RedriveRefused::of(&now);
        return Err(Problem::new(
            StatusCode::CONFLICT,
            refused.code(),
            &refused.to_string(),
        ));
    }
    daemon.spawn_run(plan, place, row.workflow, id.clone(), row.input, None);
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(RunState {
            run_id: id,
            status: RunStatus::Running,
        }),
    )
        .into_response())
}

/// Stops a running or parked run for good.
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "Cancelled", body = RunState),
        (status = 404, description = "No such run in this account", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 409, description = "The run has already ended (`run_ended`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn cancel(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(id): Path<String>,
) -> Answer {
    let row = own_run(&daemon, &account, &id).await?;
    if !daemon.store.cancel_run(&id).await.map_err(store_problem)? {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "run_ended",
            &format!("run `{id}` has already ended ({})", row.status),
        ));
    }
    daemon.stop_driving(&id);
    // The store kept the run's `cancelled` event with the change.
    daemon.events_wake.notify_one();
    Ok(axum::Json(RunState {
        run_id: id,
        status: RunStatus::Cancelled,
    })
    .into_response())
}
