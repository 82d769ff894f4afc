//! `flowc explain`: the documentation of a code: a diagnostic's, from
//! `flow-compiler`'s `codes.rs`, or a `flowc diff` incompatibility's, from
//! `flow_plan::compat`.

use flow_compiler::Severity;
use flow_compiler::codes::Code;
use flow_plan::compat;

use crate::Exit;

pub(crate) fn run(code: Option<&str>, list: bool) -> Exit {
    if list {
        out!("{}", listing());
        return Exit::Ok;
    }
    // clap requires one of CODE and --list, so `code` is present here.
    let Some(code) = code else {
        out!("{}", listing());
        return Exit::Ok;
    };
    match parse(code) {
        Some(found) => {
            out!("{}", explain(&found));
            Exit::Ok
        }
        None => {
            eprintln!("error: unknown code `{code}`; the codes are:\n");
            eprint!("{}", listing());
            Exit::Usage
        }
    }
}

/// A code's documentation, whichever list it comes from.
#[derive(Debug)]
struct Doc {
    code: &'static str,
    name: &'static str,
    /// `error`, `warning`, or `diff` for an incompatibility.
    class: &'static str,
    summary: &'static str,
    explanation: &'static str,
}

impl From<Code> for Doc {
    fn from(code: Code) -> Doc {
        let info = code.info();
        Doc {
            code: info.code,
            name: info.name,
            class: match info.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            },
            summary: info.summary,
            explanation: info.explanation,
        }
    }
}

impl From<compat::Code> for Doc {
    fn from(code: compat::Code) -> Doc {
        let info = code.info();
        Doc {
            code: info.code,
            name: info.name,
            class: "diff",
            summary: info.summary,
            explanation: info.explanation,
        }
    }
}

/// Every code: the diagnostics', then `flowc diff`'s.
fn all() -> impl Iterator<Item = Doc> {
    Code::ALL
        .iter()
        .map(|&code| Doc::from(code))
        .chain(compat::Code::ALL.iter().map(|&code| Doc::from(code)))
}

/// Accepts `E101`, `e101`, ` E101 ` and the name `unknown-step` (or
/// `Unknown-Step`), since people copy codes from logs and type names by hand.
fn parse(text: &str) -> Option<Doc> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    all().find(|doc| doc.code.eq_ignore_ascii_case(text) || doc.name == lower)
}

fn explain(doc: &Doc) -> String {
    // The explanation is the doc comment of the code, whose lines keep the
    // space after `///`.
    let body: String = doc
        .explanation
        .trim_end()
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix(' ').unwrap_or(line)))
        .collect();
    format!(
        "{} {} ({})\n\n{}.\n\n{body}",
        doc.code,
        doc.name,
        doc.class,
        capitalize(doc.summary),
    )
}

/// Every code with its name, class and summary, one per line.
fn listing() -> String {
    let width = all().map(|doc| doc.name.len()).max().unwrap_or(0);
    all()
        .map(|doc| {
            format!(
                "{}  {:<width$}  {:<7}  {}\n",
                doc.code, doc.name, doc.class, doc.summary
            )
        })
        .collect()
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_parse_by_code_and_name() {
        let code = |text| parse(text).map(|doc| doc.code);
        assert_eq!(code("E101"), Some("E101"));
        assert_eq!(code("e101"), Some("E101"));
        assert_eq!(code("unknown-step"), Some("E101"));
        assert_eq!(code("Unknown-Step"), Some("E101"));
        assert_eq!(code("d002"), Some("D002"));
        assert_eq!(code("resume-point-removed"), Some("D002"));
        assert_eq!(code("E999"), None);
    }

    #[test]
    fn explanations_are_dedented() {
        let text = explain(&Code::UnknownStep.into());
        assert!(text.starts_with("E101 unknown-step (error)\n\nReference to a step"));
        assert!(text.contains("\nA path names a step id"), "{text}");
    }

    #[test]
    fn every_code_is_listed() {
        assert_eq!(
            listing().lines().count(),
            Code::ALL.len() + compat::Code::ALL.len()
        );
    }
}
