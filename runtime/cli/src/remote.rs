//! `flow --server URL --api-key KEY ...`: the same commands against a flowd,
//! through its HTTP API, with the same output and exit codes as on the
//! embedded store.

use std::time::Duration;

use flow_plan::Plan;
use flow_runtime::journal::StepRecord;
use flow_runtime::runner::RunRecord;
use flow_runtime::services::StepNow;
use flow_runtime::store::{Notification, RunChange, RunStatus};
use serde_json::{Value, json};

use crate::lists::{GateLine, RunLine};
use crate::{Fail, Result, usage};

/// A flowd and the API key of one of its accounts.
pub(crate) struct Server {
    base: String,
    /// `base` as printed commands name it, a password in it masked.
    shown: String,
    key: String,
    http: reqwest::Client,
}

impl Server {
    pub(crate) fn new(url: &str, key: Option<String>) -> Result<Server> {
        flow_runtime::llm::check_http_url(url).map_err(|e| usage(format!("--server {e}")))?;
        let key =
            key.ok_or_else(|| usage("--server needs an API key: --api-key KEY (or FLOW_API_KEY)"))?;
        let base = url.trim_end_matches('/').to_string();
        Ok(Server {
            shown: flow_runtime::mcp::masked_url(&base),
            base,
            key,
            http: reqwest::Client::new(),
        })
    }

    /// The flowd's URL as the commands `flow` prints name it.
    pub(crate) fn url(&self) -> &str {
        &self.shown
    }

    /// Sends a request; the answer's JSON, or a failure saying what flowd
    /// said (its problem's `detail`, with any diagnostics, mismatches or
    /// plan problems).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        self.call_with_text(method, path, body.map(|body| body.to_string()))
            .await
    }

    /// [`Server::call`] with a body already written as JSON text.
    async fn call_with_text(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> Result<Value> {
        let answer = self.send(method, path, body).await?;
        match answer.problem {
            None => Ok(answer.body),
            Some(status) => Err(problem(status, &answer.body)),
        }
    }

    /// Sends a request; flowd's answer, a problem included. A request that
    /// gets no answer fails with where it went and why (`unreachable`).
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> Result<Answer> {
        let url = format!("{}{path}", self.base);
        let tried = format!("{method} {url}");
        let mut request = self
            .http
            .request(method, &url)
            .bearer_auth(&self.key)
            .timeout(REQUEST_TIMEOUT);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| usage(unreachable(&self.base, &tried, &e)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| usage(format!("{tried}: the answer broke off: {}", root_cause(&e))))?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer {
            problem: (!status.is_success()).then_some(status),
            body,
        })
    }

    /// Deploys the plan's workflows to the account.
    pub(crate) async fn deploy(&self, plan: &Plan) -> Result<()> {
        // Written around the plan's text: read back into a tree of values,
        // a plan of deeply nested branches went past serde_json's 128
        // levels.
        let body = format!(r#"{{"plan":{}}}"#, plan.to_json());
        self.call_with_text(reqwest::Method::POST, "/v1/workflows", Some(body))
            .await?;
        Ok(())
    }

    /// Starts a run of a deployed workflow; its id.
    pub(crate) async fn start(&self, workflow: &str, input: Value) -> Result<String> {
        let started = self
            .call(
                reqwest::Method::POST,
                "/v1/runs",
                Some(json!({ "workflow": workflow, "input": input })),
            )
            .await?;
        started["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| usage(format!("{}: no run id in {started}", self.base)))
    }

    /// Decides a gate. A path with no gate is answered with the gates
    /// the run waits at, and the one meant if it is a likely typo.
    pub(crate) async fn decide(
        &self,
        run: &str,
        step_path: &str,
        approver: &str,
        approved: bool,
        comment: Option<String>,
    ) -> Result<()> {
        let answer = self
            .send(
                reqwest::Method::POST,
                &format!(
                    "/v1/runs/{}/approvals/{}",
                    segment(run),
                    // Each segment of the path encoded (a loop's `[3]`), its
                    // slashes kept: the route takes the rest of the URL.
                    step_path
                        .split('/')
                        .map(segment)
                        .collect::<Vec<_>>()
                        .join("/")
                ),
                Some(
                    json!({ "approver": approver, "approved": approved, "comment": comment })
                        .to_string(),
                ),
            )
            .await?;
        let Some(status) = answer.problem else {
            return Ok(());
        };
        let mut failure = problem(status, &answer.body);
        if answer.body["code"] == "unknown_step" {
            let waiting = self.run(run).await?.pending_approvals.unwrap_or_default();
            let paths: Vec<&str> = waiting.iter().map(|gate| gate.path.as_str()).collect();
            failure.1.push_str(&crate::gate_hint(step_path, &paths));
        }
        Err(failure)
    }

    /// Waits until the run is no longer running (it completed, failed,
    /// parked or was cancelled); its record.
    pub(crate) async fn settled(&self, run: &str) -> Result<RunRecord> {
        let mut wait = Duration::from_millis(20);
        loop {
            let record = self.run(run).await?;
            if record.status != RunStatus::Running {
                return Ok(record);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// The account's runs that match, newest first.
    pub(crate) async fn runs(
        &self,
        workflow: Option<&str>,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<RunLine>> {
        let mut path = format!("/v1/runs?limit={}", limit.min(1_000));
        if let Some(workflow) = workflow {
            path.push_str(&format!("&workflow={}", segment(workflow)));
        }
        if let Some(status) = status {
            path.push_str(&format!("&status={status}"));
        }
        let answer = self.call(reqwest::Method::GET, &path, None).await?;
        serde_json::from_value(answer["runs"].clone())
            .map_err(|e| usage(format!("{}: not a list of runs ({e})", self.base)))
    }

    /// The run's record as flowd keeps it.
    pub(crate) async fn run(&self, run: &str) -> Result<RunRecord> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{}", segment(run)),
                None,
            )
            .await?;
        serde_json::from_value(answer.clone())
            .map_err(|e| usage(format!("{}: not a run record ({e}): {answer}", self.base)))
    }

    pub(crate) async fn cancel(&self, run: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/runs/{}/cancel", segment(run)),
            None,
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn redrive(&self, run: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/runs/{}/redrive", segment(run)),
            None,
        )
        .await?;
        Ok(())
    }

    /// The gates `approver` (or an approver group of theirs) may decide.
    pub(crate) async fn approvals(&self, approver: &str) -> Result<Vec<GateLine>> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/approvals?approver={}", segment(approver)),
                None,
            )
            .await?;
        serde_json::from_value(answer["approvals"].clone())
            .map_err(|e| usage(format!("{}: not a list of approvals ({e})", self.base)))
    }

    /// What `reader` was notified of, newest first.
    pub(crate) async fn notifications(
        &self,
        reader: &str,
        unread: bool,
        limit: usize,
    ) -> Result<Vec<Notification>> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!(
                    "/v1/notifications?reader={}&unread={unread}&limit={}",
                    segment(reader),
                    limit.min(1_000)
                ),
                None,
            )
            .await?;
        serde_json::from_value(answer["notifications"].clone())
            .map_err(|e| usage(format!("{}: not a list of notifications ({e})", self.base)))
    }

    /// The `test` block flowd writes from a run (`GET /v1/runs/{id}/test`).
    pub(crate) async fn test_from(&self, run: &str) -> Result<String> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{}/test", segment(run)),
                None,
            )
            .await?;
        answer["test"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| usage(format!("{}: no test in the answer", self.base)))
    }

    /// A run's step records, its history (redrives, moves, deliveries) and
    /// the steps it executes now, if flowd drives it.
    pub(crate) async fn trace(
        &self,
        run: &str,
    ) -> Result<(Vec<StepRecord>, Vec<RunChange>, Vec<StepNow>)> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{}/trace", segment(run)),
                None,
            )
            .await?;
        let records = serde_json::from_value(answer["steps"].clone())
            .map_err(|e| usage(format!("{}: not a trace ({e})", self.base)))?;
        // A flowd from before histories answers none.
        let history = RunChange::list(&answer["history"]);
        // Absent when this flowd does not drive the run (or is older).
        let in_flight = serde_json::from_value(answer["in_flight"].clone()).unwrap_or_default();
        Ok((records, history, in_flight))
    }
}

/// How long one request may take: flowd answers every route at once (a
/// run is started, not awaited), so this only bounds a server that hangs.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// flowd's answer: its body, and its status when it is a problem.
struct Answer {
    problem: Option<reqwest::StatusCode>,
    body: Value,
}

/// A problem flowd answered, as a failure: its `detail`, with the
/// diagnostics, mismatches or plan problems it lists.
fn problem(status: reqwest::StatusCode, answer: &Value) -> Fail {
    let mut message = answer["detail"]
        .as_str()
        .map_or_else(|| format!("{status}: {answer}"), str::to_string);
    for line in answer["diagnostics"].as_array().into_iter().flatten() {
        message.push_str(&format!(
            "\n  {}:{}: {} {}",
            line["line"], line["column"], line["code"], line["message"]
        ));
    }
    if let Some(more) = answer["diagnostics_omitted"].as_u64().filter(|n| *n > 0) {
        message.push_str(&format!("\n  and {more} more"));
    }
    for mismatch in answer["mismatches"].as_array().into_iter().flatten() {
        message.push_str(&format!(
            "\n  {}: expected {}, found {}",
            mismatch["path"].as_str().unwrap_or(""),
            mismatch["expected"].as_str().unwrap_or(""),
            mismatch["found"].as_str().unwrap_or("")
        ));
    }
    if let Some(more) = answer["mismatches_omitted"].as_u64().filter(|n| *n > 0) {
        message.push_str(&format!("\n  and {more} more"));
    }
    for problem in answer["problems"].as_array().into_iter().flatten() {
        message.push_str(&format!(
            "\n  {}: {}",
            problem["path"].as_str().unwrap_or(""),
            problem["message"].as_str().unwrap_or("")
        ));
    }
    // As on the embedded store: input that does not match fails the run
    // (1); anything else is a usage error (2).
    let code = if answer["code"] == "invalid_input" {
        1
    } else {
        2
    };
    Fail(code, message)
}

/// Why a request to flowd got no answer, in words a person can act on: the
/// host and port it went to, the request tried, what failed (the innermost
/// cause: "Connection refused", a name that does not resolve, a timeout),
/// and what to check. reqwest's own words ("error sending request for
/// url") say none of that.
fn unreachable(base: &str, tried: &str, error: &reqwest::Error) -> String {
    let at = reqwest::Url::parse(base)
        .ok()
        .and_then(|url| {
            let host = url.host_str()?.to_string();
            Some(format!("{host}:{}", url.port_or_known_default()?))
        })
        .unwrap_or_else(|| base.to_string());
    let why = if error.is_timeout() {
        format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
    } else {
        root_cause(error)
    };
    format!(
        "cannot reach flowd at {at} ({tried}): {why}\n  help: is `flowd serve` running and listening on {at}? --server (or FLOW_SERVER) names it"
    )
}

/// The innermost error of a chain: the operating system's or resolver's
/// words, under reqwest's and hyper's wrappers.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// A run id as one path segment: ids are plain, but a typed one might not be.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
