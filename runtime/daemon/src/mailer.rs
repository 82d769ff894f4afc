//! Emails: approvers get signed approve and reject links when a run parks at
//! their gate; a department's members get each handoff.
//!
//! The store's notifications are the outbox. A handoff step and a parked run
//! only store a notification (in the run's path, a local write); this task
//! mails what is due, off the run's path. Each recipient reached is recorded;
//! those a failing server did not take are tried again later (from 30 s,
//! doubling, for about two hours), so an SMTP outage delays email rather
//! than losing it. A crash between sending and recording sends an email
//! twice rather than never. A delivery that fails for good is logged and
//! counted (`flow_emails_total{result="failed"}`), never fails a run.

use std::sync::Arc;
use std::time::Duration;

use flow_runtime::approval::{PendingApproval, gate_due_ms};
use flow_runtime::journal::StepStatus;
use flow_runtime::store::{MailNext, MailState, Notification, NotificationKind, Outgoing, RunRow};
use lettre::message::MultiPart;
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

/// Mails what is due until `stopping` turns true, finishing the message
/// it is sending; `Daemon::wake_mailer` makes it look at once.
pub(crate) async fn run(daemon: Arc<Daemon>, mut stopping: tokio::sync::watch::Receiver<bool>) {
    while !*stopping.borrow() {
        // Nothing is lost: the mail stays due, and is looked at again.
        if let Err(error) = deliver_due(&daemon, &stopping).await {
            tracing::warn!("mailer: {error}; the mail due is looked at again");
        }
        tokio::select! {
            () = daemon.mail_wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
            _ = stopping.changed() => {}
        }
    }
}

async fn deliver_due(
    daemon: &Arc<Daemon>,
    stopping: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    loop {
        let due = daemon
            .store
            .to_mail(flow_runtime::time::now_ms(), 64)
            .await
            .map_err(|e| e.to_string())?;
        if due.is_empty() {
            return Ok(());
        }
        for outgoing in due {
            if *stopping.borrow() {
                return Ok(());
            }
            let (reached, next) = deliver(daemon, &outgoing).await;
            daemon
                .store
                .mailed(outgoing.notification.id, &reached, next)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
}

/// How many times a notification's unreached recipients are tried (each
/// attempt retries a few times itself), and the wait after the first
/// attempt, doubling up to an hour: about two hours in all.
const OUTBOX_ATTEMPTS: u32 = 8;
const OUTBOX_FIRST_WAIT_MS: u64 = 30_000;
const OUTBOX_LONGEST_WAIT_MS: u64 = 3_600_000;

/// Sends a notification's emails to the recipients not reached yet; those
/// it reached, and what is left to do.
async fn deliver(daemon: &Daemon, outgoing: &Outgoing) -> (Vec<String>, MailNext) {
    let notification = &outgoing.notification;
    let skipped = (Vec::new(), MailNext::Done(MailState::Skipped));
    let Some(transport) = &daemon.mail else {
        return skipped;
    };
    let recipients = daemon
        .config
        .people(&notification.account)
        .recipients(notification.kind, &notification.audience);
    if recipients.is_empty() {
        tracing::warn!(
            notification = notification.id,
            account = %notification.account,
            "notification for `{}` has nobody to mail (no such department or approver group of the account, nor an address it may mail)",
            notification.audience
        );
        daemon
            .metrics
            .email(&notification.account, notification.kind, MailState::Skipped);
        return skipped;
    }
    // A store that does not answer now may answer at the next attempt.
    let retry_soon = |reached| {
        (
            reached,
            MailNext::Retry(flow_runtime::time::now_ms() + OUTBOX_FIRST_WAIT_MS),
        )
    };
    let run = match daemon.store.run(&notification.run_id).await {
        Ok(Some(run)) => run,
        Ok(None) => return skipped,
        Err(_) => return retry_soon(Vec::new()),
    };
    let gate = match notification.kind {
        NotificationKind::Handoff => None,
        NotificationKind::Approval => {
            // The gate as its record has it: still pending (one decided or
            // expired before its email went out needs none), and when it
            // expires.
            let Ok(records) = daemon.store.step_records(&run.id).await else {
                return retry_soon(Vec::new());
            };
            let gate = records
                .iter()
                .filter(|record| Some(&record.path) == notification.step_path.as_ref())
                .find(|record| record.status == StepStatus::Pending)
                .and_then(|record| {
                    let pending: PendingApproval =
                        serde_json::from_value(record.input.clone()).ok()?;
                    Some((pending, gate_due_ms(record), record.started_ms))
                });
            match gate {
                Some(gate) => Some(gate),
                None => return skipped,
            }
        }
    };
    let mut reached = Vec::new();
    let (mut refused, mut unreachable) = (false, false);
    for recipient in recipients.iter().filter(|r| !outgoing.sent_to.contains(r)) {
        let text = match &gate {
            None => handoff_text(daemon, notification, &run.workflow),
            Some((pending, due_ms, asked_ms)) => {
                approval_text(daemon, &run, pending, *due_ms, *asked_ms, recipient)
            }
        };
        let subject = notification.subject.clone().unwrap_or_else(|| match &gate {
            None => format!("{}: handed to {}", run.workflow, notification.audience),
            Some((pending, ..)) => {
                format!("Approval needed: {} ({})", run.workflow, pending.step_id)
            }
        });
        match send(
            transport,
            &daemon_from(daemon),
            recipient,
            &subject,
            text,
            None,
        )
        .await
        {
            Ok(()) => {
                daemon
                    .metrics
                    .email(&notification.account, notification.kind, MailState::Sent);
                reached.push(recipient.clone());
            }
            Err(Failure { message, permanent }) => {
                tracing::warn!(
                    run = %run.id,
                    "email to {recipient} failed{}: {message}",
                    if permanent {
                        " for good"
                    } else {
                        "; it is tried again later"
                    }
                );
                if permanent {
                    daemon.metrics.email(
                        &notification.account,
                        notification.kind,
                        MailState::Failed,
                    );
                    refused = true;
                } else {
                    unreachable = true;
                }
            }
        }
    }
    let attempt = outgoing.attempts + 1;
    let next = if unreachable && attempt < OUTBOX_ATTEMPTS {
        let wait = (OUTBOX_FIRST_WAIT_MS << (attempt - 1).min(16)).min(OUTBOX_LONGEST_WAIT_MS);
        MailNext::Retry(flow_runtime::time::now_ms() + wait)
    } else if unreachable || refused {
        if unreachable {
            // The last attempt: whoever is still unreached is counted now.
            let left = recipients.len() - outgoing.sent_to.len() - reached.len();
            for _ in 0..left {
                daemon
                    .metrics
                    .email(&notification.account, notification.kind, MailState::Failed);
            }
        }
        MailNext::Done(MailState::Failed)
    } else {
        MailNext::Done(MailState::Sent)
    };
    (reached, next)
}

pub(crate) fn daemon_from(daemon: &Daemon) -> String {
    daemon
        .config
        .smtp
        .as_ref()
        .map(|smtp| smtp.from.clone())
        .unwrap_or_default()
}

/// Why an email was not sent; a permanent failure (a refused mailbox, an
/// address that does not parse) is not tried again.
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) permanent: bool,
}

/// Sends one email, retrying a few times within a couple of seconds: its
/// `text`, and with `html` a second part (`multipart/alternative`).
pub(crate) async fn send(
    transport: &Transport,
    from: &str,
    to: &str,
    subject: &str,
    text: String,
    html: Option<String>,
) -> Result<(), Failure> {
    let permanent = |message: String| Failure {
        message,
        permanent: true,
    };
    let message = Message::builder()
        .from(
            from.parse()
                .map_err(|e| permanent(format!("sender `{from}`: {e}")))?,
        )
        .to(to
            .parse()
            .map_err(|e| permanent(format!("recipient `{to}`: {e}")))?)
        .subject(subject);
    let message = match html {
        Some(html) => message.multipart(MultiPart::alternative_plain_html(text, html)),
        None => message.header(ContentType::TEXT_PLAIN).body(text),
    }
    .map_err(|e| permanent(e.to_string()))?;
    let mut wait = FIRST_WAIT;
    let mut attempt = 1;
    loop {
        match transport.send(message.clone()).await {
            Ok(_) => return Ok(()),
            Err(error) if error.is_permanent() || attempt == ATTEMPTS => {
                return Err(Failure {
                    message: error.to_string(),
                    permanent: error.is_permanent(),
                });
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
    run: &RunRow,
    pending: &PendingApproval,
    due_ms: Option<u64>,
    asked_ms: u64,
    approver: &str,
) -> String {
    // The gate's own expiry, or the links' lifetime if that comes first.
    let latest = links::now_s() + links::LIFETIME.as_secs();
    let expires_s = due_ms.map_or(latest, |ms| (ms / 1000).min(latest));
    let url = |approve: bool| {
        let token = daemon.links.sign(&Link {
            account: run.account.clone(),
            run_id: run.id.clone(),
            path: pending.path.clone(),
            approver: approver.to_string(),
            approve,
            expires_s,
            asked_ms: Some(asked_ms),
        });
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
        run_id = run.id,
        workflow = run.workflow,
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
