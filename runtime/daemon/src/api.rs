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
use flow_plan::{DestinationTarget, Plan, PlanProblems};
use flow_runtime::approval::Decision;
use flow_runtime::journal::Outcome;
use flow_runtime::runner::{self, RunRecord};
use flow_runtime::store::{
    Deletion, Deployment, Notification, NotificationQuery, RunQuery, RunRow, RunStatus, StoreError,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::server::{AccountId, Daemon, KeyHolder, Problem, joined, store_problem};
use crate::sources::DeployedFiles;
use crate::trace_step::TraceStep;

pub(crate) type Answer = Result<Response, Problem>;

/// The API's OpenAPI document, derived from the handlers below and the types
/// they take and answer, served at `/v1/openapi.json`.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "flowd",
        description = "Deploy workflows, start and inspect runs, decide approvals. Every request \
            carries an account's API key as `Authorization: Bearer KEY` and sees that account's \
            workflows and runs only. Errors are `application/problem+json` with a stable `code`."
    ),
    paths(
        deploy, workflows, undeploy, start_run, get_run, delete_run, trace, graph, test_from, runs, cancel,
        redrive, crate::migrate::migrate, decide, my_approvals, notifications, mark_read, delete_document
    ),
    components(schemas(ProblemDoc)),
    modifiers(&CommonAnswers),
    security(("api_key" = []))
)]
pub(crate) struct ApiDoc;

/// What every route has in common, added to each operation once rather
/// than written on each: the `api_key` bearer scheme, and the problems that
/// authentication, the store and body parsing answer.
struct CommonAnswers;

impl utoipa::Modify for CommonAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "api_key",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        let problem = |description: &str| {
            RefOr::T(
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        "application/problem+json",
                        Content::new(Some(Ref::from_schema_name("Problem"))),
                    )
                    .build(),
            )
        };
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let takes_body = operation.request_body.is_some();
                let mut answers = vec![
                    (
                        "401",
                        "No API key, or one of no account (`unauthenticated`)",
                    ),
                    (
                        "503",
                        "The store did not answer (`store_unavailable`); try again",
                    ),
                ];
                if takes_body {
                    answers.extend([
                        ("400", "The body is not JSON (`malformed_json`)"),
                        ("413", "The body is over 2 MiB (`body_too_large`)"),
                        (
                            "415",
                            "The body is not `application/json` (`unsupported_media_type`)",
                        ),
                        (
                            "422",
                            "The body is JSON of another shape (`invalid_request`)",
                        ),
                    ]);
                }
                for (status, description) in answers {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| problem(description));
                }
            }
        }
    }
}

/// An error answer (RFC 9457), as `crate::server::Problem` writes it.
#[derive(ToSchema)]
#[schema(as = Problem)]
#[allow(dead_code, reason = "describes the JSON that Problem builds")]
pub(crate) struct ProblemDoc {
    r#type: String,
    title: String,
    status: u16,
    /// Stable and documented: what a client branches on.
    code: String,
    detail: String,
    /// `does_not_check`: each error of the source (`code`, `message`, `line`, `column`).
    diagnostics: Option<Vec<Object>>,
    /// `invalid_input`: each place the input does not match (`path`, `expected`, `found`),
    /// at most 100, each part at most 160 characters.
    mismatches: Option<Vec<Object>>,
    /// `invalid_input`: how many mismatches there are past those listed.
    mismatches_omitted: Option<u64>,
    /// `invalid_plan`: each way the plan differs from what `flowc build` writes
    /// (`path`, a JSON Pointer into the plan, and `message`), at most 100, each
    /// at most 300 characters.
    problems: Option<Vec<Object>>,
    /// `invalid_plan`: validation stopped at the 100th problem; there may be more.
    more_problems: Option<bool>,
    /// `mcp_server_not_allowed`, `mcp_tool_not_allowed`: every MCP server or
    /// tool of the plan the account may not use (`code`, `message`), at most 20.
    refusals: Option<Vec<Object>>,
}

/// A JSON object, in documentation.
type Object = std::collections::BTreeMap<String, Value>;

#[derive(Serialize, ToSchema)]
struct Deployments {
    deployments: Vec<Deployment>,
}

/// What a deploy deployed.
#[derive(Serialize, ToSchema)]
struct Deployed {
    deployments: Vec<Deployment>,
    /// Of each workflow deployed: its runs of earlier versions parked or
    /// running, and how many of the parked could move to this version
    /// (`POST /v1/workflows/{workflow}/migrate`).
    earlier_runs: Vec<crate::migrate::EarlierRuns>,
    /// What the deploy accepted but a person should know: a workflow that
    /// can have more model calls in flight at once than this account runs
    /// (its `llm_concurrency`), whose calls past it would wait.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// A run's id and where it stands.
#[derive(Serialize, ToSchema)]
struct RunState {
    run_id: String,
    status: RunStatus,
}

#[derive(Serialize, ToSchema)]
struct RunSummary {
    run_id: String,
    workflow: String,
    status: RunStatus,
    created_ms: i64,
    updated_ms: i64,
}

#[derive(Serialize, ToSchema)]
struct Runs {
    runs: Vec<RunSummary>,
}

/// A run's journal: every step execution in the order recorded.
#[derive(Serialize, ToSchema)]
struct Trace {
    run_id: String,
    steps: Vec<TraceStep>,
    /// What happened to the run besides its steps: redrives, moves to
    /// other versions.
    history: Vec<flow_runtime::store::RunChange>,
}

/// A gate an approver may decide.
#[derive(Serialize, ToSchema)]
struct Gate {
    run_id: String,
    workflow: String,
    step_path: String,
    step_id: String,
    message: String,
    approvers: Vec<String>,
    /// How long after the gate opened it expires (milliseconds).
    expires_ms: Option<u64>,
    /// When it expires: RFC 3339, UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    /// When the run parked.
    created_ms: i64,
}

#[derive(Serialize, ToSchema)]
struct Gates {
    approvals: Vec<Gate>,
}

#[derive(Serialize, ToSchema)]
struct Notifications {
    notifications: Vec<Notification>,
}

#[derive(Serialize, ToSchema)]
struct Marked {
    marked: usize,
}

/// `POST /v1/workflows`: a `.flow` source compiled here, a set of files
/// compiled here (a workflow and what it imports), or a built plan.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
enum Deploy {
    Source(DeploySource),
    Files(DeployFiles),
    Plan(DeployPlan),
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeployFiles {
    /// Path → text: the `.flow` file whose workflows are deployed, the
    /// files it imports (at the paths its imports name, relative to it),
    /// and the `flow.lock` beside it if it has one. At most 256 files.
    files: std::collections::BTreeMap<String, String>,
    /// Which file's workflows are deployed; needed when `files` holds more
    /// than one `.flow` file.
    root: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeploySource {
    /// A `.flow` file's text.
    source: String,
    /// The source's file name, for diagnostics.
    path: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeployPlan {
    /// `flowc build` output.
    #[schema(value_type = Object)]
    plan: Value,
}

/// Deploys each workflow of a source or plan: a new version of a workflow
/// whose plan changed.
#[utoipa::path(
    post, path = "/v1/workflows", tag = "workflows", request_body = Deploy,
    responses(
        (status = 201, description = "Deployed", body = Deployed),
        (status = 422, description = "The source does not check (`does_not_check`); the plan is not one `flowc build` could have written, or is past flowd's bounds (`invalid_plan`, with `problems` and `more_problems`); a workflow names a department the account does not have (`unknown_department`), or a webhook endpoint or person its destinations deliver to that the account does not have (`unknown_destination`, every one named); the plan names an MCP server or tool the operator does not offer this account (`mcp_server_not_allowed`, `mcp_tool_not_allowed`; every one in `refusals`); or the account keeps as many deployed versions as its quota (`quota_exceeded`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 429, description = "The account's data takes its quota of the store, `stored_bytes` (`quota_exceeded`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn deploy(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: Deploy = json_body(&headers, body).map_err(|problem| {
        // Serde's words for an untagged enum say nothing useful.
        if problem.code() == "invalid_request" {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "send `source` (a .flow file's text, and optionally its `path`), `files` (path to text: a .flow file, what it imports and its flow.lock; with `root` naming the file to deploy) or `plan` (flowc build output)",
            )
        } else {
            problem
        }
    })?;
    // A plan from outside is held to what the compiler writes before it is
    // stored: the runtime trusts a plan's indices, numbers and schemas. A
    // plan compiled here is checked too, which costs one pass over it and
    // refuses a source whose plan is past flowd's bounds.
    let plan = match request {
        Deploy::Source(DeploySource { source, path }) => {
            let path = path.unwrap_or_else(|| "workflow.flow".to_string());
            compile_valid(&path, &DeployedFiles::single(&path, source))?
        }
        Deploy::Files(DeployFiles { files, root }) => {
            let files = DeployedFiles::new(files).map_err(|why| invalid_files(&why))?;
            let root = match root {
                Some(root) if files.contains(&root) => root,
                Some(root) => {
                    return Err(invalid_files(&format!(
                        "`root` {} is not among `files`",
                        flow_plan::cut(&root, 200)
                    )));
                }
                None => files.only_source().map(str::to_string).ok_or_else(|| {
                    invalid_files("`files` holds several .flow files (or none): name the one to deploy with `root`")
                })?,
            };
            compile_valid(&root, &files)?
        }
        Deploy::Plan(DeployPlan { plan }) => {
            let plan = Plan::from_json(&plan.to_string()).map_err(|e| {
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_plan",
                    &e.to_string(),
                )
            })?;
            plan.validate().map_err(|problems| {
                invalid_plan("the plan is not one flowc could have built", &problems)
            })?;
            plan
        }
    };
    // A department is one of the account's: a misspelt one would quietly
    // give the workflow no department context and its documents no owner.
    let departments = &daemon.config.people(&account).departments;
    for workflow in &plan.workflows {
        if let Some(department) = &workflow.department
            && !departments.contains_key(department)
        {
            let known: Vec<&str> = departments.keys().map(String::as_str).collect();
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_department",
                &format!(
                    "workflow `{}` names department `{department}`, which is not one of this account's ({})",
                    workflow.name,
                    if known.is_empty() {
                        "it has none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
    }
    destinations_known(&daemon, &account, &plan)?;
    mcp_allowed(&daemon, &account, &plan)?;
    let kept = daemon.deployments(&account).await.map_err(store_problem)?;
    let quota = daemon.config.quotas(&account).deployments;
    let new_versions = plan
        .workflows
        .iter()
        .filter(|w| {
            !kept
                .iter()
                .any(|d| d.workflow == w.name && d.plan_hash == plan.hash)
        })
        .count();
    if kept.len() + new_versions > quota {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "quota_exceeded",
            &format!(
                "this account keeps {} deployed versions and this deploy adds {new_versions}; its quota (deployments) is {quota}",
                kept.len()
            ),
        ));
    }
    if new_versions > 0 {
        // As the store keeps it: compact JSON.
        let size = serde_json::to_vec(&plan).map_or(0, |json| json.len() as u64);
        daemon.stored.admit(&daemon, &account, size).await?;
    }
    daemon.store.put_plan(&plan).await.map_err(store_problem)?;
    let mut deployed = Vec::new();
    for workflow in &plan.workflows {
        deployed.push(
            daemon
                .deploy(&account, &workflow.name, &plan.hash)
                .await
                .map_err(store_problem)?,
        );
    }
    let mut earlier_runs = Vec::new();
    for workflow in &plan.workflows {
        earlier_runs
            .push(crate::migrate::earlier_runs(&daemon, &account, &workflow.name, &plan).await?);
    }
    let limit = daemon.config.llm_concurrency(&account) as u64;
    let warnings = plan
        .workflows
        .iter()
        .filter_map(|workflow| {
            let calls = flow_plan::budget::Budget::of(workflow).model_calls;
            (calls > limit).then(|| {
                format!(
                    "workflow `{}` can have {calls} model calls in flight at once, more than the {limit} this account runs at once (llm_concurrency): the calls past it wait, and the wait counts against the workflow's timeout",
                    workflow.name
                )
            })
        })
        .collect();
    Ok((
        StatusCode::CREATED,
        axum::Json(Deployed {
            deployments: deployed,
            earlier_runs,
            warnings,
        }),
    )
        .into_response())
}

/// A 422 when `plan` uses an MCP server or tool that the account may not
/// (`tenant_mcp::refusals`): the first refusal's code, and every refusal.
fn mcp_allowed(daemon: &Daemon, account: &str, plan: &Plan) -> Result<(), Problem> {
    // The configuration is this process's for its whole life: a plan that
    // passed for an account passes again, and a start need not walk it.
    let key = (account.to_string(), plan.hash.clone());
    let mut passed = daemon.mcp_passed.lock().unwrap_or_else(|p| p.into_inner());
    if passed.contains(&key) {
        return Ok(());
    }
    let refusals = crate::tenant_mcp::refusals(&daemon.config, account, plan);
    let Some(first) = refusals.first() else {
        passed.insert(key);
        return Ok(());
    };
    Err(
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, first.code, &first.message).with(
            "refusals",
            refusals
                .iter()
                .map(|refusal| json!({ "code": refusal.code, "message": refusal.message }))
                .collect(),
        ),
    )
}

/// 422 `invalid_plan` with each problem the validator found: at most
/// `flow_plan::limits::MAX_PROBLEMS`, each a JSON Pointer and a short message.
fn invalid_plan(detail: &str, found: &PlanProblems) -> Problem {
    let problems: Vec<Value> = found
        .problems
        .iter()
        .map(|p| json!({ "path": p.path, "message": p.message }))
        .collect();
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_plan",
        &format!(
            "{detail}: {} problem(s){}",
            problems.len(),
            if found.stopped {
                ", and validation stopped there"
            } else {
                ""
            }
        ),
    )
    .with("problems", Value::Array(problems))
    .with("more_problems", Value::Bool(found.stopped))
}

/// 422 `invalid_request` for a file set flowd will not compile.
fn invalid_files(why: &str) -> Problem {
    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", why)
}

/// `root` of `files` compiled as `flowc build` would, and held to flowd's
/// bounds, or a 422 saying why not.
fn compile_valid(root: &str, files: &DeployedFiles) -> Result<Plan, Problem> {
    let plan = compile(root, files)?;
    plan.validate().map_err(|problems| {
        invalid_plan(
            &format!("{root} compiles to a plan flowd refuses"),
            &problems,
        )
    })?;
    Ok(plan)
}

/// `root` checked (through the compiler's one entry point, its imports and
/// `flow.lock` from `files`) and lowered, or a 422 listing every error.
fn compile(path: &str, files: &DeployedFiles) -> Result<Plan, Problem> {
    let checked = flow_compiler::check(path, files).map_err(|error| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            &format!("{}: {}", error.path, error.message),
        )
    })?;
    if checked.has_errors() {
        let errors: Vec<Value> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
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
            &format!("{path} has {} error(s)", errors.len()),
        )
        .with("diagnostics", Value::Array(errors)));
    }
    flow_compiler::lower_into(checked).ok_or_else(|| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_check",
            "the source could not be lowered to a plan",
        )
    })
}

/// The account's deployments, by workflow then version.
#[utoipa::path(
    get, path = "/v1/workflows", tag = "workflows",
    responses((status = 200, description = "The deployments", body = Deployments))
)]
pub(crate) async fn workflows(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
) -> Answer {
    let deployments = daemon.deployments(&account).await.map_err(store_problem)?;
    Ok(axum::Json(Deployments {
        deployments: deployments.to_vec(),
    })
    .into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartRun {
    workflow: String,
    /// The deployed version; the latest by default.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 4_294_967_295_u64)]
    version: Option<u32>,
    /// The workflow's input, checked against its input schema.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    input: Value,
}

/// A version number written as any JSON number with no fraction (`2` or
/// `2.0`), as JSON Schema's `integer` allows.
fn whole_number<'de, D: serde::Deserializer<'de>>(
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
    fn input(&self) -> Value {
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
    let deployments = daemon.deployments(&account).await.map_err(store_problem)?;
    if let Some(key) = &key
        && let Some(first) = daemon
            .store
            .run_by_key(&account, key)
            .await
            .map_err(store_problem)?
    {
        return replayed(first, key, &request, &deployments);
    }
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
    // The configuration may have changed since the deploy.
    mcp_allowed(&daemon, &account, &plan)?;
    let quota = daemon.config.quotas(&account).runs_in_flight;
    if daemon.runs_in_flight(&account) >= quota {
        return Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exceeded",
            &format!(
                "this account has {quota} runs in flight, its quota (runs_in_flight); start this one when one of them has ended or parked"
            ),
        )
        .retry_after(1));
    }
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
                daemon.spawn_run(plan, account, workflow, run_id, input, true);
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
        return replayed(first, &key, &request, &deployments);
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
fn replayed(first: RunRow, key: &str, request: &StartRun, deployments: &[Deployment]) -> Answer {
    // A version named must be the one the first request ran; with none
    // named, a retry after a deploy still answers the first run.
    let other_version = request.version.is_some_and(|version| {
        !deployments.iter().any(|d| {
            d.workflow == request.workflow && d.version == version && d.plan_hash == first.plan_hash
        })
    });
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
    Ok(axum::Json(Trace {
        run_id: id,
        steps: records.into_iter().map(TraceStep::from).collect(),
        history,
    })
    .into_response())
}

/// A run written as a `test` block of the flow language.
#[derive(Serialize, ToSchema)]
struct RunTest {
    run_id: String,
    /// The block, after an `import` of the workflow's file, laid out as
    /// `flowc fmt` writes it: save it as `NAME.test.flow` beside the
    /// workflow and `flowc test` runs it.
    test: String,
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
    let plan = daemon.plan(&row.plan_hash).await.map_err(store_problem)?;
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
    let plan = daemon.plan(&row.plan_hash).await.map_err(store_problem)?;
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
    before: Option<String>,
}

/// The account's runs, newest first.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs", params(RunFilter),
    responses(
        (status = 200, description = "The runs", body = Runs),
        (status = 400, description = "A filter is not understood (`invalid_query`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "`before` names no run of this account (`unknown_run`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn runs(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    filter: Result<Query<RunFilter>, QueryRejection>,
) -> Answer {
    let Query(filter) = filter.map_err(invalid_query)?;
    let before = match &filter.before {
        Some(id) => {
            let run = own_run(&daemon, &account, id).await?;
            Some((run.created_ms, run.id))
        }
        None => None,
    };
    let query = RunQuery {
        workflow: filter.workflow,
        status: filter.status,
        limit: filter.limit.unwrap_or(100).min(1_000),
        before,
    };
    let rows = daemon
        .store
        .account_runs(&account, &query)
        .await
        .map_err(store_problem)?;
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
    Ok(axum::Json(Runs { runs }).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct UndeployQuery {
    /// One version to retire; all of the workflow's by default.
    #[param(minimum = 1, maximum = 4_294_967_295_u64)]
    version: Option<u32>,
}

#[derive(Serialize, ToSchema)]
struct Retired {
    /// How many deployed versions were retired.
    retired: usize,
}

/// Retires a workflow's deployed versions (one, or all): new runs can no
/// longer start them, runs already started go on, and a version number is
/// never given again. A plan nothing uses any more is deleted.
#[utoipa::path(
    delete, path = "/v1/workflows/{workflow}", tag = "workflows",
    params(("workflow" = String, Path, description = "The workflow's name"), UndeployQuery),
    responses(
        (status = 200, description = "Retired", body = Retired),
        (status = 400, description = "A malformed query (`invalid_query`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "No such deployment in this account (`unknown_workflow`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn undeploy(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(workflow): Path<String>,
    query: Result<Query<UndeployQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    let retired = daemon
        .undeploy(&account, &workflow, query.version)
        .await
        .map_err(store_problem)?;
    if retired == 0 {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_workflow",
            &match query.version {
                Some(v) => format!("no version {v} of workflow `{workflow}` is deployed"),
                None => format!("no workflow `{workflow}` is deployed"),
            },
        ));
    }
    Ok(axum::Json(Retired { retired }).into_response())
}

#[derive(Serialize, ToSchema)]
struct Deleted {
    deleted: bool,
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
        Deletion::Deleted => Ok(axum::Json(Deleted { deleted: true }).into_response()),
        Deletion::NotEnded(status) => Err(Problem::new(
            StatusCode::CONFLICT,
            "run_not_ended",
            &format!(
                "run `{id}` is {status}: cancel it first (a cancelled run can be deleted 30 s after its cancel)"
            ),
        )),
        Deletion::Unknown => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_run",
            &format!("no run `{id}`"),
        )),
    }
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct DocumentQuery {
    /// The document's collection.
    collection: String,
    /// The document's title.
    title: String,
}

/// Deletes a knowledge-base document of this account (every version).
#[utoipa::path(
    delete, path = "/v1/kb/documents", tag = "knowledge",
    params(DocumentQuery),
    responses(
        (status = 200, description = "Deleted", body = Deleted),
        (status = 400, description = "A malformed query (`invalid_query`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "No such document in this account (`unknown_document`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn delete_document(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    query: Result<Query<DocumentQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    if daemon
        .store
        .delete_document(&account, &query.collection, &query.title)
        .await
        .map_err(store_problem)?
    {
        Ok(axum::Json(Deleted { deleted: true }).into_response())
    } else {
        Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_document",
            &format!("no document `{}/{}`", query.collection, query.title),
        ))
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Redrive {
    /// Go on on this version of the workflow (one where the run can go on
    /// from where it stopped); its own version by default.
    version: Option<u32>,
}

/// Continues a failed or cancelled run from where it stopped: what completed
/// is kept (not called again); the steps that failed it run again with their
/// retry budget anew, then the rest; the workflow's deadline starts over.
/// The trace keeps every attempt. At most `MAX_REDRIVES` times per run.
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
        None => daemon.plan(&row.plan_hash).await.map_err(store_problem)?,
        Some(number) => {
            let versions = crate::migrate::versions_of(&daemon, &account, &row.workflow).await?;
            let target = crate::migrate::version(&versions, Some(number), &row.workflow)?;
            let plan = daemon
                .plan(&target.plan_hash)
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
    let to_plan = request.version.map(|_| plan.hash.as_str());
    if daemon
        .store
        .redrive_run(&id, to_plan)
        .await
        .map_err(store_problem)?
        .is_none()
    {
        let refused = flow_runtime::store::RedriveRefused::of(&row);
        return Err(Problem::new(
            StatusCode::CONFLICT,
            refused.code(),
            &refused.to_string(),
        ));
    }
    daemon.spawn_run(
        plan,
        row.account,
        row.workflow,
        id.clone(),
        row.input,
        false,
    );
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Decide {
    /// The email of the person deciding: with an account's key, the account
    /// vouches for them; a user's key decides as its user (leave it out).
    approver: Option<String>,
    approved: bool,
    comment: Option<String>,
}

/// Approves or rejects a pending gate, exactly once, then continues the run
/// in the background.
#[utoipa::path(
    post, path = "/v1/runs/{id}/approvals/{step_path}", tag = "approvals", request_body = Decide,
    params(
        ("id" = String, Path, description = "The run's id"),
        ("step_path" = String, Path, description = "The gate's execution path (`gates/legal/l`)"),
    ),
    responses(
        (status = 202, description = "Decided; the run continues", body = RunState),
        (status = 400, description = "No approver, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "The approver may not decide this gate (`not_an_approver`), or a user's key names another approver (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "No such run in this account (`unknown_run`), or no gate at this path (`unknown_step`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 409, description = "Already decided, expired, or the run ended (`decision_refused`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn decide(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    Path((id, step_path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: Decide = json_body(&headers, body)?;
    let approver = holder.acting_as(request.approver, "approver")?;
    let run = own_run(&daemon, &account, &id).await?;
    let decision = Decision {
        groups: daemon.config.people(&account).groups_of(&approver),
        approver,
        approved: request.approved,
        comment: request.comment,
        decided_at: flow_runtime::time::now_rfc3339(),
    };
    daemon.decide(run, step_path, decision).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(RunState {
            run_id: id,
            status: RunStatus::Running,
        }),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ApproverQuery {
    /// The approver's email: with an account's key, the account vouches for
    /// them; a user's key reads as its user (leave it out).
    approver: Option<String>,
}

/// The gates of the account's parked runs that this approver (or an
/// approver group of theirs) may decide.
#[utoipa::path(
    get, path = "/v1/approvals", tag = "approvals", params(ApproverQuery),
    responses(
        (status = 200, description = "The gates", body = Gates),
        (status = 400, description = "No approver, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "A user's key naming another approver (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn my_approvals(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    query: Result<Query<ApproverQuery>, QueryRejection>,
) -> Answer {
    let Query(ApproverQuery { approver }) = query.map_err(invalid_query)?;
    let approver = holder.acting_as(approver, "approver")?;
    let groups = daemon.config.people(&account).groups_of(&approver);
    let parked = RunQuery {
        workflow: None,
        status: Some(RunStatus::PendingApproval),
        limit: 1_000,
        before: None,
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
            approvals.push(Gate {
                run_id: run.id.clone(),
                workflow: run.workflow.clone(),
                step_path: gate.path,
                step_id: gate.step_id,
                message: gate.message,
                approvers: gate.approvers,
                expires_ms: gate.expires_ms,
                expires_at: gate.expires_at,
                created_ms: run.updated_ms,
            });
        }
    }
    Ok(axum::Json(Gates { approvals }).into_response())
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReaderQuery {
    /// The reader's email: with an account's key, the account vouches for
    /// them; a user's key reads as its user (leave it out).
    reader: Option<String>,
    /// Only the ones this reader has not marked read.
    #[serde(default)]
    unread: bool,
    /// At most this many, newest first (default 100; more is read as 1,000).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<usize>,
}

/// A workflow's destinations name the account's own webhook endpoints and
/// people (an approver group, a department, or an address flowd may mail):
/// one it does not have would fail at every delivery, found only by its
/// run's trace. Every missing name is listed in one answer.
fn destinations_known(daemon: &Daemon, account: &str, plan: &Plan) -> Result<(), Problem> {
    let people = daemon.config.people(account);
    let mut missing = Vec::new();
    for workflow in &plan.workflows {
        for destination in &workflow.destinations {
            match &destination.target {
                DestinationTarget::Webhook { endpoint } => {
                    if !people.webhooks.iter().any(|hook| &hook.name == endpoint) {
                        missing.push(format!(
                            "workflow `{}` delivers to webhook endpoint `{endpoint}`, which is not one of this account's",
                            workflow.name
                        ));
                    }
                }
                DestinationTarget::Email { to, .. } => {
                    for name in to {
                        if people.destination_recipients(name).is_empty() {
                            missing.push(format!(
                                "workflow `{}` emails `{name}`, which is no approver group, department or address of this account's",
                                workflow.name
                            ));
                        }
                    }
                }
                DestinationTarget::Kb { .. } => {}
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_destination",
        &missing.join("; "),
    ))
}

/// Handoffs to the reader's departments and approval requests to them or
/// their approver groups, newest first.
#[utoipa::path(
    get, path = "/v1/notifications", tag = "notifications", params(ReaderQuery),
    responses(
        (status = 200, description = "The notifications", body = Notifications),
        (status = 400, description = "No reader, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "A user's key naming another reader (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn notifications(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    query: Result<Query<ReaderQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    let reader = holder.acting_as(query.reader, "reader")?;
    let audiences = daemon.config.people(&account).audiences_of(&reader);
    let wanted = NotificationQuery {
        unread_only: query.unread,
        limit: query.limit.unwrap_or(100).min(1_000),
    };
    let list = daemon
        .store
        .notifications(&account, &audiences, &reader, &wanted)
        .await
        .map_err(store_problem)?;
    Ok(axum::Json(Notifications {
        notifications: list,
    })
    .into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct MarkRead {
    /// As in `GET /v1/notifications`.
    reader: Option<String>,
    #[schema(max_items = 1000)]
    ids: Vec<i64>,
}

/// The most notifications one request marks: each is a write in one
/// transaction that other writers wait for.
const MARK_AT_ONCE: usize = 1_000;

/// Marks notifications read for a reader; answers how many of them the
/// account has.
#[utoipa::path(
    post, path = "/v1/notifications/read", tag = "notifications", request_body = MarkRead,
    responses(
        (status = 200, description = "Marked", body = Marked),
        (status = 400, description = "No reader, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "A user's key naming another reader (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn mark_read(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: MarkRead = json_body(&headers, body)?;
    let reader = holder.acting_as(request.reader, "reader")?;
    if request.ids.len() > MARK_AT_ONCE {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            &format!("mark at most {MARK_AT_ONCE} notifications at once"),
        ));
    }
    let marked = daemon
        .store
        .mark_read(&account, &reader, &request.ids)
        .await
        .map_err(store_problem)?;
    Ok(axum::Json(Marked { marked }).into_response())
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
        .account_run(account, id)
        .await
        .map_err(store_problem)?
        .ok_or_else(|| {
            Problem::new(
                StatusCode::NOT_FOUND,
                "unknown_run",
                &format!("no run `{id}`"),
            )
        })
}

/// The body as `T`, or a problem saying what is wrong with it.
pub(crate) fn json_body<T: DeserializeOwned>(
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
