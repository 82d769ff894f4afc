//! The kinds of failure a step attempt can have. They are part of the plan's
//! meaning: a step's `Retry` policy retries the kinds that say they pass,
//! and a fallback block reads the kind as `error.kind`. The runtime records
//! them in the journal and the API reports them; the MCP client classifies
//! its failures with them.

use serde::{Deserialize, Serialize};

/// What kind of failure a step attempt had; it decides whether to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 429: retried, honouring `Retry-After` within the backoff cap.
    RateLimited,
    /// 5xx: retried.
    Server,
    /// The attempt ran past the step's timeout: retried.
    Timeout,
    /// The connection failed or was reset: retried.
    Connection,
    /// Any other 4xx, or a request refused before it went out (a redirect,
    /// a server certificate not trusted): not retried.
    Client,
    /// The output does not fit the recipe's schema, after the repair attempt.
    InvalidOutput,
    /// An expression could not be evaluated (a `json` value of another shape).
    Expression,
    /// The step needs something this runtime does not have (an MCP client,
    /// an MCP server's command).
    Unsupported,
    /// An MCP tool answered with an error (`isError`, or a JSON-RPC error
    /// about the request such as an unknown tool): not retried, since the
    /// same call would get the same answer. Errors that say they are
    /// transient (a timeout, a reset connection) get those kinds instead.
    Tool,
    /// An approval was rejected with `on_reject: "fail"`.
    Rejected,
    /// An approval expired with `on_expire: "fail"`.
    Expired,
    /// What the run needs is missing or wrong (its input, a model alias, an
    /// MCP server, its knowledge base): nothing ran.
    Preflight,
    /// flow itself failed on the run (a bug: a panic in the runtime): the
    /// run fails with what it met, rather than stay `running` undriven,
    /// and a redrive goes on from there once flow is fixed. Not retried.
    Internal,
    /// The run's account is past a quota of what it may hold (flowd's
    /// `stored_bytes`): the run stops where it is. Not retried; a redrive
    /// goes on once data is deleted or the quota raised.
    Quota,
}

impl ErrorKind {
    /// The kind of an HTTP error status from a model's API (and of a test's
    /// `fails STATUS`, which stands for one).
    pub fn of_status(status: u16) -> ErrorKind {
        match status {
            429 => ErrorKind::RateLimited,
            // A request timeout on the server's side is worth another try.
            408 => ErrorKind::Timeout,
            // Anthropic's "overloaded" is 529, within this range.
            500..=599 => ErrorKind::Server,
            _ => ErrorKind::Client,
        }
    }

    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Server | ErrorKind::Timeout | ErrorKind::Connection
        )
    }

    /// The kind as the `error` value of a fallback block spells it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Server => "server",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Client => "client",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::Expression => "expression",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Tool => "tool",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Expired => "expired",
            ErrorKind::Preflight => "preflight",
            ErrorKind::Internal => "internal",
            ErrorKind::Quota => "quota",
        }
    }
}
