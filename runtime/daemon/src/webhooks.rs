//! Webhooks: after a run completes, fails, parks or is cancelled, each
//! endpoint of the run's account subscribed to that event gets a POST of the
//! run record, signed, retried with backoff, off the run's path (the run
//! never waits for a delivery, and a delivery that keeps failing is logged
//! and counted, never fails the run). Another account's endpoints never see
//! it.
//!
//! Signed as the Standard Webhooks convention says, so that receivers can use
//! its verifier libraries and refuse replays: `webhook-id` (one per event,
//! the same on every retry), `webhook-timestamp` (Unix seconds) and
//! `webhook-signature: v1,BASE64` of the HMAC-SHA256 of `id.timestamp.body`.
//! The key is the secret's bytes, or for a `whsec_` secret the bytes its
//! base64 encodes. The older `X-Flow-Signature: sha256=HEX` (HMAC of the
//! body alone) is sent as well.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use flow_runtime::runner::RunRecord;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::config::{Secret, Webhook};

/// Attempts per delivery, and the wait before the second one (doubling).
const ATTEMPTS: u32 = 5;
const FIRST_WAIT: Duration = Duration::from_millis(250);

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

/// Posts `record` of `account`'s run for `event` (`completed`, `failed`,
/// `parked`, `cancelled`) to each of the account's webhooks subscribed to
/// it, each in its own task; `done` hears how each delivery ended.
pub fn dispatch(
    client: &reqwest::Client,
    hooks: &[Webhook],
    account: &str,
    event: &'static str,
    record: &RunRecord,
    done: impl Fn(Delivery) + Clone + Send + Sync + 'static,
) {
    let body = json!({ "event": event, "account": account, "run": record }).to_string();
    let timestamp = flow_runtime::time::now_ms() / 1000;
    // One id per event and endpoint, kept by its retries: a receiver that
    // saw it already drops the repeat.
    let id = format!(
        "msg_{}_{event}_{}",
        record.run_id,
        flow_runtime::time::now_ms()
    );
    for hook in hooks.iter().filter(|h| h.events.iter().any(|e| e == event)) {
        let Secret(secret) = &hook.secret;
        let request = client
            .post(&hook.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                standard_signature(secret, &id, timestamp, body.as_bytes()),
            )
            .header("x-flow-event", event)
            .header("x-flow-signature", signature(secret, body.as_bytes()))
            .body(body.clone());
        deliver(
            request,
            format!("webhook `{}` of account `{account}` ({event})", hook.name),
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
            tracing::warn!("{what}, attempt {attempt}/{ATTEMPTS}: {failure}");
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
