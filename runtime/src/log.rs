//! Logs: the runtime and flowd report through `tracing` events; a binary
//! installs [`init`] once, which writes them to standard error, one line per
//! event, as a person reads them or as JSON.
//!
//! A value in a log line may come from a tenant (a run's input in an error,
//! a server's answer), so every message and field is escaped: a CR or LF in
//! it never starts a new line, and in the human form a field's value is
//! quoted when it holds a space, a quote or `=`, so that a value cannot pose
//! as another field.

use std::fmt::Write as _;
use std::io::Write as _;
use std::str::FromStr;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `2026-12-01T17:21:32.123Z  INFO message key=value ...`
    Human,
    /// One JSON object per line: `time`, `level`, `target`, `message` and
    /// the event's fields.
    Json,
    /// `warning: message key=value ...`, as a command line tool reports
    /// (`flow`): no time, the level in the words of its other messages.
    Brief,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format `{other}`: the formats are human and json"
            )),
        }
    }
}

/// Which events are written and how.
#[derive(Debug, Clone)]
pub struct LogSettings {
    filter: Targets,
    format: LogFormat,
}

impl LogSettings {
    /// Warnings and errors, briefly: what a command line tool shows. Not
    /// the MCP library's warnings about its own transport ("Error sending
    /// response id=4", an audit): flow says what failed, with the step.
    pub fn brief() -> LogSettings {
        LogSettings {
            filter: Targets::new()
                .with_default(Level::WARN)
                .with_target("rmcp", Level::ERROR),
            format: LogFormat::Brief,
        }
    }

    /// From the words of an environment: `level` as `info`, `debug`, or per
    /// module (`warn,flow_runtime::mcp=debug`), `info` when absent; `format`
    /// `human` (the default) or `json`. `variables` names where each came
    /// from, for the error.
    pub fn parse(
        level: Option<&str>,
        format: Option<&str>,
        variables: [&str; 2],
    ) -> Result<LogSettings, String> {
        let filter = match level {
            None => Targets::new().with_default(Level::INFO),
            Some(text) => parse_filter(text).map_err(|error| {
                format!(
                    "{} `{text}`: {error} (a level: off, error, warn, info, debug or trace, optionally per module as `warn,flow_runtime::mcp=debug`)",
                    variables[0]
                )
            })?,
        };
        let format = match format {
            None => LogFormat::Human,
            Some(text) => text
                .parse()
                .map_err(|error| format!("{} {error}", variables[1]))?,
        };
        Ok(LogSettings { filter, format })
    }
}

/// `warn,flow_runtime::mcp=debug`: a default level and levels per module.
/// tracing-subscriber would take a bare word for a module shown at every
/// level; here a bare word must be a level, so that a misspelt level is an
/// error rather than silence.
fn parse_filter(text: &str) -> Result<Targets, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for part in text.split(',').map(str::trim) {
        let level = part.rsplit_once('=').map_or(part, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!("`{level}` is not a level"));
        }
    }
    text.parse::<Targets>().map_err(|error| error.to_string())
}

/// Makes `settings` the process's logger. Only the first call has an effect
/// (a test process may call it from several tests).
pub fn init(settings: LogSettings) {
    let subscriber = tracing_subscriber::registry().with(
        Lines {
            format: settings.format,
        }
        .with_filter(settings.filter),
    );
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The layer that writes each event as a line.
struct Lines {
    format: LogFormat,
}

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let time = crate::time::rfc3339_utc_ms(crate::time::now_ms());
        let line = match self.format {
            LogFormat::Human => human_line(&format!("{time} {:>5}", metadata.level()), &fields),
            LogFormat::Brief => {
                let level = match *metadata.level() {
                    Level::ERROR => "error:",
                    Level::WARN => "warning:",
                    _ => "note:",
                };
                human_line(level, &fields)
            }
            LogFormat::Json => json_line(&time, *metadata.level(), metadata.target(), fields),
        };
        // One write per line, so that lines of concurrent events do not mix.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// An event's message and fields, in the order they were given.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, Value)>,
}

impl Fields {
    fn add(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
        } else {
            self.fields.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.add(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, Value::String(value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.add(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.add(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.add(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.add(field, Value::String(value.to_string()));
    }
}

/// `head`, the message and the fields, escaped.
fn human_line(head: &str, fields: &Fields) -> String {
    let mut line = format!("{head} ");
    escape_into(&mut line, &fields.message);
    for (name, value) in &fields.fields {
        let _ = write!(line, " {name}=");
        match value {
            Value::String(text) if needs_quotes(text) => {
                line.push('"');
                for c in text.chars() {
                    if matches!(c, '"' | '\\') {
                        line.push('\\');
                    }
                    escape_char(&mut line, c);
                }
                line.push('"');
            }
            Value::String(text) => escape_into(&mut line, text),
            other => {
                let _ = write!(line, "{other}");
            }
        }
    }
    line.push('\n');
    line
}

fn json_line(time: &str, level: Level, target: &str, fields: Fields) -> String {
    let mut object = Map::new();
    object.insert("time".into(), Value::from(time));
    object.insert("level".into(), Value::from(level.as_str()));
    object.insert("target".into(), Value::from(target));
    object.insert("message".into(), Value::from(fields.message));
    for (name, value) in fields.fields {
        object.insert(name.into(), value);
    }
    // serde_json escapes every control character.
    let mut line = Value::Object(object).to_string();
    line.push('\n');
    line
}

fn needs_quotes(text: &str) -> bool {
    text.is_empty()
        || text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '='))
}

fn escape_into(line: &mut String, text: &str) {
    for c in text.chars() {
        escape_char(line, c);
    }
}

/// `c`, or its escape when it is a control character.
fn escape_char(line: &mut String, c: char) {
    match c {
        '\n' => line.push_str("\\n"),
        '\r' => line.push_str("\\r"),
        '\t' => line.push_str("\\t"),
        c if c.is_control() => {
            let _ = write!(line, "\\u{{{:x}}}", c as u32);
        }
        c => line.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(message: &str, fields: Vec<(&'static str, Value)>) -> Fields {
        Fields {
            message: message.to_string(),
            fields,
        }
    }

    /// Regression: a CR/LF in a run's input, logged in an error, started a
    /// new line that a log reader took for an event of its own.
    #[test]
    fn a_line_break_in_a_value_stays_on_its_line() {
        let human = human_line(
            "T  WARN",
            &fields(
                "run failed\nINFO forged",
                vec![
                    ("run", Value::from("run-1")),
                    ("error", Value::from("bad\r\nlevel=INFO \"x\"")),
                    ("attempt", Value::from(2)),
                ],
            ),
        );
        assert_eq!(
            human,
            "T  WARN run failed\\nINFO forged run=run-1 error=\"bad\\r\\nlevel=INFO \\\"x\\\"\" attempt=2\n"
        );
        let json = json_line(
            "T",
            Level::WARN,
            "flowd",
            fields("a\nb", vec![("error", Value::from("c\u{1b}d"))]),
        );
        assert_eq!(json.lines().count(), 1);
        let parsed: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["message"], "a\nb");
        assert_eq!(parsed["error"], "c\u{1b}d");
        assert_eq!(parsed["level"], "WARN");
    }

    #[test]
    fn settings_name_the_variable_of_a_bad_value() {
        let names = ["FLOWD_LOG", "FLOWD_LOG_FORMAT"];
        assert!(
            LogSettings::parse(Some("warn,flow_runtime::mcp=debug"), Some("json"), names).is_ok()
        );
        let error = LogSettings::parse(Some("loud"), None, names).unwrap_err();
        assert!(error.starts_with("FLOWD_LOG `loud`"), "{error}");
        let error = LogSettings::parse(None, Some("xml"), names).unwrap_err();
        assert_eq!(
            error,
            "FLOWD_LOG_FORMAT unknown log format `xml`: the formats are human and json"
        );
    }
}
