//! Webhooks: after a run completes, fails or parks, each subscribed endpoint
//! gets a POST of the run record, signed, retried with backoff, off the run's
//! path (the run never waits for a delivery, and a delivery that keeps
//! failing is logged and counted, never fails the run).
//!
//! The receiver checks `X-Flow-Signature: sha256=HEX`, the HMAC-SHA256 of the
//! exact body bytes under the webhook's secret.

use std::time::Duration;

use flow_runtime::runner::RunRecord;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::config::{Secret, Webhook};

/// Attempts per delivery, and the wait before the second one (doubling).
const ATTEMPTS: u32 = 5;
const FIRST_WAIT: Duration = Duration::from_millis(250);

/// The signature header's value for `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// How a delivery ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    Failed,
}

/// Posts `record` for `event` (`completed`, `failed`, `parked`) to every
/// webhook subscribed to it, each in its own task; `done` hears how each
/// delivery ended.
pub fn dispatch(
    client: &reqwest::Client,
    hooks: &[Webhook],
    event: &'static str,
    record: &RunRecord,
    done: impl Fn(Delivery) + Clone + Send + Sync + 'static,
) {
    let body = json!({ "event": event, "run": record }).to_string();
    for hook in hooks.iter().filter(|h| h.events.iter().any(|e| e == event)) {
        let Secret(secret) = &hook.secret;
        let request = client
            .post(&hook.url)
            .header("content-type", "application/json")
            .header("x-flow-event", event)
            .header("x-flow-signature", signature(secret, body.as_bytes()))
            .body(body.clone());
        deliver(
            request,
            format!("webhook {} ({event})", hook.url),
            done.clone(),
        );
    }
}

/// Sends `request` in a task of its own until it is answered with a 2xx,
/// retrying with backoff; `done` hears how it ended, and failed attempts are
/// logged as `what`. Shared by webhooks and trace exports.
pub(crate) fn deliver(
    request: reqwest::RequestBuilder,
    what: String,
    done: impl Fn(Delivery) + Send + Sync + 'static,
) {
    tokio::spawn(async move {
        let mut wait = FIRST_WAIT;
        for attempt in 1..=ATTEMPTS {
            let Some(request) = request.try_clone() else {
                break;
            };
            let failure = match request.timeout(Duration::from_secs(10)).send().await {
                Ok(response) if response.status().is_success() => {
                    done(Delivery::Delivered);
                    return;
                }
                Ok(response) => format!("answered {}", response.status()),
                Err(error) => error.to_string(),
            };
            eprintln!("flowd: {what}, attempt {attempt}/{ATTEMPTS}: {failure}");
            if attempt < ATTEMPTS {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
        done(Delivery::Failed);
    });
}

#[cfg(test)]
mod tests {
    use super::signature;

    /// RFC 4231 test case 2 (HMAC-SHA256), so receivers in any language agree.
    #[test]
    fn the_signature_is_hmac_sha256_in_hex() {
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
