//! Moving runs to other versions of their workflow: `POST
//! /v1/workflows/{workflow}/migrate`, what a deploy says of the runs of
//! earlier versions, and a redrive on a newer version. Whether a run can
//! move is `flow_runtime::versions`' answer; a run moves only where it can
//! go on, and keeps its plan otherwise.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use flow_plan::Plan;
use flow_plan::compat::Incompatibility;
use flow_runtime::store::{Deployment, RunQuery, RunRow, RunStatus};
use flow_runtime::versions::Mover;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::{Answer, json_body};
use crate::server::{AccountId, Daemon, Problem, store_problem};

/// The most runs one migration (or a deploy's count) looks at: each is a
/// comparison and a store write.
const RUNS_AT_ONCE: usize = 1_000;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Migrate {
    /// The version whose parked runs move (default: every earlier one).
    from_version: Option<u32>,
    /// The version they move to (default: the latest).
    to_version: Option<u32>,
    /// Say what would move, and move nothing.
    #[serde(default)]
    dry_run: bool,
}

/// What a migration did (or, in a dry run, would do).
#[derive(Serialize, ToSchema)]
pub(crate) struct Migration {
    workflow: String,
    to_version: u32,
    dry_run: bool,
    /// The runs moved (that would move).
    moved: Vec<String>,
    /// The parked runs that cannot move, each with why.
    refused: Vec<Refused>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Refused {
    run_id: String,
    from_version: Option<u32>,
    problems: Vec<MoveProblem>,
}

/// One reason a run cannot go on on the other version (`flowc explain
/// CODE`).
#[derive(Serialize, ToSchema)]
pub(crate) struct MoveProblem {
    code: String,
    /// Where the run waits or stopped.
    place: String,
    /// The step the problem is about.
    step: String,
    reason: String,
}

impl MoveProblem {
    fn of(problem: Incompatibility) -> MoveProblem {
        MoveProblem {
            code: problem.code.as_str().to_string(),
            place: problem.place,
            step: problem.step,
            reason: problem.reason,
        }
    }
}

/// Of a workflow just deployed: its runs of earlier versions that are
/// parked or running, and how many of the parked could move to it.
#[derive(Serialize, ToSchema)]
pub(crate) struct EarlierRuns {
    workflow: String,
    parked: usize,
    running: usize,
    /// Parked runs that `migrate` would move to the new version.
    movable: usize,
}

/// Moves the parked runs of earlier versions of a workflow to a version
/// where each can go on (its gates, and what it completed, are there with
/// compatible types); the others keep their version, each with why.
#[utoipa::path(
    post, path = "/v1/workflows/{workflow}/migrate", tag = "workflows", request_body = Migrate,
    params(("workflow" = String, Path, description = "The workflow's name")),
    responses(
        (status = 200, description = "Moved what could move (or, in a dry run, what would)", body = Migration),
        (status = 404, description = "No such workflow (`unknown_workflow`) or version (`unknown_version`) in this account", body = crate::api::ProblemDoc, content_type = "application/problem+json"),
        (status = 422, description = "`from_version` is not before `to_version`: runs move forward only (`invalid_request`)", body = crate::api::ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn migrate(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Path(workflow): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: Migrate = json_body(&headers, body)?;
    let versions = versions_of(&daemon, &account, &workflow).await?;
    let target = version(&versions, request.to_version, &workflow)?;
    let from = request
        .from_version
        .map(|n| version(&versions, Some(n), &workflow))
        .transpose()?;
    // Runs move forward only (below): a move back was answered with
    // nothing moved and nothing refused, and no word of why (an audit).
    if let Some(from) = from
        && from.version >= target.version
    {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            &format!(
                "runs move forward only: from_version {} is not before to_version {}",
                from.version, target.version
            ),
        ));
    }
    let new_plan = daemon
        .plan(&account, &target.plan_hash)
        .await
        .map_err(store_problem)?;
    let number_of: HashMap<&str, u32> = versions
        .iter()
        .map(|d| (d.plan_hash.as_str(), d.version))
        .collect();
    let mut migration = Migration {
        workflow: workflow.clone(),
        to_version: target.version,
        dry_run: request.dry_run,
        moved: Vec::new(),
        refused: Vec::new(),
    };
    let candidates: Vec<RunRow> = runs_of(&daemon, &account, &workflow, RunStatus::PendingApproval)
        .await?
        .into_iter()
        .filter(|run| {
            // Regression: a run of a newer version was moved back to an
            // older one named by `to_version`. Runs move forward only (a
            // version deleted since keeps its runs movable).
            let earlier = number_of
                .get(run.plan_hash.as_str())
                .is_none_or(|version| *version < target.version);
            earlier && from.is_none_or(|from| from.plan_hash == run.plan_hash)
        })
        .collect();
    let old_plans = plans_of(&daemon, &candidates).await?;
    let movers = movers_to(&old_plans, &new_plan, &workflow);
    for run in candidates {
        let problems = problems_of(&daemon, &movers, &run).await?;
        if !problems.is_empty() {
            migration.refused.push(Refused {
                run_id: run.id,
                from_version: number_of.get(run.plan_hash.as_str()).copied(),
                problems: problems.into_iter().map(MoveProblem::of).collect(),
            });
            continue;
        }
        // A run decided, cancelled or moved meanwhile stays as it is.
        if request.dry_run
            || daemon
                .store
                .move_run(&run.id, &run.plan_hash, &target.plan_hash)
                .await
                .map_err(store_problem)?
        {
            migration.moved.push(run.id);
        }
    }
    Ok(axum::Json(migration).into_response())
}

/// What a deploy of `plan` says of `workflow`'s runs of earlier versions.
pub(crate) async fn earlier_runs(
    daemon: &Arc<Daemon>,
    account: &str,
    workflow: &str,
    plan: &Plan,
) -> Result<EarlierRuns, Problem> {
    let parked: Vec<RunRow> = runs_of(daemon, account, workflow, RunStatus::PendingApproval)
        .await?
        .into_iter()
        .filter(|run| run.plan_hash != plan.hash)
        .collect();
    let running = runs_of(daemon, account, workflow, RunStatus::Running)
        .await?
        .into_iter()
        .filter(|run| run.plan_hash != plan.hash)
        .count();
    let old_plans = plans_of(daemon, &parked).await?;
    let movers = movers_to(&old_plans, plan, workflow);
    let mut movable = 0;
    for run in &parked {
        if problems_of(daemon, &movers, run).await?.is_empty() {
            movable += 1;
        }
    }
    Ok(EarlierRuns {
        workflow: workflow.to_string(),
        parked: parked.len(),
        running,
        movable,
    })
}

/// Why `run` cannot go on on `new`, from where it stands: empty when it can.
pub(crate) async fn problems_moving(
    daemon: &Arc<Daemon>,
    run: &RunRow,
    new: &Plan,
) -> Result<Vec<Incompatibility>, Problem> {
    let old = daemon
        .plan(&run.account, &run.plan_hash)
        .await
        .map_err(store_problem)?;
    let movers = HashMap::from([(run.plan_hash.as_str(), Mover::new(&old, new, &run.workflow))]);
    problems_of(daemon, &movers, run).await
}

/// The plans `runs` are on, each read once.
async fn plans_of(
    daemon: &Arc<Daemon>,
    runs: &[RunRow],
) -> Result<HashMap<String, Arc<Plan>>, Problem> {
    let mut plans = HashMap::new();
    for run in runs {
        if !plans.contains_key(&run.plan_hash) {
            let plan = daemon
                .plan(&run.account, &run.plan_hash)
                .await
                .map_err(store_problem)?;
            plans.insert(run.plan_hash.clone(), plan);
        }
    }
    Ok(plans)
}

/// A comparison of each of `old_plans` with `new`, made once for all the
/// runs on that plan.
fn movers_to<'p>(
    old_plans: &'p HashMap<String, Arc<Plan>>,
    new: &'p Plan,
    workflow: &str,
) -> HashMap<&'p str, Mover<'p>> {
    old_plans
        .iter()
        .map(|(hash, old)| (hash.as_str(), Mover::new(old, new, workflow)))
        .collect()
}

/// Why `run` cannot go on on the version `movers` compare with, from
/// where its journal says it stands.
async fn problems_of(
    daemon: &Arc<Daemon>,
    movers: &HashMap<&str, Mover<'_>>,
    run: &RunRow,
) -> Result<Vec<Incompatibility>, Problem> {
    let records = daemon
        .store
        .step_records(&run.id)
        .await
        .map_err(store_problem)?;
    // Every run's plan is among those compared: `plans_of` read them all.
    let Some(mover) = movers.get(run.plan_hash.as_str()) else {
        return Err(store_problem(flow_runtime::store::StoreError::Damaged(
            format!("run {} is on a plan that was not compared", run.id),
        )));
    };
    Ok(mover.problems_of_run(run, &records))
}

/// The problems of a run that cannot move, for a problem answer.
pub(crate) fn problem_list(problems: Vec<Incompatibility>) -> serde_json::Value {
    serde_json::to_value(
        problems
            .into_iter()
            .map(MoveProblem::of)
            .collect::<Vec<_>>(),
    )
    .unwrap_or_default()
}

/// The deployed versions of `workflow`, oldest first.
pub(crate) async fn versions_of(
    daemon: &Arc<Daemon>,
    account: &str,
    workflow: &str,
) -> Result<Vec<Deployment>, Problem> {
    let versions: Vec<Deployment> = daemon
        .deployments(account)
        .await
        .map_err(store_problem)?
        .iter()
        .filter(|d| d.workflow == workflow)
        .cloned()
        .collect();
    if versions.is_empty() {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_workflow",
            &format!("no workflow `{workflow}` is deployed"),
        ));
    }
    Ok(versions)
}

/// Version `number` of `versions` (the latest for `None`).
pub(crate) fn version<'d>(
    versions: &'d [Deployment],
    number: Option<u32>,
    workflow: &str,
) -> Result<&'d Deployment, Problem> {
    let found = match number {
        Some(number) => versions.iter().find(|d| d.version == number),
        None => versions.iter().max_by_key(|d| d.version),
    };
    found.ok_or_else(|| {
        let known: Vec<String> = versions.iter().map(|d| d.version.to_string()).collect();
        Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_version",
            &format!(
                "workflow `{workflow}` has no version {}; its versions: {}",
                number.unwrap_or_default(),
                known.join(", ")
            ),
        )
    })
}

async fn runs_of(
    daemon: &Arc<Daemon>,
    account: &str,
    workflow: &str,
    status: RunStatus,
) -> Result<Vec<RunRow>, Problem> {
    let query = RunQuery {
        workflow: Some(workflow.to_string()),
        status: Some(status),
        limit: RUNS_AT_ONCE,
        before: None,
    };
    daemon
        .store
        .account_runs(account, &query)
        .await
        .map_err(store_problem)
}
