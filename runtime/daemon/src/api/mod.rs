//! The `/v1` routes. Every handler runs for an authenticated account
//! (`AccountId`), and sees only that account's workflows and runs: another
//! account's run is a 404, exactly as a run that does not exist.
//!
//! The handlers are in a module per resource (`workflows`, `runs`,
//! `approvals`, `inbox`, `kb`); this one holds the OpenAPI document, the
//! answers and checks they share, and body and query parsing.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flow_plan::{DestinationTarget, Plan, PlanProblems};
use flow_runtime::approval::Decision;
use flow_runtime::journal::Outcome;
use flow_runtime::runner::{self, RunRecord};
use flow_runtime::store::{
    Deletion, Deployment, NewRun, Notification, NotificationQuery, RunQuery, RunRow, RunStatus,
    StoreError,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::server::{AccountId, Counted, Daemon, KeyHolder, Problem, joined, store_problem};
use crate::sources::DeployedFiles;

mod approvals;
mod inbox;
mod kb;
mod runs;
mod workflows;

pub(crate) use approvals::{decide, my_approvals};
pub(crate) use inbox::{mark_read, notifications};
pub(crate) use kb::delete_document;
pub(crate) use runs::{
    cancel, delete_run, get_run, graph, redrive, runs, start_run, test_from, trace,
};
pub(crate) use workflows::{deploy, invalid_plan, undeploy, workflows};

pub(crate) type Answer = Result<Response, Problem>;

/// The API's OpenAPI document, derived from the handlers below and the types
/// they take and answer, served at `/v1/openapi.json`.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "flowd",
        description = "Deploy workflows, start and inspect runs, decide approvals. Every request \
            carries an account's API key as `Authorization: Bearer KEY` and sees that account's \
            workflows and runs only. Errors are `application/problem+json` with a stable `code`."
    ),
    paths(
        workflows::deploy, workflows::workflows, workflows::undeploy, runs::start_run,
        runs::get_run, runs::delete_run, runs::trace, runs::graph, runs::test_from, runs::runs,
        runs::cancel, runs::redrive, crate::migrate::migrate, approvals::decide,
        approvals::my_approvals, inbox::notifications, inbox::mark_read, kb::delete_document
    ),
    components(schemas(ProblemDoc)),
    modifiers(&CommonAnswers),
    security(("api_key" = []))
)]
pub(crate) struct ApiDoc;

/// What every route has in common, added to each operation once rather
/// than written on each: the `api_key` bearer scheme, and the problems that
/// authentication, the store and body parsing answer.
struct CommonAnswers;

impl utoipa::Modify for CommonAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "api_key",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        let problem = |description: &str| {
            RefOr::T(
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        "application/problem+json",
                        Content::new(Some(Ref::from_schema_name("Problem"))),
                    )
                    .build(),
            )
        };
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let takes_body = operation.request_body.is_some();
                let mut answers = vec![
                    (
                        "401",
                        "No API key, or one of no account (`unauthenticated`)",
                    ),
                    (
                        "503",
                        "The store did not answer (`store_unavailable`); try again",
                    ),
                ];
                if takes_body {
                    answers.extend([
                        ("400", "The body is not JSON (`malformed_json`)"),
                        ("413", "The body is over 2 MiB (`body_too_large`)"),
                        (
                            "415",
                            "The body is not `application/json` (`unsupported_media_type`)",
                        ),
                        (
                            "422",
                            "The body is JSON of another shape (`invalid_request`)",
                        ),
                    ]);
                }
                for (status, description) in answers {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| problem(description));
                }
            }
        }
    }
}

/// An error answer (RFC 9457), as `crate::server::Problem` writes it.
#[derive(ToSchema)]
#[schema(as = Problem)]
#[allow(dead_code, reason = "describes the JSON that Problem builds")]
pub(crate) struct ProblemDoc {
    r#type: String,
    title: String,
    status: u16,
    /// Stable and documented: what a client branches on.
    code: String,
    detail: String,
    /// `does_not_check`: the source's errors (`code`, `message`, `file`,
    /// `line`, `column`), the first 100 of them.
    diagnostics: Option<Vec<Object>>,
    /// `does_not_check`: how many errors there are past those listed.
    diagnostics_omitted: Option<u64>,
    /// `invalid_input`: each place the input does not match (`path`, `expected`, `found`),
    /// at most 100, each part at most 160 characters.
    mismatches: Option<Vec<Object>>,
    /// `invalid_input`: how many mismatches there are past those listed.
    mismatches_omitted: Option<u64>,
    /// `invalid_plan`: each way the plan differs from what `flowc build` writes
    /// (`path`, a JSON Pointer into the plan, and `message`), at most 100, each
    /// at most 300 characters.
    problems: Option<Vec<Object>>,
    /// `invalid_plan`: validation stopped at the 100th problem; there may be more.
    more_problems: Option<bool>,
    /// `mcp_server_not_allowed`, `mcp_tool_not_allowed`: every MCP server or
    /// tool of the plan the account may not use (`code`, `message`), at most 20.
    refusals: Option<Vec<Object>>,
}

/// A JSON object, in documentation.
type Object = std::collections::BTreeMap<String, Value>;

/// A run's id and where it stands.
#[derive(Serialize, ToSchema)]
struct RunState {
    run_id: String,
    status: RunStatus,
}

/// A 422 when `plan` uses an MCP server or tool that the account may not
/// (`tenant_mcp::refusals`): the first refusal's code, and every refusal.
fn mcp_allowed(daemon: &Daemon, account: &str, plan: &Plan) -> Result<(), Problem> {
    // The configuration is this process's for its whole life: a plan that
    // passed for an account passes again, and a start need not walk it.
    let key = (account.to_string(), plan.hash.clone());
    let mut passed = daemon.mcp_passed.lock().unwrap_or_else(|p| p.into_inner());
    if passed.contains(&key) {
        return Ok(());
    }
    let refusals = crate::tenant_mcp::refusals(&daemon.config, account, plan);
    let Some(first) = refusals.first() else {
        passed.insert(key);
        return Ok(());
    };
    Err(
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, first.code, &first.message).with(
            "refusals",
            refusals
                .iter()
                .map(|refusal| json!({ "code": refusal.code, "message": refusal.message }))
                .collect(),
        ),
    )
}

#[derive(Serialize, ToSchema)]
struct Deleted {
    deleted: bool,
}

fn invalid_query(rejection: QueryRejection) -> Problem {
    let text = rejection.body_text();
    let text = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(&text);
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        &format!("the query does not read: {}", in_plain_words(text)),
    )
}

/// A deserializer's message with its Rust type names said as the API's
/// types: `u32` is a whole number to a client.
fn in_plain_words(message: &str) -> String {
    const TYPES: &[(&str, &str)] = &[
        ("expected u8", "expected a whole number, 0 or more"),
        ("expected u16", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected i32", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        (
            "invalid digit found in string",
            "not a whole number, 0 or more",
        ),
        (
            "cannot parse integer from empty string",
            "empty, where a whole number goes",
        ),
    ];
    TYPES.iter().fold(message.to_string(), |text, (rust, api)| {
        text.replace(rust, api)
    })
}

/// The account's run `id`, or a 404 that does not say whether it exists.
async fn own_run(daemon: &Daemon, account: &str, id: &str) -> Result<RunRow, Problem> {
    daemon
        .store
        .account_run(account, id)
        .await
        .map_err(store_problem)?
        .ok_or_else(|| unknown_run(id))
}

/// The answer to a run id that names no run of the account.
fn unknown_run(id: &str) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "unknown_run",
        &format!("no run `{id}`"),
    )
}

/// The body as `T`, or a problem saying what is wrong with it.
pub(crate) fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Problem> {
    from_json_body(&json_bytes(headers, body)?)
}

/// The body, if it was read and is sent as JSON, or a problem saying why
/// not.
pub(crate) fn json_bytes(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, Problem> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as `Content-Type: application/json`",
        ));
    }
    let body = body.map_err(|rejection| {
        let (status, text) = (rejection.status(), rejection.body_text());
        if text.contains(crate::connections::BodyTimedOut::MESSAGE) {
            return Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                crate::connections::BodyTimedOut::MESSAGE,
            );
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Problem::new(
                status,
                "body_too_large",
                &format!(
                    "the body is longer than the {} MiB flowd reads",
                    crate::server::BODY_LIMIT >> 20
                ),
            );
        }
        Problem::new(status, "unreadable_body", &text)
    })?;
    Ok(body)
}

/// A JSON body as `T` (which may borrow from it), or a problem saying
/// what is wrong with it.
pub(crate) fn from_json_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|error| {
        // Well-formed JSON of the wrong shape is unprocessable, not malformed.
        if error.classify() == serde_json::error::Category::Data {
            // Said in the API's words, not serde's (`[]` was "invalid length
            // 0, expected struct StartRun with 3 elements"; a count "expected
            // u32": an audit).
            let detail = match body.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => format!(
                    "the body is not what this route takes: {}",
                    in_plain_words(&error.to_string())
                ),
                _ => "the body is not what this route takes: a JSON object, `{...}`".to_string(),
            };
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", &detail)
        } else if error.to_string().starts_with("recursion limit exceeded") {
            // Well-formed too, as far as it was read: serde_json stops at
            // 128 levels, and "not JSON" would send the sender looking
            // for a syntax error.
            Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                &format!(
                    "the body nests more than 128 arrays and objects deep (line {}, column {}), deeper than this route takes",
                    error.line(),
                    error.column()
                ),
            )
        } else {
            Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                &format!("the body is not JSON: {error}"),
            )
        }
    })
}
