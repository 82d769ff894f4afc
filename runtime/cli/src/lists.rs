//! The listings `flow runs`, `flow approvals`, `flow kb` and `flow
//! notifications` print, whichever store they come from (the local one, or
//! a flowd's API): one shape each, as text for people or as JSON.

use flow_runtime::approval::PendingApproval;
use flow_runtime::services::KbDocument;
use flow_runtime::store::{Notification, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::style::{self, Paint, Tone};

/// A run as `flow runs` lists it. Its JSON is the interface scripts read:
/// fields are added, never renamed or removed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunLine {
    pub(crate) run_id: String,
    pub(crate) workflow: String,
    pub(crate) status: RunStatus,
    /// Left `running` by a process that is gone (a signal, a crash):
    /// `flow recover` resumes it. flowd takes such runs over itself, so a
    /// run it lists never is.
    #[serde(default)]
    pub(crate) interrupted: bool,
    pub(crate) created_ms: i64,
    pub(crate) updated_ms: i64,
}

pub(crate) fn print_runs(runs: &[RunLine], json: bool, paint: Paint) {
    if json {
        out!("{}", serde_json::to_string(runs).unwrap_or_default());
        return;
    }
    if runs.is_empty() {
        out!("no runs");
        return;
    }
    let statuses: Vec<String> = runs
        .iter()
        .map(|r| style::run_status(r.status, r.interrupted))
        .collect();
    let status_width = statuses.iter().map(String::len).max().unwrap_or(0);
    let workflow_width = runs.iter().map(|r| r.workflow.chars().count()).max();
    let workflow_width = workflow_width.unwrap_or(0).max("WORKFLOW".len());
    // Times first and the run last: every column before the id has a width
    // that does not depend on the id, and the id is easy to select.
    out!(
        "{}",
        paint.dim(&format!(
            "{:<20}  {:<20}  {:<status_width$}  {:<workflow_width$}  RUN",
            "STARTED", "UPDATED", "STATUS", "WORKFLOW"
        ))
    );
    for (run, status) in runs.iter().zip(statuses) {
        out!(
            "{}  {}  {}  {:<workflow_width$}  {}",
            style::time(run.created_ms),
            style::time(run.updated_ms),
            paint.tone(
                Tone::of_run(run.status),
                &format!("{status:<status_width$}")
            ),
            run.workflow,
            run.run_id,
        );
    }
}

/// A gate waiting for a decision, as `flow approvals` lists it (the shape
/// of flowd's `GET /v1/approvals`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GateLine {
    pub(crate) run_id: String,
    pub(crate) workflow: String,
    pub(crate) step_path: String,
    pub(crate) step_id: String,
    pub(crate) message: String,
    pub(crate) approvers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<String>,
    /// When the run parked.
    pub(crate) created_ms: i64,
    /// When the gate opened (flowd's and stores' of gates recorded since it
    /// is kept): what "waiting since" says, before `created_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) opened_ms: Option<u64>,
}

impl GateLine {
    pub(crate) fn new(
        run_id: &str,
        workflow: &str,
        parked_ms: i64,
        gate: PendingApproval,
    ) -> GateLine {
        GateLine {
            run_id: run_id.to_string(),
            workflow: workflow.to_string(),
            step_path: gate.path,
            step_id: gate.step_id,
            message: gate.message,
            approvers: gate.approvers,
            expires_at: gate.expires_at,
            created_ms: parked_ms,
            opened_ms: gate.opened_ms,
        }
    }
}

pub(crate) fn print_approvals(gates: &[GateLine], json: bool, via: style::Via<'_>, paint: Paint) {
    if json {
        out!("{}", serde_json::to_string(gates).unwrap_or_default());
        return;
    }
    if gates.is_empty() {
        out!("no approval is waiting");
        return;
    }
    for (i, gate) in gates.iter().enumerate() {
        if i > 0 {
            out!("");
        }
        out!(
            "{}  {}  {}",
            paint.bold(&gate.step_path),
            paint.dim(&format!(
                "{} · waiting since {}",
                gate.workflow,
                style::time(
                    gate.opened_ms
                        .and_then(|ms| i64::try_from(ms).ok())
                        .unwrap_or(gate.created_ms)
                )
            )),
            gate.run_id
        );
        for line in style::quoted(&gate.message) {
            out!("  {line}");
        }
        let expires = gate
            .expires_at
            .as_deref()
            .map(|at| format!(" · expires {at}"))
            .unwrap_or_default();
        out!("  approvers: {}{expires}", gate.approvers.join(", "));
        let command =
            style::approve_command(&gate.run_id, &gate.step_path, &gate.approvers, via, 0);
        out!("  {command}   {}", paint.dim("(add --reject to reject)"));
    }
}

/// The first line of a document, cut to a line's width, for a listing.
fn first_line(content: &str) -> String {
    let line = content.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let line = line.trim();
    if line.chars().count() > 72 {
        format!("{}…", line.chars().take(71).collect::<String>())
    } else {
        line.to_string()
    }
}

/// A document's id as KB writes return it and recipes name it.
fn document_id(document: &KbDocument) -> String {
    format!("{}/{}", document.collection, document.title)
}

/// `flow kb list` and `flow kb search`: each document's id, version and
/// first line.
pub(crate) fn print_documents(documents: &[KbDocument], json: bool, paint: Paint) {
    if json {
        out!("{}", serde_json::to_string(documents).unwrap_or_default());
        return;
    }
    if documents.is_empty() {
        out!("no documents");
        return;
    }
    let width = documents
        .iter()
        .map(|d| document_id(d).chars().count())
        .max()
        .unwrap_or(0);
    for document in documents {
        out!(
            "{:<width$}  {}  {}",
            document_id(document),
            paint.dim(&format!("v{}", document.version)),
            first_line(&document.content)
        );
    }
}

/// `flow kb show`: one document whole.
pub(crate) fn print_document(document: &KbDocument, json: bool, paint: Paint) {
    if json {
        out!("{}", serde_json::to_string(document).unwrap_or_default());
        return;
    }
    out!(
        "{}  {}",
        paint.bold(&document_id(document)),
        paint.dim(&format!("v{}", document.version))
    );
    out!("");
    out!("{}", document.content);
}

/// `flow notifications`: handoffs and approval requests, newest first.
pub(crate) fn print_notifications(list: &[Notification], json: bool, paint: Paint) {
    if json {
        out!("{}", serde_json::to_string(list).unwrap_or_default());
        return;
    }
    if list.is_empty() {
        out!("no notifications");
        return;
    }
    for (i, note) in list.iter().enumerate() {
        if i > 0 {
            out!("");
        }
        let step = note
            .step_path
            .as_deref()
            .map(|path| format!(" {path}"))
            .unwrap_or_default();
        out!(
            "{}  to {}  {}",
            paint.bold(note.kind.as_str()),
            note.audience,
            paint.dim(&format!(
                "{} · run {}{step}",
                style::time(note.created_ms),
                note.run_id
            ))
        );
        if let Some(subject) = &note.subject {
            out!("  {}", style::inert(subject));
        }
        for line in note.message.lines() {
            out!("  {}", style::inert(line));
        }
    }
}

/// What `flow kb show` names: `COLLECTION/TITLE`, split at the first `/`
/// (a collection has none; a title may).
pub(crate) fn parse_document_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('/')
        .filter(|(collection, title)| !collection.is_empty() && !title.is_empty())
}

/// A value as JSON on one line, for `--json`.
pub(crate) fn print_json(value: &Value) {
    out!("{value}");
}
