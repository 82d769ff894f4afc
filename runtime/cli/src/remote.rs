//! `flow --server URL --api-key KEY ...`: the same commands against a flowd,
//! through its HTTP API, with the same output and exit codes as on the
//! embedded store.

use std::time::Duration;

use flow_plan::Plan;
use flow_runtime::journal::StepRecord;
use flow_runtime::runner::RunRecord;
use flow_runtime::store::RunStatus;
use serde_json::{Value, json};

use crate::{Fail, Result, usage};

/// A flowd and the API key of one of its accounts.
pub(crate) struct Server {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Server {
    pub(crate) fn new(url: &str, key: Option<String>) -> Result<Server> {
        flow_runtime::llm::check_http_url(url).map_err(|e| usage(format!("--server {e}")))?;
        let key =
            key.ok_or_else(|| usage("--server needs an API key: --api-key KEY (or FLOW_API_KEY)"))?;
        Ok(Server {
            base: url.trim_end_matches('/').to_string(),
            key,
            http: reqwest::Client::new(),
        })
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
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(30));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| usage(format!("cannot reach {}: {e}", self.base)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| usage(format!("{}: the answer broke off: {e}", self.base)))?;
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(answer);
        }
        let mut message = answer["detail"]
            .as_str()
            .map_or_else(|| format!("{status}: {answer}"), str::to_string);
        for line in answer["diagnostics"].as_array().into_iter().flatten() {
            message.push_str(&format!(
                "\n  {}:{}: {} {}",
                line["line"], line["column"], line["code"], line["message"]
            ));
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
        Err(Fail(code, message))
    }

    /// Deploys the plan's workflows to the account.
    pub(crate) async fn deploy(&self, plan: &Plan) -> Result<()> {
        let plan: Value =
            serde_json::from_str(&plan.to_json()).map_err(|e| usage(e.to_string()))?;
        self.call(
            reqwest::Method::POST,
            "/v1/workflows",
            Some(json!({ "plan": plan })),
        )
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

    pub(crate) async fn decide(
        &self,
        run: &str,
        step_path: &str,
        approver: &str,
        approved: bool,
        comment: Option<String>,
    ) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/runs/{}/approvals/{step_path}", segment(run)),
            Some(json!({ "approver": approver, "approved": approved, "comment": comment })),
        )
        .await?;
        Ok(())
    }

    /// Waits until the run is no longer running (it completed, failed,
    /// parked or was cancelled); its record.
    pub(crate) async fn settled(&self, run: &str) -> Result<RunRecord> {
        let mut wait = Duration::from_millis(20);
        loop {
            let answer = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/runs/{}", segment(run)),
                    None,
                )
                .await?;
            let record: RunRecord = serde_json::from_value(answer.clone())
                .map_err(|e| usage(format!("{}: not a run record ({e}): {answer}", self.base)))?;
            if record.status != RunStatus::Running {
                return Ok(record);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// The account's runs, newest first: `(id, workflow, status)`.
    pub(crate) async fn runs(&self) -> Result<Vec<Value>> {
        let answer = self
            .call(reqwest::Method::GET, "/v1/runs?limit=1000", None)
            .await?;
        Ok(answer["runs"].as_array().cloned().unwrap_or_default())
    }

    pub(crate) async fn trace(&self, run: &str) -> Result<Vec<StepRecord>> {
        let answer = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{}/trace", segment(run)),
                None,
            )
            .await?;
        serde_json::from_value(answer["steps"].clone())
            .map_err(|e| usage(format!("{}: not a trace ({e})", self.base)))
    }
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
