//! Destinations: where a workflow says its run's result goes
//! (`deliver on completed to email [...] ...`), delivered by flowd after the
//! run's status changed, never on the run's path.
//!
//! They ride the webhooks' outbox (`EventStore`): the store keeps the run's
//! event in the transaction that changes its status, and the deliverer of
//! `webhooks.rs` attempts, for each event, the account's subscribed
//! endpoints and then the destinations of the run's workflow on that
//! event that an earlier attempt did not reach (kept in the event's
//! `reached` as `destination:INDEX`). So a destination is retried with
//! the same backoff, for the same period, across restarts, and at least
//! once: a crash between a delivery and its record delivers it again, under
//! the same id (`flow_runtime::destination::delivery_id`), which a webhook
//! receiver sees as `webhook-id` and a KB write takes as its idempotency
//! key (so a document gets one version per delivery id).
//!
//! Every attempt is added to the run's history (its trace, `GET
//! /v1/runs/{id}/trace`, `flow show`) and counted
//! (`flow_destination_deliveries_total` by account, kind and result).

use flow_runtime::destination::{self, Rendered};
use flow_runtime::journal::Outcome;
use flow_runtime::services::KbWrite;
use flow_runtime::store::{RunChange, RunEvent};
use serde_json::json;

use crate::config::Webhook;
use crate::server::Daemon;

/// An attempt at one destination, for the outbox's record.
pub(crate) struct Tried {
    /// Its name in the event's `reached`.
    pub name: String,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// The name under which the outbox keeps destination `index` reached. No
/// webhook endpoint is named so: their names are identifiers.
fn reached_name(index: usize) -> String {
    format!("destination:{index}")
}

/// Attempts the destinations of `event`'s run that an earlier attempt did
/// not reach; `last` says whether a failure now is given up.
pub(crate) async fn attempt(daemon: &Daemon, event: &RunEvent, last: bool) -> Vec<Tried> {
    let Some(run_event) = flow_plan::RunEvent::parse(&event.event) else {
        return Vec::new();
    };
    // The run and its plan, to know its destinations: a store that does not
    // answer now is tried again with the event.
    let run = match daemon.store.run(&event.run_id).await {
        Ok(Some(run)) => run,
        Ok(None) => return Vec::new(),
        Err(error) => return vec![unread(error)],
    };
    // The process's parsed copy: parsing the plan again for every event
    // was a quarter of flowd's CPU under a stream of short runs (B9).
    let plan = match daemon.plan(&run.account, &run.plan_hash).await {
        Ok(plan) => plan,
        Err(error) => return vec![unread(error)],
    };
    let Some(workflow) = plan.workflows.iter().find(|w| w.name == run.workflow) else {
        return Vec::new();
    };
    let output = match event
        .outcome
        .as_ref()
        .and_then(|outcome| serde_json::from_value::<Outcome>(outcome.clone()).ok())
    {
        Some(Outcome::Completed { output }) => Some(output),
        _ => None,
    };
    let mut tried = Vec::new();
    for (index, target) in destination::on_event(workflow, run_event) {
        let name = reached_name(index);
        if event.reached.contains(&name) {
            continue;
        }
        let occurrence = crate::webhooks::occurrence(daemon, event);
        let id = destination::delivery_id(&event.run_id, index, run_event, &occurrence);
        let failure = match destination::render(workflow, target, &run.input, output.as_ref()) {
            Ok(rendered) => {
                let department = workflow.department.clone();
                deliver(daemon, event, &id, rendered, department)
                    .await
                    .err()
            }
            Err(error) => Some(format!("cannot render it: {error}")),
        };
        let result = match (&failure, last) {
            (None, _) => "delivered",
            (Some(_), false) => "failed",
            (Some(_), true) => "given_up",
        };
        if let Some(failure) = &failure {
            tracing::warn!(
                run = %event.run_id,
                account = %event.account,
                "destination {index} ({}, {}), attempt {}: {failure}{}",
                target.kind_name(),
                event.event,
                event.attempts + 1,
                if last { "; given up" } else { "" }
            );
        }
        daemon
            .metrics
            .destination_delivery(&event.account, target.kind_name(), result);
        let change = RunChange::Delivery {
            at_ms: i64::try_from(flow_runtime::time::now_ms()).unwrap_or(i64::MAX),
            id,
            destination: index as u32,
            to: target.kind_name().to_string(),
            event: event.event.clone(),
            result: result.to_string(),
            error: failure.clone(),
        };
        if let Err(error) = daemon.store.note_delivery(&event.run_id, &change).await {
            tracing::warn!(run = %event.run_id, "cannot note a delivery in the run's history: {error}");
        }
        tried.push(Tried { name, failure });
    }
    tried
}

fn unread(error: flow_runtime::store::StoreError) -> Tried {
    Tried {
        name: "destinations".to_string(),
        failure: Some(format!("cannot read the run's destinations: {error}")),
    }
}

/// Delivers one rendered destination of `event`'s run under `id`.
/// A KB document becomes `department`'s, as a `kb_write` of the workflow's.
async fn deliver(
    daemon: &Daemon,
    event: &RunEvent,
    id: &str,
    rendered: Rendered,
    department: Option<String>,
) -> Result<(), String> {
    let account = daemon.config.people(&event.account);
    match rendered {
        Rendered::Webhook { endpoint } => {
            let hook: &Webhook = account
                .webhooks
                .iter()
                .find(|hook| hook.name == endpoint)
                .ok_or_else(|| format!("the account has no webhook endpoint `{endpoint}`"))?;
            let body = json!({
                "event": event.event,
                "account": event.account,
                "run": crate::webhooks::event_record(event),
            })
            .to_string();
            crate::webhooks::post(daemon, hook, id, &event.event, body).await
        }
        Rendered::Email {
            to,
            subject,
            text,
            html,
        } => {
            let Some(transport) = &daemon.mail else {
                return Err("flowd has no [smtp] to mail with".to_string());
            };
            let mut failures = Vec::new();
            // A recipient is a name for several people; each is mailed,
            // and all again when one failed (at least once, as a whole).
            for address in to
                .iter()
                .flat_map(|name| account.destination_recipients(name))
            {
                let from = crate::mailer::daemon_from(daemon);
                let sent = crate::mailer::send(
                    transport,
                    &from,
                    &address,
                    &subject,
                    text.clone(),
                    Some(html.clone()),
                )
                .await;
                if let Err(failure) = sent {
                    failures.push(format!("{address}: {}", failure.message));
                }
            }
            match failures.is_empty() {
                true => Ok(()),
                false => Err(failures.join("; ")),
            }
        }
        Rendered::Kb {
            collection,
            title,
            content,
        } => {
            let write = KbWrite {
                collection,
                title,
                content,
                metadata: Some(json!({ "run_id": event.run_id, "event": event.event })),
                key: Some(id.to_string()),
                department,
            };
            daemon
                .store
                .write_document(&event.account, &write)
                .await
                .map(drop)
                .map_err(|error| error.to_string())
        }
    }
}
