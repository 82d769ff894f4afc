//! A step record as the stores keep it: the JSON of one `step_runs` row.
//!
//! The interpreter's `StepRecord`, this stored form and the API's answer
//! (flowd's `api::TraceStep`) are three types, so that each can change
//! alone: a field the interpreter adds is stored only once this module
//! writes it, and a stored record outlives the process that wrote it, so
//! its shape is a format with a version.
//!
//! Invariants:
//! * Every record written carries its format, `"v"`, first.
//! * Records stored before the format had a number have no `"v"`: they
//!   are version 1, the shape this module writes, so every stored record
//!   reads.
//! * A record of a format newer than [`RECORD_FORMAT`] (written by a newer
//!   flow sharing the store) is refused as damaged, naming both versions,
//!   rather than read as something it is not.
//! * The SQL of the stores reads two fields inside records
//!   (`$.started_ms`, `$.input.expires_ms`, SQLite's migration 5): a new
//!   format keeps them or migrates that SQL with it.

use serde::Deserialize;
use serde_json::Value;

use super::{JournalWrite, NewRun, StoreError, json};
use crate::error::{ErrorKind, StepError};
use crate::journal::{Attempt, StepRecord, StepStatus};
use flow_plan::StepKind;

/// The format this build writes, and the newest it reads.
pub const RECORD_FORMAT: u32 = 1;

/// `record` as stored: the fields of format 1, in its order. Written by
/// hand rather than by serde (see `json`); the tests hold it to serde's
/// text of the interpreter's record.
pub fn encode(record: &StepRecord) -> String {
    let mut out = String::with_capacity(512);
    out.push_str("{\"v\":");
    json::write_u64(&mut out, u64::from(RECORD_FORMAT));
    out.push_str(",\"path\":");
    json::write_str(&mut out, &record.path);
    out.push_str(",\"step_id\":");
    json::write_str(&mut out, &record.step_id);
    out.push_str(",\"kind\":\"");
    out.push_str(record.kind.name());
    out.push_str("\",\"status\":\"");
    out.push_str(record.status.as_str());
    out.push_str("\",\"input\":");
    json::write_value(&mut out, &record.input);
    out.push_str(",\"output\":");
    match &record.output {
        Some(output) => json::write_value(&mut out, output),
        None => out.push_str("null"),
    }
    out.push_str(",\"error\":");
    match &record.error {
        Some(error) => {
            out.push_str("{\"kind\":\"");
            out.push_str(error.kind.name());
            out.push_str("\",\"message\":");
            json::write_str(&mut out, &error.message);
            out.push('}');
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"attempts\":[");
    for (i, attempt) in record.attempts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_attempt(&mut out, attempt);
    }
    out.push_str("],\"started_ms\":");
    json::write_u64(&mut out, record.started_ms);
    out.push_str(",\"ended_ms\":");
    json::write_u64(&mut out, record.ended_ms);
    if record.round != 0 {
        out.push_str(",\"round\":");
        json::write_u64(&mut out, u64::from(record.round));
    }
    out.push('}');
    out
}

/// An attempt's fields; those at their default are left out, as records
/// are most of a store's bytes.
fn write_attempt(out: &mut String, attempt: &Attempt) {
    out.push_str("{\"index\":");
    json::write_u64(out, u64::from(attempt.index));
    out.push_str(",\"error\":");
    match &attempt.error {
        Some(error) => json::write_str(out, error),
        None => out.push_str("null"),
    }
    out.push_str(",\"delay_ms\":");
    match attempt.delay_ms {
        Some(delay_ms) => json::write_u64(out, delay_ms),
        None => out.push_str("null"),
    }
    if attempt.round != 0 {
        out.push_str(",\"round\":");
        json::write_u64(out, u64::from(attempt.round));
    }
    if attempt.repair {
        out.push_str(",\"repair\":true");
    }
    if attempt.cut_short {
        out.push_str(",\"cut_short\":true");
    }
    if let Some(started_ms) = attempt.started_ms {
        out.push_str(",\"started_ms\":");
        json::write_u64(out, started_ms);
    }
    if let Some(ended_ms) = attempt.ended_ms {
        out.push_str(",\"ended_ms\":");
        json::write_u64(out, ended_ms);
    }
    out.push('}');
}

/// A stored record, read back.
pub fn decode(json: &str) -> Result<StepRecord, StoreError> {
    let stored: StoredRecord = serde_json::from_str(json)
        .map_err(|error| StoreError::Damaged(format!("a damaged step record: {error}")))?;
    if stored.v > RECORD_FORMAT {
        return Err(StoreError::Damaged(format!(
            "a step record of format {} (at `{}`), newer than this flow reads ({RECORD_FORMAT}): a newer flow wrote it",
            stored.v, stored.path
        )));
    }
    Ok(stored.into())
}

/// A journal write with its records (and a new run's input) in their
/// stored form, encoded on the run's own thread: a store's writer is one
/// thread or task that runs at once wait for, and encoding was a sixth of
/// its CPU in B1.
pub struct EncodedWrite {
    pub write: JournalWrite,
    /// `encode` of each of `write.records`, in order.
    pub records: Vec<String>,
    /// The JSON of `write.start`'s input: read through `start`, which
    /// pairs the two.
    input: Option<String>,
}

impl EncodedWrite {
    pub fn new(write: JournalWrite) -> EncodedWrite {
        let records = write.records.iter().map(|record| encode(record)).collect();
        let input = write.start.as_ref().map(|start| {
            let mut input = String::new();
            json::write_value(&mut input, &start.input);
            input
        });
        EncodedWrite {
            write,
            records,
            input,
        }
    }

    /// The run this write starts, if it does, with its input's JSON.
    pub fn start(&self) -> Option<(&NewRun, &str)> {
        self.write.start.as_ref().zip(self.input.as_deref())
    }
}

/// A stored record as read, of any format up to [`RECORD_FORMAT`].
#[derive(Deserialize)]
struct StoredRecord {
    /// Absent in records stored before formats were numbered: version 1.
    #[serde(default = "first_format")]
    v: u32,
    path: String,
    step_id: String,
    kind: StepKind,
    status: StepStatus,
    input: Value,
    output: Option<std::sync::Arc<Value>>,
    error: Option<StoredErrorRead>,
    attempts: Vec<StoredAttemptRead>,
    started_ms: u64,
    ended_ms: u64,
    #[serde(default)]
    round: u32,
}

fn first_format() -> u32 {
    1
}

#[derive(Deserialize)]
struct StoredErrorRead {
    kind: ErrorKind,
    message: String,
}

#[derive(Deserialize)]
struct StoredAttemptRead {
    index: u32,
    error: Option<String>,
    delay_ms: Option<u64>,
    #[serde(default)]
    round: u32,
    #[serde(default)]
    repair: bool,
    #[serde(default)]
    cut_short: bool,
    #[serde(default)]
    started_ms: Option<u64>,
    #[serde(default)]
    ended_ms: Option<u64>,
}

impl From<StoredRecord> for StepRecord {
    fn from(stored: StoredRecord) -> StepRecord {
        StepRecord {
            path: stored.path,
            step_id: stored.step_id,
            kind: stored.kind,
            status: stored.status,
            input: stored.input,
            output: stored.output,
            error: stored
                .error
                .map(|error| StepError::new(error.kind, error.message)),
            attempts: stored
                .attempts
                .into_iter()
                .map(|attempt| Attempt {
                    index: attempt.index,
                    error: attempt.error,
                    delay_ms: attempt.delay_ms,
                    round: attempt.round,
                    repair: attempt.repair,
                    started_ms: attempt.started_ms,
                    ended_ms: attempt.ended_ms,
                    cut_short: attempt.cut_short,
                })
                .collect(),
            started_ms: stored.started_ms,
            ended_ms: stored.ended_ms,
            round: stored.round,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> StepRecord {
        StepRecord {
            path: "each[1]/classify".into(),
            step_id: "classify".into(),
            kind: StepKind::Recipe,
            status: StepStatus::Completed,
            input: json!({ "q": "x" }),
            output: Some(json!({ "a": 1 }).into()),
            error: Some(StepError::new(ErrorKind::RateLimited, "HTTP 429")),
            attempts: vec![
                Attempt {
                    index: 0,
                    error: Some("rate_limited: HTTP 429".into()),
                    delay_ms: Some(2000),
                    round: 0,
                    repair: false,
                    started_ms: Some(10),
                    ended_ms: Some(20),
                    cut_short: false,
                },
                Attempt {
                    index: 1,
                    error: None,
                    delay_ms: None,
                    round: 1,
                    repair: true,
                    started_ms: None,
                    ended_ms: None,
                    cut_short: true,
                },
            ],
            started_ms: 5,
            ended_ms: 30,
            round: 1,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let record = record();
        let json = encode(&record);
        assert!(json.starts_with(r#"{"v":1,"path":"#), "{json}");
        assert_eq!(decode(&json).unwrap(), record);
    }

    /// The hand-written text is serde's of the interpreter's record, with
    /// the format first: what records were before `encode` was written by
    /// hand, and what `flow trace --json` shows.
    #[test]
    fn a_record_is_written_as_serde_writes_it() {
        let full = record();
        let bare = StepRecord {
            output: None,
            error: None,
            attempts: Vec::new(),
            round: 0,
            input: json!({ "text": "line\n\"quoted\" \u{1} é", "n": [1.5, -2] }),
            ..record()
        };
        for record in [full, bare] {
            let serde = serde_json::to_string(&record).unwrap();
            let expected = format!("{{\"v\":{RECORD_FORMAT},{}", &serde[1..]);
            assert_eq!(encode(&record), expected);
        }
    }

    /// Regression guard for the stores' records written before formats
    /// were numbered (and for the SQL that reads inside them): they read
    /// as version 1, and version 1 is what the interpreter's record was
    /// serialized as.
    #[test]
    fn a_record_stored_before_formats_reads_as_version_1() {
        let record = record();
        let legacy = serde_json::to_string(&record).unwrap();
        assert!(!legacy.contains("\"v\""));
        assert_eq!(decode(&legacy).unwrap(), record);
        let mut stored: Value = serde_json::from_str(&encode(&record)).unwrap();
        stored.as_object_mut().unwrap().remove("v");
        assert_eq!(stored, serde_json::to_value(&record).unwrap());
    }

    #[test]
    fn a_record_of_a_newer_format_is_refused_by_name() {
        let mut stored: Value = serde_json::from_str(&encode(&record())).unwrap();
        stored["v"] = json!(RECORD_FORMAT + 1);
        let error = decode(&stored.to_string()).unwrap_err().to_string();
        assert!(
            error.contains("format 2") && error.contains("each[1]/classify"),
            "{error}"
        );
    }
}
