//! `flow run`'s (and `flow cancel`'s) delivery of a run's destinations
//! (`deliver on ... to ...`), after its answer is printed: what the local CLI can deliver it delivers
//! (a KB document, into its own store, once per delivery id), and each
//! destination it cannot (email and webhooks need flowd's SMTP server and
//! account endpoints) is said in one line. Each is added to the run's
//! history, which `flow show` lists.

use std::sync::Arc;

use flow_plan::{DestinationTarget, Plan, RunEvent};
use flow_runtime::destination::{self, Rendered};
use flow_runtime::journal::Outcome;
use flow_runtime::services::KbWrite;
use flow_runtime::store::{NO_ACCOUNT, RunChange, Store};
use serde_json::{Value, json};

/// Delivers what it can of the destinations of `run_id`'s `outcome`.
pub(crate) async fn locally(
    store: &Arc<dyn Store>,
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    outcome: &Outcome,
) {
    let (event, output) = match outcome {
        Outcome::Completed { output } => (RunEvent::Completed, Some(output)),
        Outcome::Parked { .. } => (RunEvent::Parked, None),
        Outcome::Failed { .. } => (RunEvent::Failed, None),
    };
    on_event(store, plan, workflow, run_id, event, output).await;
}

/// Delivers what it can of the destinations of `run_id` on `event` (a
/// run's end, or its cancellation by `flow cancel`), with its `output`
/// when it completed.
pub(crate) async fn on_event(
    store: &Arc<dyn Store>,
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    event: RunEvent,
    output: Option<&Value>,
) {
    let Some(workflow) = plan.workflow(workflow) else {
        return;
    };
    let input = match store.run(run_id).await {
        Ok(Some(run)) => run.input,
        _ => Value::Null,
    };
    // The local CLI has no outbox: an occurrence is numbered by the
    // deliveries of the destination on the event that the history holds.
    let history = store.run_history(run_id).await.unwrap_or_default();
    for (index, target) in destination::on_event(workflow, event) {
        let occurrence = history
            .iter()
            .filter(|change| {
                matches!(change, RunChange::Delivery { destination, event: e, .. }
                    if *destination as usize == index && e == event.as_str())
            })
            .count();
        let id = destination::delivery_id(run_id, index, event, &occurrence.to_string());
        let (result, said) = match destination::render(workflow, target, &input, output) {
            Ok(Rendered::Kb {
                collection,
                title,
                content,
            }) => {
                let write = KbWrite {
                    metadata: Some(json!({ "run_id": run_id, "event": event.as_str() })),
                    key: Some(id.clone()),
                    department: workflow.department.clone(),
                    collection,
                    title,
                    content,
                };
                match store.write_document(NO_ACCOUNT, &write).await {
                    Ok(written) => (
                        Ok(()),
                        format!(
                            "delivered to the KB: {} (version {})",
                            written["id"].as_str().unwrap_or_default(),
                            written["version"]
                        ),
                    ),
                    Err(error) => (Err(error.to_string()), format!("not delivered: {error}")),
                }
            }
            Ok(_) => {
                let why = match target {
                    DestinationTarget::Email { .. } => {
                        "the local CLI has no SMTP server; flowd mails it"
                    }
                    _ => "the local CLI has no webhook endpoints; flowd posts it",
                };
                (Err(why.to_string()), format!("not delivered: {why}"))
            }
            Err(error) => (
                Err(format!("cannot render it: {error}")),
                format!("not delivered: cannot render it: {error}"),
            ),
        };
        eprintln!(
            "flow: destination {index} ({} on {}) {said}",
            describe(target),
            event.as_str()
        );
        let change = RunChange::Delivery {
            at_ms: i64::try_from(flow_runtime::time::now_ms()).unwrap_or(i64::MAX),
            id,
            destination: index as u32,
            to: target.kind_name().to_string(),
            event: event.as_str().to_string(),
            result: if result.is_ok() {
                "delivered"
            } else {
                "not_delivered"
            }
            .to_string(),
            error: result.err(),
        };
        if let Err(error) = store.note_delivery(run_id, &change).await {
            eprintln!("flow: cannot note the delivery in run {run_id}'s history: {error}");
        }
    }
}

/// What a destination names, for its line.
fn describe(target: &DestinationTarget) -> String {
    match target {
        DestinationTarget::Webhook { endpoint } => format!("webhook `{endpoint}`"),
        DestinationTarget::Email { to, .. } => format!("email to {}", to.join(", ")),
        DestinationTarget::Kb { collection, .. } => format!("kb `{collection}`"),
    }
}
