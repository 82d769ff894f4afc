//! The `/v1` routes. Every handler runs for an authenticated account
//! (`AccountId`), and sees only that account's workflows and runs: another
//! account's run is a 404, exactly as a run that does not exist.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flow_plan::Plan;
use flow_runtime::interp::{Decision, Outcome};
use flow_runtime::runner;
use flow_runtime::store::{RunQuery, RunRow, RunStatus, StoreError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::server::{AccountId, Daemon, Problem, joined, store_problem};

type Answer = Result<Response, Problem>;

/// `POST /v1/workflows`: a `.flow` source compiled here, or a built plan.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Deploy {
    source: Option<String>,
    /// The source's file name, for diagnostics.
    path: Option<String>,
    plan: Option<Value>,
}

pub(crate) async fn deploy(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: Deploy = json_body(&headers, body)?;
    let plan = match (request.source, request.plan) {
        (Some(source), None) => {
            compile(request.path.as_deref().unwrap_or("workflow.flow"), &source)?
        }
        (None, Some(plan)) => Plan::from_json(&plan.to_string()).map_err(|e| {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_plan",
                &e.to_string(),
            )
        })?,
        _ => {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "send either `source` (a .flow file's text) or `plan` (flowc build output)",
            ));
        }
    };
    daemon.store.put_plan(&plan).await.map_err(store_problem)?;
    let mut deployed = Vec::new();
    for workflow in &plan.workflows {
        deployed.push(
            daemon
                .store
                .deploy(&account, &workflow.name, &plan.hash)
                .await
                .map_err(store_problem)?,
        );
    }
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({ "deployments": deployed })),
    )
        .into_response())
}

/// A source checked and lowered, or a 422 listing every error.
fn compile(path: &str, source: &str) -> Result<Plan, Problem> {
    let checked = flow_compiler::check_source(path, source);
    if checked.has_errors() {
        let errors: Vec<Value> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| {
                let file = checked.file(d.primary.file);
                let (line, column) =
                    flow_compiler::diagnostic::line_col(&file.text, d.primary.span.start);
                json!({ "code": d.code.as_str(), "message": d.message, "line": line, "column": column })
            })
            .collect();
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            &format!("{path} has {} error(s)", errors.len()),
        )
        .with("diagnostics", Value::Array(errors)));
    }
    flow_compiler::lower(&checked).ok_or_else(|| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            "the source could not be lowered to a plan",
        )
    })
}

/// `GET /v1/workflows`: the account's deployments.
pub(crate) async fn workflows(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
) -> Answer {
    let deployments = daemon
        .store
        .deployments(&account)
        .await
        .map_err(store_problem)?;
    Ok(axum::Json(json!({ "deployments": deployments })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRun {
    workflow: String,
    /// The deployed version; the latest by default.
    version: Option<u32>,
    #[serde(default)]
    input: Value,
}

impl StartRun {
    /// The run's input; none is the empty object.
    fn input(&self) -> Value {
        if self.input.is_null() {
            json!({})
        } else {
            self.input.clone()
        }
    }
}

/// `POST /v1/runs`: starts a run of a deployed workflow. The input is checked
/// against the workflow's input schema before anything is stored or runs.
/// With an `Idempotency-Key` header, a retried request answers the run the
/// first one started instead of starting another.
pub(crate) async fn start_run(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: StartRun = json_body(&headers, body)?;
    let key = idempotency_key(&headers)?;
    if let Some(key) = &key
        && let Some(first) = daemon
            .store
            .run_by_key(&account, key)
            .await
            .map_err(store_problem)?
    {
        return replayed(first, key, &request);
    }
    let deployments = daemon
        .store
        .deployments(&account)
        .await
        .map_err(store_problem)?;
    let deployment = deployments
        .iter()
        .filter(|d| d.workflow == request.workflow)
        .filter(|d| request.version.is_none_or(|v| v == d.version))
        .max_by_key(|d| d.version)
        .ok_or_else(|| {
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
        .plan(&deployment.plan_hash)
        .await
        .map_err(store_problem)?;
    let input = request.input();
    if let Some(workflow) = plan.workflow(&request.workflow) {
        let mismatches = flow_runtime::schema::validate(&workflow.input_schema, &input);
        if !mismatches.is_empty() {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                &format!(
                    "the input does not match workflow `{}`'s input",
                    request.workflow
                ),
            )
            .with(
                "mismatches",
                mismatches
                    .iter()
                    .map(|m| json!({ "path": m.path, "expected": m.expected, "found": m.found }))
                    .collect(),
            ));
        }
    }
    let run_id = flow_runtime::runner::new_run_id();
    // Stored and started in a task of its own: a client that hangs up
    // mid-request must not leave a stored run that nothing drives.
    let started = {
        let (daemon, run_id, account) = (Arc::clone(&daemon), run_id.clone(), account.clone());
        let (workflow, key) = (request.workflow.clone(), key.clone());
        tokio::spawn(async move {
            let created = daemon
                .store
                .create_run(
                    &run_id,
                    &account,
                    &workflow,
                    &plan.hash,
                    &input,
                    key.as_deref(),
                )
                .await
                .map_err(store_problem)?;
            if created {
                daemon.spawn_run(plan, workflow, run_id, input);
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
            .ok_or_else(|| store_problem(StoreError(format!("no run has key `{key}`"))))?;
        return replayed(first, &key, &request);
    }
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/v1/runs/{run_id}"))],
        axum::Json(json!({ "run_id": run_id, "status": RunStatus::Running })),
    )
        .into_response())
}

/// The `Idempotency-Key` header, if the request has one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if !key.is_empty() && key.len() <= 255 => Ok(Some(key.to_string())),
        _ => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "an Idempotency-Key is 1 to 255 visible ASCII characters",
        )),
    }
}

/// The answer to a retried start: the run the key's first request started,
/// if this request asks for the same thing.
fn replayed(first: RunRow, key: &str, request: &StartRun) -> Answer {
    if first.workflow != request.workflow || first.input != request.input() {
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
        axum::Json(json!({ "run_id": first.id, "status": first.status })),
    )
        .into_response())
}

/// `GET /v1/runs/{id}`: the run record (status, output, pending approvals or error).
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
        _ => json!({ "run_id": row.id, "status": row.status }),
    };
    record["workflow"] = json!(row.workflow);
    record["created_ms"] = json!(row.created_ms);
    Ok(axum::Json(record).into_response())
}

/// `GET /v1/runs/{id}/trace`: every step run of the journal, in the order
/// recorded, with inputs, output, status, timings and attempts.
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
    Ok(axum::Json(json!({ "run_id": id, "steps": records })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunFilter {
    workflow: Option<String>,
    status: Option<RunStatus>,
    /// At most this many, newest first (default 100, at most 1,000).
    limit: Option<usize>,
}

/// `GET /v1/runs?workflow=&status=&limit=`: the account's runs, newest first.
pub(crate) async fn runs(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    filter: Result<Query<RunFilter>, QueryRejection>,
) -> Answer {
    let Query(filter) = filter.map_err(invalid_query)?;
    let query = RunQuery {
        workflow: filter.workflow,
        status: filter.status,
        limit: filter.limit.unwrap_or(100).min(1_000),
    };
    let rows = daemon
        .store
        .account_runs(&account, &query)
        .await
        .map_err(store_problem)?;
    let list: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "run_id": row.id,
                "workflow": row.workflow,
                "status": row.status,
                "created_ms": row.created_ms,
                "updated_ms": row.updated_ms,
            })
        })
        .collect();
    Ok(axum::Json(json!({ "runs": list })).into_response())
}

/// `POST /v1/runs/{id}/cancel`: stops a running or parked run for good.
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
    Ok(axum::Json(json!({ "run_id": id, "status": RunStatus::Cancelled })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Decide {
    /// The email of the person deciding; the account vouches for them.
    approver: String,
    approved: bool,
    comment: Option<String>,
}

/// `POST /v1/runs/{id}/approvals/{step_path}`: approve or reject a pending
/// gate, exactly once, then continue the run in the background.
pub(crate) async fn decide(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path((id, step_path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: Decide = json_body(&headers, body)?;
    let run = own_run(&daemon, &account, &id).await?;
    let decision = Decision {
        groups: daemon.config.groups_of(&request.approver),
        approver: request.approver,
        approved: request.approved,
        comment: request.comment,
        decided_at: flow_runtime::time::now_rfc3339(),
    };
    daemon.decide(run, step_path, decision).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "run_id": id, "status": RunStatus::Running })),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApproverQuery {
    /// The approver's email; the account vouches for them.
    approver: String,
}

/// `GET /v1/approvals?approver=EMAIL`: the gates of the account's parked
/// runs that this approver (or an approver group of theirs) may decide.
pub(crate) async fn my_approvals(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    query: Result<Query<ApproverQuery>, QueryRejection>,
) -> Answer {
    let Query(ApproverQuery { approver }) = query.map_err(invalid_query)?;
    let groups = daemon.config.groups_of(&approver);
    let parked = RunQuery {
        workflow: None,
        status: Some(RunStatus::PendingApproval),
        limit: 1_000,
    };
    let runs = daemon
        .store
        .account_runs(&account, &parked)
        .await
        .map_err(store_problem)?;
    let mut approvals = Vec::new();
    for run in runs {
        let Some(Outcome::Parked { pending }) = run
            .outcome
            .and_then(|outcome| serde_json::from_value(outcome).ok())
        else {
            continue;
        };
        for gate in pending
            .into_iter()
            .filter(|gate| gate.may_decide(&approver, &groups))
        {
            approvals.push(json!({
                "run_id": run.id,
                "workflow": run.workflow,
                "step_path": gate.path,
                "step_id": gate.step_id,
                "message": gate.message,
                "approvers": gate.approvers,
                "expires_ms": gate.expires_ms,
                "created_ms": run.updated_ms,
            }));
        }
    }
    Ok(axum::Json(json!({ "approvals": approvals })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReaderQuery {
    /// The reader's email; the account vouches for them.
    reader: String,
    /// Only the ones this reader has not marked read.
    #[serde(default)]
    unread: bool,
}

/// `GET /v1/notifications?reader=EMAIL&unread=true`: handoffs to the
/// reader's departments and approval requests to them or their approver
/// groups, newest first.
pub(crate) async fn notifications(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    query: Result<Query<ReaderQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    let audiences = daemon.config.audiences_of(&query.reader);
    let mut list = daemon
        .store
        .notifications(&account, &audiences, &query.reader)
        .await
        .map_err(store_problem)?;
    if query.unread {
        list.retain(|notification| !notification.read);
    }
    Ok(axum::Json(json!({ "notifications": list })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkRead {
    reader: String,
    ids: Vec<i64>,
}

/// `POST /v1/notifications/read` `{reader, ids}`: marks them read for that
/// reader; answers how many of them the account has.
pub(crate) async fn mark_read(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: MarkRead = json_body(&headers, body)?;
    let marked = daemon
        .store
        .mark_read(&account, &request.reader, &request.ids)
        .await
        .map_err(store_problem)?;
    Ok(axum::Json(json!({ "marked": marked })).into_response())
}

fn invalid_query(rejection: QueryRejection) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        &rejection.body_text(),
    )
}

/// The account's run `id`, or a 404 that does not say whether it exists.
async fn own_run(daemon: &Daemon, account: &str, id: &str) -> Result<RunRow, Problem> {
    daemon
        .store
        .run(id)
        .await
        .map_err(store_problem)?
        .filter(|row| row.account == account)
        .ok_or_else(|| {
            Problem::new(
                StatusCode::NOT_FOUND,
                "unknown_run",
                &format!("no run `{id}`"),
            )
        })
}

/// The body as `T`, or a problem saying what is wrong with it.
fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Problem> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as `Content-Type: application/json`",
        ));
    }
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "unreadable_body"
        };
        Problem::new(status, code, &rejection.body_text())
    })?;
    serde_json::from_slice(&body).map_err(|error| {
        // Well-formed JSON of the wrong shape is unprocessable, not malformed.
        if error.classify() == serde_json::error::Category::Data {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                &format!("the body is not what this route takes: {error}"),
            )
        } else {
            Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                &format!("the body is not JSON: {error}"),
            )
        }
    })
}
