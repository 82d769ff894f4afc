//! The pages an approval link opens: what the link would decide, a confirm
//! button, and the result. The signed token is the credential (no API key):
//! see `crate::links` for what it binds.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use flow_runtime::approval::{Decision, PendingApproval};
use flow_runtime::journal::{Outcome, StepStatus};
use flow_runtime::store::RunRow;
use serde::Deserialize;

use crate::links::{self, Link, LinkError};
use crate::server::Daemon;

/// `GET /approvals/{token}`: the request, and a form to confirm it.
pub(crate) async fn show(State(daemon): State<Arc<Daemon>>, Path(token): Path<String>) -> Response {
    let (link, run, pending) = match open(&daemon, &token).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let verb = if link.approve { "Approve" } else { "Reject" };
    let body = format!(
        r#"<p>Run <code>{run_id}</code> of workflow <code>{workflow}</code> is waiting at step <code>{path}</code>.</p>
<blockquote>{message}</blockquote>
<p>You are deciding as <b>{approver}</b>.</p>
<form method="post">
<label for="comment">Comment (optional)</label>
<textarea id="comment" name="comment" rows="3"></textarea>
<button type="submit" class="{class}">{verb}</button>
</form>"#,
        run_id = escape(&run.id),
        workflow = escape(&run.workflow),
        path = escape(&pending.path),
        message = escape(&pending.message),
        approver = escape(&link.approver),
        class = verb.to_lowercase(),
    );
    page(StatusCode::OK, &format!("{verb} this request?"), &body)
}

#[derive(Deserialize)]
pub(crate) struct Confirm {
    #[serde(default)]
    comment: String,
}

/// `POST /approvals/{token}`: applies the link's decision, exactly once.
pub(crate) async fn confirm(
    State(daemon): State<Arc<Daemon>>,
    Path(token): Path<String>,
    Form(form): Form<Confirm>,
) -> Response {
    let (link, run, _) = match open(&daemon, &token).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let comment = form.comment.trim();
    let decision = Decision {
        groups: daemon.config.people(&run.account).groups_of(&link.approver),
        approver: link.approver.clone(),
        approved: link.approve,
        comment: (!comment.is_empty()).then(|| comment.to_string()),
        decided_at: flow_runtime::time::now_rfc3339(),
    };
    match daemon.decide(run, link.path.clone(), decision).await {
        Ok(()) => {
            let (title, what) = if link.approve {
                ("Approved", "approved")
            } else {
                ("Rejected", "rejected")
            };
            page(
                StatusCode::OK,
                title,
                &format!(
                    "<p>You {what} step <code>{}</code>. The run continues; you can close this page.</p>",
                    escape(&link.path)
                ),
            )
        }
        Err(problem) => page(
            problem.status(),
            "Not applied",
            &format!("<p>{}</p>", escape(problem.detail())),
        ),
    }
}

/// The link's run and pending gate, or the page that says why there is none.
async fn open(daemon: &Daemon, token: &str) -> Result<(Link, RunRow, PendingApproval), Response> {
    let link = daemon.links.verify(token, links::now_s()).map_err(|error| {
        match error {
            LinkError::Invalid => page(
                StatusCode::FORBIDDEN,
                "This link is not valid",
                "<p>It may have been cut short by your email program. Open the whole link from the email.</p>",
            ),
            LinkError::Expired => page(
                StatusCode::GONE,
                "This link has expired",
                "<p>The request may still be waiting: ask for it to be sent again, or decide it in the run inspector.</p>",
            ),
        }
    })?;
    let unavailable = |detail: &str| {
        page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Try again shortly",
            &format!("<p>{}</p>", escape(detail)),
        )
    };
    // The account the link was signed for owns the run, or there is none.
    let run = daemon
        .store
        .account_run(&link.account, &link.run_id)
        .await
        .map_err(|e| unavailable(&e.to_string()))?
        .ok_or_else(|| {
            page(
                StatusCode::NOT_FOUND,
                "No such run",
                "<p>The run this link was for no longer exists.</p>",
            )
        })?;
    let records = daemon
        .store
        .step_records(&run.id)
        .await
        .map_err(|e| unavailable(&e.to_string()))?;
    let record = records.into_iter().find(|r| r.path == link.path);
    match record {
        // Regression: a gate rejected, its run redriven, was decided again
        // by the links of the rejection's email.
        Some(record)
            if link
                .asked_ms
                .is_some_and(|asked| asked != record.started_ms) =>
        {
            return Err(page(
                StatusCode::CONFLICT,
                "Asked again",
                &format!(
                    "<p>Step <code>{}</code> was decided (or expired) after this email, and has been asked again since: decide it from the newest email, or in the run inspector.</p>",
                    escape(&link.path)
                ),
            ));
        }
        Some(record) if record.status == StepStatus::Pending => {}
        Some(record) => {
            let decided = record.output.as_ref().map_or_else(String::new, |output| {
                let verb = if output["approved"] == true {
                    "approved"
                } else {
                    "rejected"
                };
                format!(
                    " It was {verb} by {} at {}.",
                    output["approver"].as_str().unwrap_or("someone"),
                    output["decided_at"].as_str().unwrap_or("an earlier time")
                )
            });
            return Err(page(
                StatusCode::CONFLICT,
                "Already decided",
                &format!(
                    "<p>Step <code>{}</code> is no longer waiting for a decision.{}</p>",
                    escape(&link.path),
                    escape(&decided)
                ),
            ));
        }
        None => {
            return Err(page(
                StatusCode::NOT_FOUND,
                "No such step",
                "<p>The run has no approval at this step.</p>",
            ));
        }
    }
    let pending = run
        .outcome
        .clone()
        .and_then(|outcome| serde_json::from_value::<Outcome>(outcome).ok())
        .and_then(|outcome| match outcome {
            Outcome::Parked { pending } => pending.into_iter().find(|p| p.path == link.path),
            _ => None,
        })
        .ok_or_else(|| {
            page(
                StatusCode::CONFLICT,
                "The run has moved on",
                "<p>The run is no longer waiting at this step.</p>",
            )
        })?;
    Ok((link, run, pending))
}

/// A small page: no scripts, no external resources.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title} · flow</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 36rem; margin: 3rem auto; padding: 0 1rem; color: #1b1f24; }}
blockquote {{ margin: 1rem 0; padding: .5rem 1rem; border-left: 4px solid #d0d7de; background: #f6f8fa; white-space: pre-wrap; }}
textarea {{ display: block; width: 100%; margin: .25rem 0 1rem; font: inherit; }}
button {{ font: inherit; padding: .5rem 1.5rem; border: 0; border-radius: 6px; color: #fff; cursor: pointer; }}
.approve {{ background: #1f883d; }} .reject {{ background: #cf222e; }}
</style></head>
<body><h1>{title}</h1>
{body}
</body></html>"#,
        title = escape(title),
    );
    (
        status,
        [
            // Its own inline style only, no script, forms posting here
            // only, never framed (an overlaid Confirm button), never cached
            // (the page shows a pending request).
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        Html(html),
    )
        .into_response()
}

/// `text` safe inside HTML elements and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}
