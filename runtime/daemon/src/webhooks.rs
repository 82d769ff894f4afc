//! Webhooks: after a run completes, fails, parks or is cancelled, each
//! endpoint of the run's account subscribed to that event gets a POST of the
//! run record, signed, off the run's path (the run never waits for a
//! delivery, and a delivery that keeps failing is logged and counted, never
//! fails the run). Another account's endpoints never see it.
//!
//! Delivery is durable: the store keeps each event in the transaction that
//! changes the run's status (`EventStore`), and this task posts what is due,
//! recording which endpoints took it. An endpoint that does not answer 2xx
//! is tried again (from 1 s, doubling up to 10 minutes) for
//! `[limits] webhook_retry_secs` (a day by default) after the event, across
//! restarts of flowd and by whichever flowd of a shared store comes first.
//! A crash between a post and its record posts it twice rather than never;
//! the message id says it is the same event.
//!
//! Signed as the Standard Webhooks convention says, so that receivers can use
//! its verifier libraries and refuse replays: `webhook-id` (one per event,
//! the same on every retry), `webhook-timestamp` (Unix seconds of the
//! attempt) and `webhook-signature: v1,BASE64` of the HMAC-SHA256 of
//! `id.timestamp.body`. The key is the secret's bytes, or for a `whsec_`
//! secret the bytes its base64 encodes. The older `X-Flow-Signature:
//! sha256=HEX` (HMAC of the body alone) is sent as well.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use flow_runtime::journal::Outcome;
use flow_runtime::runner::RunRecord;
use flow_runtime::store::{DueEvents, EventNext, RunEvent, RunStatus, StoreError};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::config::{Secret, Webhook};
use crate::counts::Counts;
use crate::server::Daemon;

/// The HMAC key of `secret`: a Standard Webhooks secret (`whsec_` and
/// base64) is the bytes it encodes; any other, its own bytes.
pub fn key(secret: &str) -> Vec<u8> {
    secret
        .strip_prefix("whsec_")
        .and_then(|encoded| STANDARD.decode(encoded).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

fn mac(secret: &str) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(&key(secret)).expect("HMAC takes keys of any length")
}

/// The `X-Flow-Signature` header's value for `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The `webhook-signature` header's value (Standard Webhooks, `v1`).
pub fn standard_signature(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// How a delivery ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    Failed,
}

impl Delivery {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Delivered => "delivered",
            Delivery::Failed => "failed",
        }
    }
}

/// How often the outbox is looked at when nothing wakes the deliverer.
const POLL: Duration = Duration::from_secs(1);
/// The wait after an event's first attempt, doubling up to the longest.
const FIRST_RETRY_MS: u64 = 1_000;
const LONGEST_RETRY_MS: u64 = 600_000;
/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts in flight at once, over every account's events.
const IN_FLIGHT: usize = 64;
/// An account's fair share of the attempts in flight: a quarter. Each
/// account's events are handed out up to its share first; only then, and
/// only while more than a share's worth of slots stays free, does an
/// account take more. So an account whose endpoints hang (each post up to
/// `POST_TIMEOUT`) and whose runs end by the thousand holds at most three
/// quarters, and another account's events go out at once; before, it held
/// every slot and the others' events waited behind its retries for as long
/// as they lasted. An account alone still has 48 posts out at once.
const FAIR_SHARE: usize = IN_FLIGHT / 4;

/// Delivers the store's due events until `stopping` turns true, then
/// waits for the attempts out to be recorded; `Daemon::events_wake` makes
/// it look at once.
pub(crate) async fn run(daemon: Arc<Daemon>, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    // The deliverer's attempts out, by account.
    let in_flight = Arc::new(Counts::default());
    while !*stopping.borrow() {
        // Nothing is lost: the events stay due, and are looked at again
        // (another process holding SQLite's lock, a lost connection).
        if let Err(error) = deliver_due(&daemon, &slots, &in_flight, &stopping).await {
            tracing::warn!("webhooks: {error}; the due events are looked at again");
        }
        tokio::select! {
            () = daemon.events_wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
            _ = stopping.changed() => {}
        }
    }
    // Every slot back is every attempt recorded.
    let _ = slots.acquire_many(IN_FLIGHT as u32).await;
}

/// Starts an attempt at each due event while a slot is free: each
/// account's fair share first, then the spare slots (`FAIR_SHARE`). Each
/// attempt goes on by itself and frees its slot when recorded: an endpoint or destination that takes
/// long (a receiver answering in seconds) holds its own events' slots,
/// never the other events' turn. An attempt still out when its claim
/// (`EVENT_CLAIM`) runs out may be made twice, under one id.
async fn deliver_due(
    daemon: &Arc<Daemon>,
    slots: &Arc<tokio::sync::Semaphore>,
    in_flight: &Arc<Counts>,
    stopping: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), StoreError> {
    let mut spare = false;
    while !*stopping.borrow() {
        let free = slots.available_permits();
        // The spare slots are those past a fair share's worth kept free
        // for the accounts whose events come due meanwhile.
        let (limit, per_account) = match spare {
            false => (free, FAIR_SHARE),
            true => (free.saturating_sub(FAIR_SHARE), IN_FLIGHT),
        };
        if limit == 0 {
            return Ok(());
        }
        let held = in_flight.by_key();
        let due = daemon
            .store
            .due_events(&DueEvents {
                now_ms: flow_runtime::time::now_ms(),
                limit,
                per_account,
                in_flight: &held,
            })
            .await?;
        if due.is_empty() {
            if spare {
                return Ok(());
            }
            spare = true;
            continue;
        }
        for event in due {
            let Ok(slot) = Arc::clone(slots).acquire_owned().await else {
                return Ok(());
            };
            let holding = in_flight.count(&event.account);
            let daemon = Arc::clone(daemon);
            tokio::spawn(async move {
                let (reached, next) = post_event(&daemon, &event).await;
                if let Err(error) = daemon.store.event_attempted(event.id, &reached, next).await {
                    tracing::error!("webhooks: {error}");
                }
                drop((holding, slot));
                // A slot is free: the next due event need not wait for the poll.
                daemon.events_wake.notify_one();
            });
        }
    }
    Ok(())
}

/// The run record an event carries, as it was when the run's status changed.
pub(crate) fn event_record(event: &RunEvent) -> RunRecord {
    let outcome = event
        .outcome
        .as_ref()
        .and_then(|outcome| serde_json::from_value::<Outcome>(outcome.clone()).ok());
    let mut record = match (event.event.as_str(), outcome) {
        ("cancelled", _) | (_, None) => RunRecord::new(&event.run_id, event_status(&event.event)),
        (_, Some(outcome)) => flow_runtime::runner::run_record(&event.run_id, &outcome),
    };
    record.workflow = Some(event.workflow.clone());
    record
}

fn event_status(event: &str) -> RunStatus {
    match event {
        "completed" => RunStatus::Completed,
        "failed" => RunStatus::Failed,
        "parked" => RunStatus::PendingApproval,
        _ => RunStatus::Cancelled,
    }
}

/// Posts `event` to its account's endpoints subscribed to it, and delivers
/// it to its run's destinations (`destinations.rs`), those an earlier
/// attempt did not reach; those it reached, and what is left to do.
async fn post_event(daemon: &Daemon, event: &RunEvent) -> (Vec<String>, EventNext) {
    let now = flow_runtime::time::now_ms();
    let retry_for_ms = daemon.config.limits.webhook_retry_secs.saturating_mul(1000);
    let age_ms = now.saturating_sub(u64::try_from(event.created_ms).unwrap_or(0));
    let last = age_ms >= retry_for_ms;
    let hooks: Vec<&Webhook> = daemon
        .config
        .people(&event.account)
        .webhooks
        .iter()
        .filter(|hook| hook.events.contains(&event.event) && !event.reached.contains(&hook.name))
        .collect();
    let counted = |delivery| daemon.metrics.webhook_delivery(&event.account, delivery);
    let id = message_id(daemon, event);
    let mut reached = Vec::new();
    let mut left = 0;
    // Built only for an account with endpoints for this event: most
    // events go to none.
    let body = match hooks.is_empty() {
        true => String::new(),
        false => json!({
            "event": event.event,
            "account": event.account,
            "run": event_record(event),
        })
        .to_string(),
    };
    for hook in &hooks {
        match post(daemon, hook, &id, &event.event, body.clone()).await {
            Ok(()) => {
                counted(Delivery::Delivered);
                reached.push(hook.name.clone());
            }
            Err(failure) => {
                left += 1;
                if last {
                    counted(Delivery::Failed);
                }
                tracing::warn!(
                    run = %event.run_id,
                    account = %event.account,
                    "webhook `{}` ({}), attempt {}: {failure}{}",
                    hook.name,
                    event.event,
                    event.attempts + 1,
                    if last {
                        format!("; given up after {} s", age_ms / 1000)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    for tried in crate::destinations::attempt(daemon, event, last).await {
        match tried.failure {
            None => reached.push(tried.name),
            Some(_) => left += 1,
        }
    }
    if left == 0 || last {
        return (reached, EventNext::Done);
    }
    let wait = (FIRST_RETRY_MS << event.attempts.min(20)).min(LONGEST_RETRY_MS);
    (reached, EventNext::Retry(now + wait))
}

/// Posts `body` to `hook`, signed, as message `id` of `event`: `Err` with
/// why it was not taken (no 2xx answer).
pub(crate) async fn post(
    daemon: &Daemon,
    hook: &Webhook,
    id: &str,
    event: &str,
    body: String,
) -> Result<(), String> {
    let timestamp = flow_runtime::time::now_ms() / 1000;
    let Secret(secret) = &hook.secret;
    let posted = daemon
        .http
        .post(&hook.url)
        .timeout(POST_TIMEOUT)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header(
            "webhook-signature",
            standard_signature(secret, id, timestamp, body.as_bytes()),
        )
        .header("x-flow-event", event)
        .header("x-flow-signature", signature(secret, body.as_bytes()))
        .body(body)
        .send()
        .await;
    match posted {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(format!("answered {}", response.status())),
        // reqwest's own words say only "error sending request for url";
        // the cause (a name that does not resolve, a refused connection)
        // is what the operator mends (an audit).
        Err(error) => Err(flow_runtime::error::with_causes(&error.without_url())),
    }
}

/// The `webhook-id` of an event: the same on every attempt, in every flowd
/// sharing the link secret, and another for each event. Named by the run,
/// the event and a tag of the event's row, as delivery ids are: the row id
/// counts every account's events, and a receiver saw in it how busy the
/// other accounts were (an audit); the time it happened, which replaced
/// it, is the same for two parks of a run within one millisecond, and a
/// receiver would drop the second as seen.
fn message_id(daemon: &Daemon, event: &RunEvent) -> String {
    format!(
        "msg_{}_{}_{}",
        event.run_id,
        event.event,
        occurrence(daemon, event)
    )
}

/// The tag that tells `event` from the run's other events in the ids a
/// receiver sees (`webhook-id`, delivery ids): stable across attempts and
/// flowds, saying nothing of other accounts' events, which its row counts.
pub(crate) fn occurrence(daemon: &Daemon, event: &RunEvent) -> String {
    daemon
        .links
        .tag(&event.account, &format!("event {}", event.id))
}

#[cfg(test)]
mod tests {
    use super::{signature, standard_signature};

    /// The Standard Webhooks specification's own example, so that its
    /// verifier libraries accept what flowd sends.
    #[test]
    fn the_standard_signature_matches_the_conventions_example() {
        assert_eq!(
            standard_signature(
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// RFC 4231 test case 2 (HMAC-SHA256), so receivers in any language agree.
    #[test]
    fn the_signature_is_hmac_sha256_in_hex() {
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
