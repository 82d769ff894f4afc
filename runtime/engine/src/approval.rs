//! The rules of approvals, shared by the interpreter and every store: who
//! may decide a gate, what a decision or an expiry makes of its record, and
//! when a gate is due.

use std::sync::Arc;

use flow_plan::{OnExpire, OnReject};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{ErrorKind, StepError};
use crate::journal::{StepRecord, StepStatus};

/// An approval the run is parked at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingApproval {
    pub path: String,
    pub step_id: String,
    pub approvers: Vec<String>,
    pub message: String,
    /// How long after the gate opened it expires (milliseconds).
    pub expires_ms: Option<u64>,
    /// When it expires: RFC 3339, UTC. Absent from gates recorded before
    /// it was kept, and for a gate that never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub on_reject: OnReject,
    pub on_expire: OnExpire,
    /// When the gate opened (its record's start), in milliseconds since
    /// the epoch: a run parked at several gates parks again as each is
    /// decided, and the others wait since they opened, not since then.
    /// Absent from gates recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_ms: Option<u64>,
}

/// Why a decision on an approval was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    UnknownStep(String),
    NotPending(String),
    Expired(String),
    NotAnApprover {
        approver: String,
        approvers: Vec<String>,
    },
    /// The run has ended (failed or completed): nothing of it is decided any more.
    RunEnded {
        run_id: String,
        status: String,
    },
}

impl std::fmt::Display for DecideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecideError::UnknownStep(path) => write!(f, "no approval at `{path}` in this run"),
            DecideError::NotPending(path) => {
                write!(f, "the approval at `{path}` is already decided")
            }
            DecideError::Expired(path) => write!(
                f,
                "the approval at `{path}` has expired; resuming the run applies its `on_expire`"
            ),
            DecideError::NotAnApprover {
                approver,
                approvers,
            } => write!(
                f,
                "{approver} may not decide this approval; its approvers are {}",
                approvers.join(", ")
            ),
            DecideError::RunEnded { run_id, status } => write!(
                f,
                "run `{run_id}` is {status}: its approvals can no longer be decided"
            ),
        }
    }
}

/// A decision on an approval: who decides (and the approver groups they
/// belong to: an approval may name a group), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approver: String,
    pub groups: Vec<String>,
    pub approved: bool,
    pub comment: Option<String>,
    /// RFC 3339, UTC.
    pub decided_at: String,
}

impl PendingApproval {
    /// Whether `approver`, a member of the approver `groups`, may decide it:
    /// an approval names people and approver groups.
    pub fn may_decide(&self, approver: &str, groups: &[String]) -> bool {
        // Addresses compare without regard to case, as mail delivers them
        // (`Carol@Acme.io` is mailed, then decides as `carol@acme.io`).
        self.approvers
            .iter()
            .any(|a| a.eq_ignore_ascii_case(approver) || groups.contains(a))
    }
}

/// The decision rule, shared by every store: the record of the approval at
/// `path` after `approver` decides it at `now_ms`, in the run's redrive
/// `round`, or why that is refused.
///
/// The decision is the round's, not the round the gate first parked in: a
/// run cancelled while parked and redriven parks at the same record, and
/// a rejection recorded in the earlier round was taken for a failure a
/// redrive runs again. The gate then parked again at once, found itself
/// decided, and the run went round for ever.
pub fn decide_record(
    record: Option<&StepRecord>,
    path: &str,
    decision: &Decision,
    now_ms: u64,
    round: u32,
) -> Result<StepRecord, DecideError> {
    let Decision {
        approver,
        groups,
        approved,
        comment,
        decided_at,
    } = decision;
    // Another kind of step at the path is no approval: it was answered
    // "already decided".
    let record = record
        .filter(|record| record.kind == flow_plan::StepKind::Approval)
        .ok_or_else(|| DecideError::UnknownStep(path.to_string()))?;
    if record.status != StepStatus::Pending {
        return Err(DecideError::NotPending(path.to_string()));
    }
    let pending: PendingApproval = serde_json::from_value(record.input.clone())
        .map_err(|_| DecideError::UnknownStep(path.to_string()))?;
    if expire(record, &pending, now_ms, round).is_some() {
        return Err(DecideError::Expired(path.to_string()));
    }
    if !pending.may_decide(approver, groups) {
        return Err(DecideError::NotAnApprover {
            approver: approver.to_string(),
            approvers: pending.approvers,
        });
    }
    // An address is recorded in one spelling, whatever case it came in.
    let approver = if approver.contains('@') {
        approver.to_lowercase()
    } else {
        approver.clone()
    };
    let mut decided = record.clone();
    decided.ended_ms = now_ms;
    decided.round = round;
    decided.output = Some(Arc::new(json!({
        "approved": approved,
        "approver": approver,
        "comment": comment,
        "decided_at": decided_at,
    })));
    if !approved && pending.on_reject == OnReject::Fail {
        decided.status = StepStatus::Failed;
        decided.error = Some(StepError::new(
            ErrorKind::Rejected,
            format!("{approver} rejected the approval"),
        ));
    } else {
        decided.status = StepStatus::Completed;
    }
    Ok(decided)
}

/// When the approval pending in `record` expires (milliseconds since the
/// epoch), if it is a pending approval with an expiry: what a store indexes
/// to find the gates due without reading every record.
pub fn gate_due_ms(record: &StepRecord) -> Option<u64> {
    if record.status != StepStatus::Pending {
        return None;
    }
    let pending: PendingApproval = serde_json::from_value(record.input.clone()).ok()?;
    Some(record.started_ms.saturating_add(pending.expires_ms?))
}

/// The record of an approval whose time ran out, decided by its `on_expire`
/// in the run's redrive `round` (as [`decide_record`]): `reject` counts as
/// a rejection (then `on_reject` applies), `fail` fails the step. `None`
/// while it has time left or never expires.
pub fn expire(
    record: &StepRecord,
    pending: &PendingApproval,
    now_ms: u64,
    round: u32,
) -> Option<StepRecord> {
    let expires_ms = pending.expires_ms?;
    if now_ms < record.started_ms.saturating_add(expires_ms) {
        return None;
    }
    let mut expired = record.clone();
    expired.ended_ms = now_ms;
    expired.round = round;
    expired.output = Some(Arc::new(json!({
        "approved": false,
        "approver": "",
        "comment": "expired",
        "decided_at": crate::time::rfc3339_utc(now_ms),
    })));
    let fails = match pending.on_expire {
        OnExpire::Fail => true,
        OnExpire::Reject => pending.on_reject == OnReject::Fail,
    };
    if fails {
        expired.status = StepStatus::Failed;
        expired.error = Some(StepError::new(
            ErrorKind::Expired,
            format!(
                "the approval expired after {}",
                flow_plan::written::duration(expires_ms)
            ),
        ));
    } else {
        expired.status = StepStatus::Completed;
    }
    Some(expired)
}
