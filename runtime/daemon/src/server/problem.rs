//! Errors as the API answers them: RFC 9457 problem documents with a code
//! clients branch on.

use super::*;

/// An error answer: a JSON problem object (RFC 9457) with a stable `code`,
/// and whatever fields say more (`diagnostics`, `mismatches`).
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    body: serde_json::Value,
    /// Seconds for a `Retry-After` header (a 429).
    retry_after: Option<u32>,
}

/// The longest `detail` answered: it names what the request sent (an id, a
/// name), and a 40 KB id came back whole in its 404 (an audit).
const LONGEST_DETAIL: usize = 2_048;

/// `detail` within [`LONGEST_DETAIL`] bytes: its start and end, with how
/// much was left out between them.
fn bounded(detail: &str) -> std::borrow::Cow<'_, str> {
    if detail.len() <= LONGEST_DETAIL {
        return std::borrow::Cow::Borrowed(detail);
    }
    let floor = |mut at: usize| {
        while !detail.is_char_boundary(at) {
            at -= 1;
        }
        at
    };
    let head = floor(LONGEST_DETAIL * 3 / 4);
    let tail = floor(detail.len() - LONGEST_DETAIL / 4);
    std::borrow::Cow::Owned(format!(
        "{} [... {} bytes left out ...] {}",
        &detail[..head],
        tail - head,
        &detail[tail..]
    ))
}

impl Problem {
    pub fn new(status: StatusCode, code: &str, detail: &str) -> Problem {
        let detail = bounded(detail);
        Problem {
            status,
            body: json!({
                "type": format!("https://flow.dev/problems/{code}"),
                "title": status.canonical_reason().unwrap_or("error"),
                "status": status.as_u16(),
                "code": code,
                "detail": detail,
            }),
            retry_after: None,
        }
    }

    /// Says in `Retry-After` when to try again.
    pub fn retry_after(mut self, seconds: u32) -> Problem {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with(mut self, field: &str, value: serde_json::Value) -> Problem {
        self.body[field] = value;
        self
    }

    /// The stable code clients branch on.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What went wrong, in words.
    pub fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or_default()
    }

    /// The body a response carries, which [`Problem::from_body`] reads
    /// back: how a compile worker (`compile_worker`) hands its problem to
    /// flowd.
    pub(crate) fn into_body(self) -> serde_json::Value {
        self.body
    }

    /// A problem from its body, if the body has a code and an error's
    /// status.
    pub(crate) fn from_body(body: serde_json::Value) -> Option<Problem> {
        let status = u16::try_from(body.get("status")?.as_u64()?).ok()?;
        let status = StatusCode::from_u16(status).ok()?;
        body.get("code")?.as_str()?;
        (status.is_client_error() || status.is_server_error()).then_some(Problem {
            status,
            body,
            retry_after: None,
        })
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            self.body.to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// A decision the rules refuse, as the problem that says why: no such gate
/// (404), not this person's to decide (403), or not any more (409).
pub(super) fn refusal(refused: &DecideError) -> Problem {
    let (status, code) = match refused {
        DecideError::UnknownStep(_) => (StatusCode::NOT_FOUND, "unknown_step"),
        DecideError::NotAnApprover { .. } => (StatusCode::FORBIDDEN, "not_an_approver"),
        DecideError::NotPending(_) | DecideError::Expired(_) | DecideError::RunEnded { .. } => {
            (StatusCode::CONFLICT, "decision_refused")
        }
    };
    Problem::new(status, code, &refused.to_string())
}

/// A store that failed to answer: the request may succeed when retried.
pub(crate) fn store_problem(error: StoreError) -> Problem {
    match error {
        // Data that cannot be used is not a store that will come back.
        StoreError::Damaged(_) => Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_damaged",
            &error.to_string(),
        ),
        error => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            &error.to_string(),
        ),
    }
}

/// The result of a store task spawned by a handler, as the handler's.
pub(crate) async fn joined<T>(
    task: tokio::task::JoinHandle<Result<T, Problem>>,
) -> Result<T, Problem> {
    match task.await {
        Ok(result) => result,
        Err(error) => Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &format!("the request's task stopped: {error}"),
        )),
    }
}

/// A problem as a response, for middleware and fallbacks.
pub fn problem(status: StatusCode, code: &str, detail: &str) -> Response {
    Problem::new(status, code, detail).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A detail that quotes a huge id is cut in its middle, on a character
    /// boundary, and says how much it left out.
    #[test]
    fn a_long_detail_keeps_its_start_and_end() {
        let id = "é".repeat(20_000);
        let problem = Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_run",
            &format!("no run `{id}` in this account"),
        );
        let detail = problem.detail();
        assert!(detail.len() <= LONGEST_DETAIL + 64, "{}", detail.len());
        assert!(detail.starts_with("no run `éé"), "{detail}");
        assert!(detail.ends_with("éé` in this account"), "{detail}");
        assert!(detail.contains("bytes left out"), "{detail}");
        let short = Problem::new(StatusCode::NOT_FOUND, "unknown_run", "no run `r1`");
        assert_eq!(short.detail(), "no run `r1`");
    }
}
