//! Emails: approvers get signed approve and reject links when a run parks at
//! their gate; a department's members get each handoff.
//!
//! The store's notifications are the outbox. A handoff step and a parked run
//! only store a notification (in the run's path, a local write); this task
//! mails what is due, off the run's path, and marks each notification sent,
//! failed or skipped. A crash between sending and marking sends an email
//! twice rather than never. A delivery that keeps failing is logged and
//! counted (`flow_emails_total{result="failed"}`), never fails a run.

use std::sync::Arc;
use std::time::Duration;

use flow_runtime::interp::{PendingApproval, StepStatus, gate_due_ms};
use flow_runtime::store::{MailState, Notification, NotificationKind};
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{Smtp, SmtpTls};
use crate::links::{self, Link};
use crate::server::Daemon;

/// How often the outbox is looked at when nothing wakes the mailer.
const POLL: Duration = Duration::from_secs(1);
/// Attempts per email, and the wait before the second one (doubling).
const ATTEMPTS: u32 = 3;
const FIRST_WAIT: Duration = Duration::from_millis(500);

pub(crate) type Transport = AsyncSmtpTransport<Tokio1Executor>;

/// The SMTP client `smtp` describes.
pub(crate) fn transport(smtp: &Smtp) -> Result<Transport, String> {
    let builder = match smtp.tls {
        SmtpTls::None => Transport::builder_dangerous(&smtp.host),
        SmtpTls::Starttls => Transport::starttls_relay(&smtp.host)
            .map_err(|e| format!("[smtp] host `{}`: {e}", smtp.host))?,
        SmtpTls::Implicit => {
            Transport::relay(&smtp.host).map_err(|e| format!("[smtp] host `{}`: {e}", smtp.host))?
        }
    };
    let mut builder = builder
        .port(smtp.port)
        .timeout(Some(Duration::from_secs(15)));
    if let (Some(user), Some(password)) = (&smtp.username, &smtp.password) {
        builder = builder.credentials(Credentials::new(user.clone(), password.0.clone()));
    }
    Ok(builder.build())
}

/// Mails what is due until the process ends; `Daemon::wake_mailer` makes it
/// look at once.
pub(crate) async fn run(daemon: Arc<Daemon>) {
    loop {
        if let Err(error) = deliver_due(&daemon).await {
            eprintln!("flowd: mailer: {error}");
        }
        tokio::select! {
            () = daemon.mail_wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

async fn deliver_due(daemon: &Arc<Daemon>) -> Result<(), String> {
    loop {
        let due = daemon.store.to_mail(64).await.map_err(|e| e.to_string())?;
        if due.is_empty() {
            return Ok(());
        }
        for notification in due {
            let state = deliver(daemon, &notification).await;
            daemon
                .store
                .set_mailed(notification.id, state)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
}

/// Sends one notification's emails; how it went.
async fn deliver(daemon: &Daemon, notification: &Notification) -> MailState {
    let Some(transport) = &daemon.mail else {
        return MailState::Skipped;
    };
    let recipients = daemon
        .config
        .people(&notification.account)
        .recipients(notification.kind, &notification.audience);
    if recipients.is_empty() {
        eprintln!(
            "flowd: notification {} for `{}` has nobody to mail (no such department or approver group of account `{}`, nor an address it may mail)",
            notification.id, notification.audience, notification.account
        );
        daemon.metrics.email(notification.kind, MailState::Skipped);
        return MailState::Skipped;
    }
    let Ok(Some(run)) = daemon.store.run(&notification.run_id).await else {
        return MailState::Skipped;
    };
    let gate = match notification.kind {
        NotificationKind::Handoff => None,
        NotificationKind::Approval => {
            // The gate as its record has it: still pending (one decided or
            // expired before its email went out needs none), and when it
            // expires.
            let Ok(records) = daemon.store.step_records(&run.id).await else {
                return MailState::Skipped;
            };
            let gate = records
                .iter()
                .filter(|record| Some(&record.path) == notification.step_path.as_ref())
                .find(|record| record.status == StepStatus::Pending)
                .and_then(|record| {
                    let pending: PendingApproval =
                        serde_json::from_value(record.input.clone()).ok()?;
                    Some((pending, gate_due_ms(record)))
                });
            match gate {
                Some(gate) => Some(gate),
                None => return MailState::Skipped,
            }
        }
    };
    let mut state = MailState::Sent;
    for recipient in &recipients {
        let text = match &gate {
            None => handoff_text(daemon, notification, &run.workflow),
            Some((pending, due_ms)) => {
                approval_text(daemon, &run.id, &run.workflow, pending, *due_ms, recipient)
            }
        };
        let subject = notification.subject.clone().unwrap_or_else(|| match &gate {
            None => format!("{}: handed to {}", run.workflow, notification.audience),
            Some((pending, _)) => {
                format!("Approval needed: {} ({})", run.workflow, pending.step_id)
            }
        });
        let sent = send(transport, &daemon_from(daemon), recipient, &subject, text).await;
        let result = match sent {
            Ok(()) => MailState::Sent,
            Err(error) => {
                eprintln!(
                    "flowd: email to {recipient} about run {} failed: {error}",
                    run.id
                );
                state = MailState::Failed;
                MailState::Failed
            }
        };
        daemon.metrics.email(notification.kind, result);
    }
    state
}

fn daemon_from(daemon: &Daemon) -> String {
    daemon
        .config
        .smtp
        .as_ref()
        .map(|smtp| smtp.from.clone())
        .unwrap_or_default()
}

/// Sends one email, with retries.
async fn send(
    transport: &Transport,
    from: &str,
    to: &str,
    subject: &str,
    text: String,
) -> Result<(), String> {
    let message = Message::builder()
        .from(from.parse().map_err(|e| format!("sender `{from}`: {e}"))?)
        .to(to.parse().map_err(|e| format!("recipient `{to}`: {e}"))?)
        .subject(subject)
        .header(ContentType::TEXT_PLAIN)
        .body(text)
        .map_err(|e| e.to_string())?;
    let mut wait = FIRST_WAIT;
    let mut attempt = 1;
    loop {
        match transport.send(message.clone()).await {
            Ok(_) => return Ok(()),
            // A permanent refusal (unknown mailbox) is not retried.
            Err(error) if error.is_permanent() || attempt == ATTEMPTS => {
                return Err(error.to_string());
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
        }
    }
}

fn approval_text(
    daemon: &Daemon,
    run_id: &str,
    workflow: &str,
    pending: &PendingApproval,
    due_ms: Option<u64>,
    approver: &str,
) -> String {
    // The gate's own expiry, or the links' lifetime if that comes first.
    let latest = links::now_s() + links::LIFETIME.as_secs();
    let expires_s = due_ms.map_or(latest, |ms| (ms / 1000).min(latest));
    let url = |approve: bool| {
        let token = links::sign(
            &daemon.config.link_secret.0,
            &Link {
                run_id: run_id.to_string(),
                path: pending.path.clone(),
                approver: approver.to_string(),
                approve,
                expires_s,
            },
        );
        format!("{}/approvals/{token}", daemon.public_url())
    };
    // The links come before the message, and the message is quoted: text a
    // run wrote (from its input or a model) cannot pose as the real links.
    let quoted: String = pending
        .message
        .lines()
        .map(|line| format!("> {line}\n"))
        .collect();
    format!(
        "Run {run_id} of workflow `{workflow}` is waiting for your decision at step `{step}`.\n\n\
         Approve: {approve}\n\n\
         Reject: {reject}\n\n\
         Each link shows the request and asks you to confirm. The links work once: \
         when the step is decided (by you or another approver) they stop working, \
         and they expire at {expires}.\n\n\
         The request:\n\n{quoted}\n\
         The run: {url}/inspector#/runs/{run_id}\n",
        url = daemon.public_url(),
        step = pending.path,
        approve = url(true),
        reject = url(false),
        expires = flow_runtime::time::rfc3339_utc(expires_s * 1000),
    )
}

fn handoff_text(daemon: &Daemon, notification: &Notification, workflow: &str) -> String {
    format!(
        "{message}\n\n\
         Handed to {department} by run {run} of workflow `{workflow}`.\n\
         The run: {url}/inspector#/runs/{run}\n",
        message = notification.message,
        department = notification.audience,
        run = notification.run_id,
        url = daemon.public_url(),
    )
}
