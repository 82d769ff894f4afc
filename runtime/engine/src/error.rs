//! A step attempt's error; its kind (`flow_plan::ErrorKind`) decides whether it
//! is retried.

use std::time::Duration;

pub use flow_plan::ErrorKind;
use serde::{Deserialize, Serialize};

use crate::eval::EvalError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepError {
    pub kind: ErrorKind,
    pub message: String,
    /// A provider's `Retry-After`, honoured within the backoff cap.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
    /// An `invalid_output` error's answer that did not fit, and why: the
    /// interpreter asks for a repair with them, as an attempt of its own.
    #[serde(skip)]
    pub repairable: Option<crate::services::Repair>,
}

impl StepError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> StepError {
        StepError {
            kind,
            message: message.into(),
            retry_after: None,
            repairable: None,
        }
    }
}

impl From<EvalError> for StepError {
    fn from(error: EvalError) -> StepError {
        StepError::new(ErrorKind::Expression, error.0)
    }
}

/// An error and the errors under it, each said once: a library's outer
/// error ("error sending request for url", "error performing TLS
/// handshake") says that something failed, and only its causes say what
/// (the connection refused, the certificate not trusted).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let said = inner.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = inner.source();
    }
    text
}
