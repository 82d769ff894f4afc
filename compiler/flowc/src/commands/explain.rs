//! `flowc explain`: the documentation of a diagnostic code, from `codes.rs`.

use flow_compiler::Severity;
use flow_compiler::codes::{Code, CodeInfo};

use crate::Exit;

pub(crate) fn run(code: Option<&str>, list: bool) -> Exit {
    if list {
        print!("{}", listing());
        return Exit::Ok;
    }
    // clap requires one of CODE and --list, so `code` is present here.
    let Some(code) = code else {
        print!("{}", listing());
        return Exit::Ok;
    };
    match parse(code) {
        Some(found) => {
            print!("{}", explain(found.info()));
            Exit::Ok
        }
        None => {
            eprintln!("error: unknown diagnostic code `{code}`; the codes are:\n");
            eprint!("{}", listing());
            Exit::Usage
        }
    }
}

/// Accepts `E101`, `e101`, ` E101 ` and the name `unknown-step` (or
/// `Unknown-Step`), since people copy codes from logs and type names by hand.
fn parse(text: &str) -> Option<Code> {
    let text = text.trim();
    Code::parse(text).or_else(|| Code::parse(&text.to_ascii_lowercase()))
}

fn severity(info: &CodeInfo) -> &'static str {
    match info.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

fn explain(info: CodeInfo) -> String {
    // The explanation is the doc comment of the code, whose lines keep the
    // space after `///`.
    let body: String = info
        .explanation
        .trim_end()
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix(' ').unwrap_or(line)))
        .collect();
    format!(
        "{} {} ({})\n\n{}.\n\n{body}",
        info.code,
        info.name,
        severity(&info),
        capitalize(info.summary),
    )
}

/// Every code with its name, severity and summary, one per line.
fn listing() -> String {
    let width = Code::ALL
        .iter()
        .map(|code| code.info().name.len())
        .max()
        .unwrap_or(0);
    Code::ALL
        .iter()
        .map(|code| {
            let info = code.info();
            format!(
                "{}  {:<width$}  {:<7}  {}\n",
                info.code,
                info.name,
                severity(&info),
                info.summary
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
        assert_eq!(parse("E101"), Some(Code::UnknownStep));
        assert_eq!(parse("e101"), Some(Code::UnknownStep));
        assert_eq!(parse("unknown-step"), Some(Code::UnknownStep));
        assert_eq!(parse("Unknown-Step"), Some(Code::UnknownStep));
        assert_eq!(parse("E999"), None);
    }

    #[test]
    fn explanations_are_dedented() {
        let text = explain(Code::UnknownStep.info());
        assert!(text.starts_with("E101 unknown-step (error)\n\nReference to a step"));
        assert!(text.contains("\nA path names a step id"), "{text}");
    }

    #[test]
    fn every_code_is_listed() {
        assert_eq!(listing().lines().count(), Code::ALL.len());
    }
}
