//! How `flow` writes for people: colours (on a terminal only, never under
//! `NO_COLOR`), durations, times, and commands a person can paste.

use std::io::IsTerminal as _;
use std::path::Path;

use anstyle::{AnsiColor, Style};
use flow_runtime::store::RunStatus;

/// Colours for standard output, or none: a pipe, a file, `NO_COLOR` set to
/// anything (https://no-color.org) or a dumb terminal get plain text, so
/// that what scripts and tests read never holds escape codes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paint {
    enabled: bool,
}

impl Paint {
    pub(crate) fn for_stdout() -> Paint {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        Paint {
            enabled: std::io::stdout().is_terminal() && !no_color && !dumb,
        }
    }

    fn paint(self, style: Style, text: &str) -> String {
        if self.enabled && !text.is_empty() {
            format!("{style}{text}{style:#}")
        } else {
            text.to_string()
        }
    }

    pub(crate) fn bold(self, text: &str) -> String {
        self.paint(Style::new().bold(), text)
    }

    pub(crate) fn dim(self, text: &str) -> String {
        self.paint(Style::new().dimmed(), text)
    }

    /// `text` in the colour of how things went: `Good` green, `Bad` red,
    /// `Waiting` yellow.
    pub(crate) fn tone(self, tone: Tone, text: &str) -> String {
        let colour = match tone {
            Tone::Good => AnsiColor::Green,
            Tone::Bad => AnsiColor::Red,
            Tone::Waiting => AnsiColor::Yellow,
            Tone::Plain => return text.to_string(),
        };
        self.paint(Style::new().fg_color(Some(colour.into())), text)
    }
}

/// How something went, for its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Good,
    Bad,
    Waiting,
    Plain,
}

impl Tone {
    pub(crate) fn of_run(status: RunStatus) -> Tone {
        match status {
            RunStatus::Completed => Tone::Good,
            RunStatus::Failed | RunStatus::Cancelled => Tone::Bad,
            RunStatus::PendingApproval | RunStatus::Running => Tone::Waiting,
        }
    }
}

/// A run's status as `flow` prints it: the store's spelling
/// (`RunStatus::as_str`, which `--json` and flowd's API use too), and
/// `(interrupted)` after a run left `running` that no process holds.
pub(crate) fn run_status(status: RunStatus, interrupted: bool) -> String {
    if interrupted {
        format!("{status} (interrupted)")
    } else {
        status.as_str().to_string()
    }
}

/// A duration for people, short and exact enough: `850ms`, `4.2s`,
/// `3m12s`, `2h05m`, `3d04h`. One token, so that a column of them reads
/// down and a test can find them.
pub(crate) fn duration(ms: u64) -> String {
    let seconds = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", seconds, ms % 1000 / 100),
        60_000..3_600_000 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d{:02}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

/// A stored time (milliseconds since the epoch) as RFC 3339 in UTC, the
/// form of every time flow writes.
pub(crate) fn time(ms: i64) -> String {
    flow_runtime::time::rfc3339_utc(u64::try_from(ms).unwrap_or(0))
}

/// `word` as one word of a POSIX shell command: as it is when it holds
/// nothing a shell reads specially, else single-quoted (a loop's path,
/// `scans[3]/gate`, is a glob to zsh). The MCP pool's, which prints the
/// commands it starts.
pub(crate) use flow_plan::shell_quote as shell_word;

/// A message people wrote (an approval's), as quoted lines: `> ` before
/// each, so that a message of several lines stays inside the tree or list
/// it is shown in, and quotes in it read as its own.
pub(crate) fn quoted(message: &str) -> Vec<String> {
    message
        .lines()
        .map(|line| format!("> {}", inert(line)))
        .collect()
}

/// Text from outside (an error a provider or a tool wrote, a message a
/// model's answer filled in) as printed: inert, its control characters
/// escaped.
pub(crate) use flow_plan::inert;

/// The default store of the local commands; a hint names `--db` only for
/// another one.
pub(crate) const DEFAULT_DB: &str = "flow.db";

/// ` --db PATH` when `db` is not the default store, for the commands a hint
/// shows: they must reach the same store as the command that printed them.
pub(crate) fn db_flag(db: Option<&Path>) -> String {
    match db {
        Some(db) if db != Path::new(DEFAULT_DB) => {
            format!(" --db {}", shell_word(&db.to_string_lossy()))
        }
        _ => String::new(),
    }
}

/// Where the commands `flow` prints act: the local store (`--db` when
/// not the default) or the flowd it was given (`--server`; its key is the
/// caller's own, `--api-key` or FLOW_API_KEY, and never printed).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via<'a> {
    Db(Option<&'a Path>),
    Server(&'a str),
}

impl Via<'_> {
    /// The flag that names it in a printed command, with its space.
    pub(crate) fn flag(self) -> String {
        match self {
            Via::Db(db) => db_flag(db),
            Via::Server(url) => format!(" --server {}", shell_word(url)),
        }
    }
}

/// The command that decides the approval at `path` of run `run`, as
/// `approver`. A run started with an offline seed other than the default
/// goes on with it only when `flow approve` is given it too (`seed`, 0
/// when unknown or the default).
pub(crate) fn approve_command(
    run: &str,
    path: &str,
    approvers: &[String],
    via: Via<'_>,
    seed: u64,
) -> String {
    // flowd takes a person, never a group, as the one who decides
    // (regression: the command it printed named the gate's first
    // approver, a group, and flowd refused it); locally a name is one.
    let approver = match via {
        Via::Server(_) => approvers
            .iter()
            .find(|a| a.contains('@'))
            .map_or("EMAIL", String::as_str),
        Via::Db(_) => approvers.first().map_or("APPROVER", String::as_str),
    };
    let seed = if seed == 0 {
        String::new()
    } else {
        format!("--seed {seed} ")
    };
    format!(
        "flow {seed}approve {} {} --as {}{}",
        shell_word(run),
        shell_word(path),
        shell_word(approver),
        via.flag()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_one_short_token() {
        let shown: Vec<String> = [0, 850, 4_250, 192_000, 7_500_000, 277_200_000]
            .into_iter()
            .map(duration)
            .collect();
        assert_eq!(shown, ["0ms", "850ms", "4.2s", "3m12s", "2h05m", "3d05h"]);
    }

    /// Regression: a provider's error holding a terminal's escape
    /// sequences cleared the screen, retitled the window and printed a
    /// green "run completed" when `flow run` and `flow show` printed it.
    #[test]
    fn text_from_outside_prints_inert() {
        assert_eq!(inert("plain, é"), "plain, é");
        assert_eq!(
            inert("\u{1b}[2J\u{1b}]0;pwned\u{7}\u{1b}[32mrun completed\r\nx\0"),
            "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{1b}[32mrun completed\\r\\nx\\u{0}"
        );
        assert_eq!(
            quoted("go?\n\u{1b}[2Jyes"),
            ["> go?", "> \\u{1b}[2Jyes"],
            "lines stay lines"
        );
    }

    #[test]
    fn words_a_shell_would_read_are_quoted() {
        assert_eq!(shell_word("run-1/a@x.io"), "run-1/a@x.io");
        assert_eq!(shell_word("scans[3]/g"), "'scans[3]/g'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(
            approve_command(
                "r",
                "g",
                &["a b".into()],
                Via::Db(Some(Path::new("x y.db"))),
                0
            ),
            "flow approve r g --as 'a b' --db 'x y.db'"
        );
        assert_eq!(
            approve_command(
                "r",
                "g",
                &["a".into()],
                Via::Db(Some(Path::new(DEFAULT_DB))),
                0
            ),
            "flow approve r g --as a"
        );
        assert_eq!(
            approve_command("r", "g", &["a".into()], Via::Db(None), 7),
            "flow --seed 7 approve r g --as a"
        );
        // flowd takes a person: the first address, past the groups.
        let approvers = ["leads".to_string(), "ana@acme.io".to_string()];
        let server = Via::Server("http://flow:8080");
        assert!(
            approve_command("r", "g", &approvers, server, 0).contains("--as ana@acme.io"),
            "{}",
            approve_command("r", "g", &approvers, server, 0)
        );
        assert!(approve_command("r", "g", &approvers[..1], server, 0).contains("--as EMAIL"));
    }
}
