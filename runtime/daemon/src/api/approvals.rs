//! Approvals: deciding a gate, and the gates an approver may decide.

use super::*;

/// A gate an approver may decide.
#[derive(Serialize, ToSchema)]
pub(super) struct Gate {
    pub(super) run_id: String,
    pub(super) workflow: String,
    pub(super) step_path: String,
    pub(super) step_id: String,
    pub(super) message: String,
    pub(super) approvers: Vec<String>,
    /// How long after the gate opened it expires (milliseconds).
    pub(super) expires_ms: Option<u64>,
    /// When it expires: RFC 3339, UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) expires_at: Option<String>,
    /// When the run parked (again, as each of its gates is decided).
    pub(super) created_ms: i64,
    /// When the gate opened, in milliseconds since the epoch: what it
    /// waits since. Absent for gates recorded before it was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) opened_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Gates {
    pub(super) approvals: Vec<Gate>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Decide {
    /// The email of the person deciding: with an account's key, the account
    /// vouches for them; a user's key decides as its user (leave it out).
    pub(super) approver: Option<String>,
    pub(super) approved: bool,
    pub(super) comment: Option<String>,
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
                opened_ms: gate.opened_ms,
            });
        }
    }
    Ok(axum::Json(Gates { approvals }).into_response())
}
