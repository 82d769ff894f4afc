//! The three output formats of diagnostics: human (miette's graphical report),
//! JSON (one document for tools) and GitHub workflow commands (annotations).

use std::fmt;
use std::io::IsTerminal;
use std::sync::Arc;

use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteHandler,
    MietteHandlerOpts, MietteSpanContents, ReportHandler, SourceCode, SourceSpan, SpanContents,
};
use serde::Serialize;

use flow_compiler::Severity;
use flow_compiler::diagnostic::LineIndex;

use crate::report::{Report, Reports, clamp_span};

/// Width of the human output when it does not go to a terminal, so that logs
/// and snapshot tests wrap the same way everywhere.
pub(crate) const PLAIN_WIDTH: usize = 100;

/// Renders diagnostics for people, in colour on a terminal and as plain
/// Unicode text elsewhere.
pub(crate) enum Human {
    /// miette's own handler: it detects the terminal's width and colours.
    Terminal(Box<MietteHandler>),
    Plain(GraphicalReportHandler),
}

impl Human {
    /// The renderer for text written to stderr.
    pub(crate) fn for_stderr() -> Human {
        if std::io::stderr().is_terminal() {
            Human::Terminal(Box::new(
                MietteHandlerOpts::new().force_graphical(true).build(),
            ))
        } else {
            Human::plain(PLAIN_WIDTH)
        }
    }

    pub(crate) fn plain(width: usize) -> Human {
        Human::Plain(
            GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor()).with_width(width),
        )
    }

    /// One diagnostic as text, ending with a newline.
    pub(crate) fn render(&self, reports: &Reports, report: &Report) -> String {
        let view = View::new(reports, report);
        let mut out = match self {
            Human::Terminal(handler) => Shown(handler, &view).to_string(),
            Human::Plain(handler) => {
                let mut out = String::new();
                handler
                    .render_report(&mut out, &view)
                    .expect("writing to a String cannot fail");
                out
            }
        };
        // Labels in other files cannot be drawn in this file's snippet (nor
        // any beside the primary on a cut one); point at them the way
        // compilers do, so that editors can jump there, in the order of the
        // files and positions.
        let mut others: Vec<_> = report
            .secondary
            .iter()
            .filter(|label| view.cut || label.file != report.primary.file)
            .collect();
        others.sort_by_key(|label| (reports.path(label.file), label.span.start));
        for label in others {
            let at = reports.position(label.file, label.span.start);
            out.push_str(&format!(
                "  note: {}:{}:{}: {}\n",
                reports.path(label.file),
                at.line,
                at.column,
                flow_plan::inert(&label.message)
            ));
        }
        out
    }
}

/// Adapts a `MietteHandler`, which only renders through `Debug`, to `Display`.
struct Shown<'a>(&'a MietteHandler, &'a View);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.debug(self.1, f)
    }
}

/// A report as miette sees it: the primary file as source, the labels that
/// fall in it, and the hints joined into miette's single `help`.
#[derive(Debug)]
struct View {
    code: String,
    severity: miette::Severity,
    message: String,
    source: Excerpt,
    labels: Vec<LabeledSpan>,
    help: Option<String>,
    /// Whether the source is shown cut (a long line), with only the
    /// primary label drawn.
    cut: bool,
}

/// What of a file a report shows: the file, or the lines around the
/// primary label where one of them is longer than [`LONG_LINE`] bytes (a
/// generated file, a prompt on one line, a record of thousands of fields),
/// each cut to [`AROUND`] characters either side of the label, with `…`
/// where text is left out, so that one diagnostic is not megabytes of
/// terminal. Its line numbers are the file's either way.
#[derive(Debug)]
struct Excerpt {
    name: String,
    text: Arc<str>,
    /// Where the lines of `text` start.
    lines: Arc<LineIndex>,
    /// The file's line (from 0) that the excerpt's first line is.
    first_line: usize,
    /// Where the label's line is cut: the columns it leaves out.
    columns: Option<Columns>,
}

/// How the columns of an excerpt's label line differ from the file's.
#[derive(Debug)]
struct Columns {
    /// The excerpt's line (from 0).
    line: usize,
    /// Characters of the file's line left out before what is shown.
    left_out: usize,
    /// Characters put in their place (`…`).
    added: usize,
}

/// A line longer than this many bytes is shown cut.
const LONG_LINE: usize = 300;

/// Characters shown before and after a label on a cut line, and of a long
/// label itself.
const AROUND: usize = 80;

impl SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        // miette finds the lines of a span by scanning its source from the
        // start: it is handed only the lines around the span, whose first
        // line is found through the index (5,000 reports in a 1 MB file took
        // 12 s to print).
        let text: &str = &self.text;
        let boundary = |mut at: usize| {
            at = at.min(text.len());
            while !text.is_char_boundary(at) {
                at += 1;
            }
            at
        };
        let start = boundary(span.offset());
        let end = boundary(span.offset() + span.len()).max(start);
        let mut from = text[..start].rfind('\n').map_or(0, |at| at + 1);
        for _ in 0..before {
            if from == 0 {
                break;
            }
            from = text[..from - 1].rfind('\n').map_or(0, |at| at + 1);
        }
        let mut to = end;
        for _ in 0..after + 2 {
            match text[to..].find('\n') {
                Some(at) => to += at + 1,
                None => {
                    to = text.len();
                    break;
                }
            }
        }
        let window = &text[from..to];
        let contents = window.read_span(&(start - from, end - start).into(), before, after)?;
        let (first, _) = self.lines.line_col(text, from as u32);
        let line = contents.line() + first - 1;
        // miette titles a snippet with where it starts, in bytes of its
        // line; the headline and every other format count characters, and
        // so does the title: on a cut line, the file's column.
        let at = contents.span().offset() + from;
        let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
        let chars = text[line_start..at].chars().count();
        let column = match &self.columns {
            Some(cut) if line == cut.line && chars >= cut.added => chars - cut.added + cut.left_out,
            _ => chars,
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            contents.data(),
            (contents.span().offset() + from, contents.span().len()).into(),
            line + self.first_line,
            column,
            // Counted from the start of the source, as miette counts it
            // (it joins two snippets that this reaches).
            contents.line_count() + first - 1 + self.first_line,
        )))
    }
}

/// Whether a line a snippet of `labels` would show is longer than
/// [`LONG_LINE`]: each label's lines, and the line before and after them.
fn shows_a_long_line(text: &str, labels: &[(usize, usize)]) -> bool {
    labels.iter().any(|&(start, end)| {
        let before = text[..start].rfind('\n').unwrap_or(0);
        let before = text[..before].rfind('\n').map_or(0, |at| at + 1);
        let mut after = end;
        for _ in 0..2 {
            after = text[after..]
                .find('\n')
                .map_or(text.len(), |at| after + at + 1);
        }
        text[before..after]
            .split('\n')
            .any(|line| line.len() > LONG_LINE)
    })
}

/// The excerpt of `text` around the primary label `(start, end)`: its
/// first line cut to [`AROUND`] characters either side of the label (the
/// label itself to `2 * AROUND`), the lines before and after it to their
/// first `2 * AROUND`; with where the label is in it.
fn excerpt(path: &str, text: &str, start: usize, end: usize) -> (Excerpt, (usize, usize)) {
    // A line's end, less the `\r` of a CRLF file.
    let content_end = |end: usize| {
        if text[..end].ends_with('\r') {
            end - 1
        } else {
            end
        }
    };
    let line_start = text[..start].rfind('\n').map_or(0, |at| at + 1);
    let line_end = content_end(text[start..].find('\n').map_or(text.len(), |at| start + at));
    let start = start.min(line_end);
    let before = (line_start > 0).then(|| {
        let from = text[..line_start - 1].rfind('\n').map_or(0, |at| at + 1);
        &text[from..content_end(line_start - 1)]
    });
    let after = text[line_end..].find('\n').map(|newline| {
        let from = line_end + newline + 1;
        let to = text[from..].find('\n').map_or(text.len(), |at| from + at);
        &text[from..content_end(to)]
    });
    // `count` characters back from `at` (not before `floor`), or forward.
    let back = |at: usize, count: usize, floor: usize| {
        text[floor..at]
            .char_indices()
            .rev()
            .nth(count.saturating_sub(1))
            .map_or(floor, |(i, _)| floor + i)
    };
    let forward = |at: usize, count: usize, ceiling: usize| {
        text[at..ceiling]
            .char_indices()
            .nth(count)
            .map_or(ceiling, |(i, _)| at + i)
    };
    let head = |line: &str| match line.char_indices().nth(2 * AROUND) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    };
    let end = forward(start, 2 * AROUND, end.clamp(start, line_end));
    let from = back(start, AROUND, line_start);
    let to = forward(end, AROUND, line_end);
    let mut shown = String::new();
    if let Some(before) = before {
        shown.push_str(&head(before));
        shown.push('\n');
    }
    let added = if from > line_start { "…" } else { "" };
    shown.push_str(added);
    let label = shown.len() + (start - from);
    shown.push_str(&text[from..to]);
    if to < line_end {
        shown.push('…');
    }
    if let Some(after) = after {
        shown.push('\n');
        shown.push_str(&head(after));
    }
    let line = text[..line_start].matches('\n').count();
    let excerpt = Excerpt {
        name: path.to_string(),
        lines: Arc::new(LineIndex::new(&shown)),
        text: shown.into(),
        first_line: line - usize::from(before.is_some()),
        columns: Some(Columns {
            line: usize::from(before.is_some()),
            left_out: text[line_start..from].chars().count(),
            added: added.chars().count(),
        }),
    };
    (excerpt, (label, label + (end - start)))
}

impl View {
    fn new(reports: &Reports, report: &Report) -> View {
        let source = &reports.sources[report.primary.file];
        let text = &source.text;
        let labeled = |message: &str, span, primary: bool| {
            let (start, mut end) = clamp_span(text, span);
            // A secondary label that spans lines (the `if` a step is in, a
            // declaration) is shown on its first line: drawn whole, it would
            // pull every line between it and the primary into the snippet,
            // where miette otherwise shows distant labels apart.
            if !primary && let Some(newline) = text[start..end].find('\n') {
                end = start + text[start..start + newline].trim_end().len();
            }
            let message = (!message.is_empty()).then(|| flow_plan::inert(message).into_owned());
            if primary {
                LabeledSpan::new_primary_with_span(message, (start, end - start))
            } else {
                LabeledSpan::new_with_span(message, (start, end - start))
            }
        };
        let mut labels = vec![labeled(&report.primary.message, report.primary.span, true)];
        labels.extend(
            report
                .secondary
                .iter()
                .filter(|label| label.file == report.primary.file)
                .map(|label| labeled(&label.message, label.span, false)),
        );
        labels.sort_by_key(|label| (label.offset(), label.len()));
        let spans: Vec<(usize, usize)> = labels
            .iter()
            .map(|label| (label.offset(), label.offset() + label.len()))
            .collect();
        let cut = shows_a_long_line(text, &spans);
        let shown = if cut {
            // Only the primary label is drawn on an excerpt: the others
            // point into text it leaves out, and are notes (`render`).
            let (start, end) = clamp_span(text, report.primary.span);
            let (excerpt, (start, end)) = excerpt(&source.path, text, start, end);
            let message = (!report.primary.message.is_empty())
                .then(|| flow_plan::inert(&report.primary.message).into_owned());
            labels = vec![LabeledSpan::new_primary_with_span(
                message,
                (start, end - start),
            )];
            excerpt
        } else {
            Excerpt {
                name: source.path.clone(),
                text: Arc::clone(text),
                lines: Arc::clone(&source.lines),
                first_line: 0,
                columns: None,
            }
        };
        let info = report.code.info();
        let at = reports.position(report.primary.file, report.primary.span.start);
        View {
            // `error[E101]` as compilers write it, so that a search for
            // "error" finds it, with where the primary label is: the first
            // snippet may start at a secondary label above it.
            code: format!(
                "{}[{}]: {}:{}:{}",
                match report.severity {
                    Severity::Error => "error",
                    Severity::Warning => "warning",
                },
                info.code,
                source.path,
                at.line,
                at.column
            ),
            severity: match report.severity {
                Severity::Error => miette::Severity::Error,
                Severity::Warning => miette::Severity::Warning,
            },
            // The words of a report may quote the source (`found ...`).
            message: flow_plan::inert(&report.message).into_owned(),
            source: shown,
            labels,
            help: (!report.hints.is_empty()).then(|| {
                report
                    .hints
                    .iter()
                    .map(|hint| flow_plan::inert(hint))
                    .collect::<Vec<_>>()
                    .join("\n")
            }),
            cut,
        }
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for View {}

impl miette::Diagnostic for View {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(&self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|help| Box::new(help) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().cloned()))
    }
}

/// The closing line of `check`: `N errors, M warnings in K files`.
pub(crate) fn summary(reports: &Reports) -> String {
    fn plural(n: usize, word: &str) -> String {
        if n == 1 {
            format!("{n} {word}")
        } else {
            format!("{n} {word}s")
        }
    }
    format!(
        "{}, {} in {}",
        plural(reports.errors(), "error"),
        plural(reports.warnings(), "warning"),
        plural(reports.sources.len(), "file")
    )
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    files: usize,
    errors: usize,
    warnings: usize,
    diagnostics: Vec<JsonDiagnostic<'a>>,
    unreadable: Vec<JsonUnreadable<'a>>,
}

#[derive(Serialize)]
pub(crate) struct JsonUnreadable<'a> {
    path: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
pub(crate) struct JsonDiagnostic<'a> {
    code: &'static str,
    name: &'static str,
    severity: Severity,
    message: &'a str,
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    label: &'a str,
    secondary: Vec<JsonLabel<'a>>,
    hints: &'a [String],
}

#[derive(Serialize)]
struct JsonLabel<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    message: &'a str,
}

/// Every diagnostic as one JSON document, with 1-based lines and columns
/// (columns count characters).
pub(crate) fn json(reports: &Reports) -> String {
    let output = JsonOutput {
        files: reports.sources.len(),
        errors: reports.errors(),
        warnings: reports.warnings(),
        diagnostics: json_diagnostics(reports),
        unreadable: json_unreadable(reports),
    };
    serde_json::to_string_pretty(&output).expect("diagnostics always serialize")
}

/// The paths that could not be read, with why, for [`json`] and other
/// JSON documents (`flowc test --format json`'s).
pub(crate) fn json_unreadable(reports: &Reports) -> Vec<JsonUnreadable<'_>> {
    reports
        .unreadable
        .iter()
        .map(|(path, message)| JsonUnreadable { path, message })
        .collect()
}

/// The diagnostics of [`json`], for other JSON documents to hold
/// (`flowc test --format json`'s).
pub(crate) fn json_diagnostics(reports: &Reports) -> Vec<JsonDiagnostic<'_>> {
    reports
        .reports
        .iter()
        .map(|report| {
            let file = report.primary.file;
            let (start, end) = reports.range(file, report.primary.span);
            let info = report.code.info();
            JsonDiagnostic {
                code: info.code,
                name: info.name,
                severity: report.severity,
                message: &report.message,
                file: reports.path(file),
                line: start.line,
                column: start.column,
                end_line: end.line,
                end_column: end.column,
                label: &report.primary.message,
                secondary: report
                    .secondary
                    .iter()
                    .map(|label| {
                        let at = reports.position(label.file, label.span.start);
                        JsonLabel {
                            file: reports.path(label.file),
                            line: at.line,
                            column: at.column,
                            message: &label.message,
                        }
                    })
                    .collect(),
                hints: &report.hints,
            }
        })
        .collect()
}

/// One GitHub Actions workflow command per diagnostic, which the Actions UI
/// shows as an annotation on the line. The hints follow the message on their
/// own lines, because "did you mean" is the most useful part in a review.
pub(crate) fn github(reports: &Reports) -> String {
    let mut out = String::new();
    for report in &reports.reports {
        let file = report.primary.file;
        let (start, end) = reports.range(file, report.primary.span);
        let info = report.code.info();
        let command = match report.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut message = report.message.clone();
        for hint in &report.hints {
            message.push_str("\nhelp: ");
            message.push_str(hint);
        }
        out.push_str(&format!(
            "::{command} file={},line={},col={},endLine={},endColumn={},title={}::{}\n",
            escape_property(reports.path(file)),
            start.line,
            start.column,
            end.line,
            end.column,
            escape_property(&format!("{} {}", info.code, info.name)),
            escape_data(&message),
        ));
    }
    out
}

/// GitHub's escaping of a workflow command's message.
pub(crate) fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// GitHub's escaping of a workflow command's property value, which also
/// reserves `:` and `,`.
pub(crate) fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The excerpt of `text` around the label `needle` (its first match),
    /// and the label's text in it.
    fn cut(text: &str, needle: &str) -> (Excerpt, String) {
        let start = text.find(needle).expect("the label is in the text");
        let (excerpt, (from, to)) = excerpt("x.flow", text, start, start + needle.len());
        let label = excerpt.text[from..to].to_string();
        (excerpt, label)
    }

    /// Whatever the text around it (characters of several bytes, CRLF
    /// lines, no line before or after, an empty one, a label running over
    /// lines or to the end), an excerpt cuts at characters, keeps the
    /// label's first line and the file's line numbers, and shows no line
    /// longer than its bound.
    #[test]
    fn an_excerpt_cuts_long_lines_around_the_label() {
        let wide = "é".repeat(1_000);
        let cases = [
            (format!("{wide}LABEL{wide}"), "LABEL".to_string()),
            (
                format!("a\r\n{wide}LABEL{wide}\r\nb\r\n"),
                "LABEL".to_string(),
            ),
            (format!("\n\n{wide}\nLABEL\n"), "LABEL".to_string()),
            (format!("x\n{wide}LABEL"), "LABEL".to_string()),
            (format!("{wide}LA\nBEL\n"), "LA\nBEL".to_string()),
            (
                format!("{wide}LABEL{}", "z".repeat(500)),
                format!("LABEL{}", "z".repeat(500)),
            ),
        ];
        for (text, needle) in &cases {
            let start = text.find(needle.as_str()).unwrap();
            assert!(
                shows_a_long_line(text, &[(start, start + needle.len())]),
                "{needle}"
            );
            let (excerpt, label) = cut(text, needle);
            let label_line = text[..start].matches('\n').count();
            let shown_before = usize::from(label_line > 0);
            assert_eq!(excerpt.first_line, label_line - shown_before, "{needle}");
            let first = needle.split('\n').next().unwrap();
            assert!(first.starts_with(label.as_str()), "{label:?}");
            assert!(!label.contains('\n'), "{label:?}");
            for line in excerpt.text.lines() {
                assert!(line.chars().count() <= 4 * AROUND + 2, "{line:?}");
                assert!(!line.ends_with('\r'), "{line:?}");
            }
        }
    }

    /// The snippet's title gives the file's column, not the excerpt's, in
    /// characters as the headline does (regression: a line with `日本語`
    /// before the label was titled 3:65 under a headline of 3:58).
    #[test]
    fn an_excerpt_titles_its_snippet_with_the_files_column() {
        for (before, column) in [("x".repeat(1_000), 1_000), ("é".repeat(1_000), 1_000)] {
            let text = format!("{before}LABEL");
            let (excerpt, label) = cut(&text, "LABEL");
            assert_eq!(label, "LABEL");
            let at = excerpt.text.find("LABEL").unwrap();
            let contents = excerpt.read_span(&(at, 5).into(), 0, 0).unwrap();
            assert_eq!((contents.line(), contents.column()), (0, column));
        }
        let text = "a\n  x: \"日本語ü\" LABEL\n";
        let whole = Excerpt {
            name: "x.flow".to_string(),
            text: text.into(),
            lines: Arc::new(LineIndex::new(text)),
            first_line: 0,
            columns: None,
        };
        let at = text.find("LABEL").unwrap();
        let contents = whole.read_span(&(at, 5).into(), 0, 0).unwrap();
        assert_eq!((contents.line(), contents.column()), (1, 12));
    }

    #[test]
    fn github_escaping() {
        assert_eq!(escape_data("50% done\r\nnext"), "50%25 done%0D%0Anext");
        assert_eq!(escape_property("a:b,c%"), "a%3Ab%2Cc%25");
    }
}
