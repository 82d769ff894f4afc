//! `/v1/workflows`: deploying a source, a set of files or a plan (compiled
//! and validated here first), listing the versions, undeploying.

use super::*;
use crate::compile_worker::compile_in_worker;
use crate::freed_off_worker::FreedOffWorker;

#[derive(Serialize, ToSchema)]
pub(super) struct Deployments {
    pub(super) deployments: Vec<Deployment>,
}

/// What a deploy deployed.
#[derive(Serialize, ToSchema)]
pub(super) struct Deployed {
    pub(super) deployments: Vec<Deployment>,
    /// Of each workflow deployed: its runs of earlier versions parked or
    /// running, and how many of the parked could move to this version
    /// (`POST /v1/workflows/{workflow}/migrate`).
    pub(super) earlier_runs: Vec<crate::migrate::EarlierRuns>,
    /// What the deploy accepted but a person should know: a workflow that
    /// can have more model calls in flight at once than this account runs
    /// (its `llm_concurrency`), whose calls past it would wait.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) warnings: Vec<String>,
}

/// `POST /v1/workflows`: a `.flow` source compiled here, a set of files
/// compiled here (a workflow and what it imports), or a built plan.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(
    dead_code,
    reason = "describes the request, which is read as `DeployBody`"
)]
pub(super) enum Deploy {
    Source(DeploySource),
    Files(DeployFiles),
    Plan(DeployPlan),
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "describes the request, which is read as `DeployBody`"
)]
pub(super) struct DeployFiles {
    /// Path → text: the `.flow` file whose workflows are deployed, the
    /// files it imports (at the paths its imports name, relative to it),
    /// and the `flow.lock` beside it if it has one. At most 256 files.
    pub(super) files: std::collections::BTreeMap<String, String>,
    /// Which file's workflows are deployed; needed when `files` holds more
    /// than one `.flow` file.
    pub(super) root: Option<String>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "describes the request, which is read as `DeployBody`"
)]
pub(super) struct DeploySource {
    /// A `.flow` file's text.
    pub(super) source: String,
    /// The source's file name, for diagnostics.
    pub(super) path: Option<String>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "describes the request, which is read as `DeployBody`"
)]
pub(super) struct DeployPlan {
    /// `flowc build` output.
    #[schema(value_type = Object)]
    pub(super) plan: Value,
}

/// A deploy request as it is read: [`Deploy`]'s fields in one pass over
/// the body, a plan kept as its text. A plan is parsed once, by
/// `Plan::from_json`, which bounds its depth itself: read into a tree of
/// values first, it cost twice the time and the memory, and a plan of
/// deeply nested branches that `flowc build` wrote was refused past
/// serde_json's 128 levels.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployBody<'a> {
    source: Option<String>,
    path: Option<String>,
    files: Option<std::collections::BTreeMap<String, String>>,
    root: Option<String>,
    #[serde(borrow)]
    plan: Option<&'a serde_json::value::RawValue>,
}

/// The longest a deploy waits for a place to compile in (other deploys of
/// other accounts, each at most `compile_seconds`): within the 60 s a
/// connection may stay silent.
const COMPILE_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a deploy request may hold, for those that hold something else.
const DEPLOY_SHAPE: &str = "send `source` (a .flow file's text, and optionally its `path`), `files` (path to text: a .flow file, what it imports and its flow.lock; with `root` naming the file to deploy) or `plan` (flowc build output)";

/// Deploys each workflow of a source or plan: a new version of a workflow
/// whose plan changed.
#[utoipa::path(
    post, path = "/v1/workflows", tag = "workflows", request_body = Deploy,
    responses(
        (status = 201, description = "Deployed", body = Deployed),
        (status = 422, description = "The source does not check (`does_not_check`); it declares no workflow (`no_workflow`); the plan is not one `flowc build` could have written, or is past flowd's bounds (`invalid_plan`, with `problems` and `more_problems`); a workflow names a department the account does not have (`unknown_department`), or a webhook endpoint or person its destinations deliver to that the account does not have (`unknown_destination`, every one named); the plan names an MCP server or tool the operator does not offer this account (`mcp_server_not_allowed`, `mcp_tool_not_allowed`; every one in `refusals`); or the account keeps as many deployed versions as its quota (`quota_exceeded`); or compiling the source took more than `[limits] compile_seconds` of CPU or `compile_memory` (`compile_limit`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 429, description = "The account's data takes its quota of the store, `stored_bytes` (`quota_exceeded`); or the account has two deploys under way in this flowd (`deploys_in_flight`: deploy again once one has answered)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 500, description = "The compiler failed on the source (`compiler_failed`): a bug in flow, which flowd's log describes", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 503, description = "Every place for compiling stayed taken for 30 s (`compiles_busy`): deploy again shortly", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn deploy(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = json_bytes(&headers, body)?;
    let request: DeployBody = from_json_body(&body).map_err(|problem| {
        if problem.code() == "invalid_request" {
            invalid_files(&format!("{DEPLOY_SHAPE}; {}", problem.detail()))
        } else {
            problem
        }
    })?;
    // Compiling and validating take a core for as long as the file is
    // large (a third of a second at 100,000 steps), a few at once; a
    // source compiles in a process of its own (`compile_worker`), which
    // stops when the client hangs up, and a plan is validated off the
    // async workers, which every run and request of the process shares.
    // The place goes with the work that goes on after a client hangs up
    // (validating, reading the worker's plan), and ends with it.
    let _deploying = daemon.count_deploy(&account)?;
    // A deploy that waits longer answers, rather than let the connection's
    // idle timeout close it unanswered.
    let place = tokio::time::timeout(
        COMPILE_QUEUE_WAIT,
        Arc::clone(&daemon.compiles).acquire_owned(),
    )
    .await
    .map_err(|_| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "compiles_busy",
            &format!(
                "every place for compiling was taken for {} s: deploy again shortly",
                COMPILE_QUEUE_WAIT.as_secs()
            ),
        )
        .retry_after(5)
    })?;
    let Ok(place) = place else {
        unreachable!("the semaphore of compiles is never closed");
    };
    let limits = daemon.config.limits.compile_limits();
    let (plan, size) = match deployable(request, &body)? {
        Deployable::Source { root, files } => compile_in_worker(root, files, limits, place).await?,
        Deployable::Plan(plan) => {
            joined(tokio::task::spawn_blocking(move || {
                let _place = place;
                valid_plan(plan, limits.plan_bytes)
            }))
            .await?
        }
    };
    // Freed off the async worker however the deploy ends.
    let plan = FreedOffWorker::new(plan);
    // Regression (an audit): a source of recipes alone was stored as a
    // plan no deployment names, counted by no quota and never deleted.
    if plan.workflows.is_empty() {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_workflow",
            "the source declares no workflow: a deploy is of workflows, and the recipes, types and servers they use come with them",
        ));
    }
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
        daemon.stored.admit(&daemon, &account, size).await?;
    }
    // Written out, inserted and synced off the async worker.
    let plan = joined(daemon.with_store_off_worker(move |store, runtime| {
        runtime
            .block_on(store.put_plan(&plan))
            .map_err(store_problem)?;
        Ok(plan)
    }))
    .await?;
    // A stored copy that did not load is mended by that put.
    daemon.forget_refusal_of_plan(&plan.hash);
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

/// 422 `invalid_plan` with each problem the validator found: at most
/// `flow_plan::limits::MAX_PROBLEMS`, each a JSON Pointer and a short message.
pub(crate) fn invalid_plan(detail: &str, found: &PlanProblems) -> Problem {
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

/// What a deploy request deploys.
enum Deployable {
    /// `root` of `files`, to compile.
    Source { root: String, files: DeployedFiles },
    /// A plan built elsewhere, as the request's text of it, to validate.
    Plan(Bytes),
}

/// What a deploy request read from `body` deploys, or why it is refused.
fn deployable(request: DeployBody<'_>, body: &Bytes) -> Result<Deployable, Problem> {
    let shape = |why: &str| invalid_files(&format!("{DEPLOY_SHAPE}; {why}"));
    let DeployBody {
        source,
        path,
        files,
        root,
        plan,
    } = request;
    if path.is_some() && source.is_none() {
        return Err(shape("`path` names a `source`"));
    }
    if root.is_some() && files.is_none() {
        return Err(shape("`root` names one of `files`"));
    }
    Ok(match (source, files, plan) {
        (Some(source), None, None) => {
            let root = path.unwrap_or_else(|| "workflow.flow".to_string());
            DeployedFiles::check_path(&root).map_err(|why| invalid_files(&why))?;
            let files = DeployedFiles::single(&root, source);
            Deployable::Source { root, files }
        }
        (None, Some(files), None) => {
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
            Deployable::Source { root, files }
        }
        // The plan's text is a part of the body, which serde_json read
        // from it without a copy.
        (None, None, Some(plan)) => Deployable::Plan(body.slice_ref(plan.get().as_bytes())),
        (None, None, None) => return Err(shape("the body holds none of them")),
        _ => return Err(shape("the body holds more than one of them")),
    })
}

/// A plan from outside, held to what the compiler writes before it is
/// stored (the runtime trusts a plan's indices, numbers and schemas), and
/// the size of its JSON as the store keeps it (compact).
fn valid_plan(plan: Bytes, most_bytes: u64) -> Result<(Plan, u64), Problem> {
    // serde_json took the plan as a string of the body: UTF-8 already.
    let text = std::str::from_utf8(&plan).map_err(|e| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_plan",
            &e.to_string(),
        )
    })?;
    let plan = Plan::from_json(text).map_err(|e| {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_plan",
            &e.to_string(),
        )
    })?;
    plan.validate_within(most_bytes).map_err(|problems| {
        invalid_plan("the plan is not one flowc could have built", &problems)
    })?;
    if let Some(gate) = plan.gates_never_asked().first() {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_plan",
            &format!(
                "`{gate}` is an approval in the workflow's `on_error` handler, which a failed run never asks (E213)"
            ),
        ));
    }
    let size = crate::plan_cache::weight(&plan) as u64;
    Ok((plan, size))
}

/// 422 `invalid_request` for a file set flowd will not compile.
pub(super) fn invalid_files(why: &str) -> Problem {
    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", why)
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

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct UndeployQuery {
    /// One version to retire; all of the workflow's by default.
    #[param(minimum = 1, maximum = 4_294_967_295_u64)]
    version: Option<u32>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Retired {
    /// How many deployed versions were retired.
    pub(super) retired: usize,
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
    // Its last version gone, the workflow's metrics go too.
    let left = daemon.deployments(&account).await.map_err(store_problem)?;
    if !left.iter().any(|d| d.workflow == workflow) {
        daemon.metrics.forget_workflow(&account, &workflow);
    }
    crate::storage::StoredBytes::measure_soon(&daemon, &account);
    Ok(axum::Json(Retired { retired }).into_response())
}

/// A workflow's destinations name the account's own webhook endpoints and
/// people (an approver group, a department, or an address flowd may mail):
/// one it does not have would fail at every delivery, found only by its
/// run's trace. Every missing name is listed in one answer.
pub(super) fn destinations_known(
    daemon: &Daemon,
    account: &str,
    plan: &Plan,
) -> Result<(), Problem> {
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
