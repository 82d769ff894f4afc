//! From source text to the syntax tree, with error recovery.
//!
//! pest parses the whole file in one go: the grammar's catch-all productions
//! (`bad_item`, `bad_stmt`, `bad_member`) absorb what does not parse, so the
//! parse itself succeeds on any input. Each absorbed region is then parsed
//! again with the production that was meant there, with pest's error detail on,
//! to say what was expected at the exact position things went wrong.

use pest::Parser as _;
use pest::iterators::Pair;

use crate::codes::Code;
use crate::diagnostic::{Diagnostic, Edit, FileId, Span};
use crate::syntax::ast::*;
// The lexical scan that completion also reads the cursor's surroundings with.
use crate::suggest::did_you_mean;
use crate::syntax::cursor;
use crate::syntax::fast::parse_fast;
use crate::syntax::optional_marks;
use crate::syntax::template::parse_string;

mod test_block;

#[derive(pest_derive::Parser)]
#[grammar = "syntax/flow.pest"]
struct FlowParser;

/// How deep blocks, types and expressions may nest. Deeper input is refused
/// with E003 so that every later pass can recurse without a stack overflow.
pub(crate) const MAX_DEPTH: usize = 128;

/// The message of a `{` left open.
const UNCLOSED_BRACE: &str = "this `{` is not closed";
/// Why a block's `{` is taken to be the one left open.
const BLOCK_ENDS_BACK: &str = "the lines under it end where a line comes back to its indentation: `}` is probably missing before that line";

/// The message and hint of a workflow setting after a statement.
const SETTING_AFTER_STATEMENT: &str = "workflow settings must come before the first statement";
const SETTINGS_FIRST: &str = "move `input`, `timeout`, `context`, `department`, `durability`, `on_error` and `deliver` to the top of the workflow";

/// The label of where checking resumes after a syntax error.
const RESUMES: &str = "checking resumes here";
/// The label of text skipped up to the end of the file.
const SKIPPED_TO_END: &str = "skipped from here to the end of the file";

/// Words that start statements, items or step calls, or are literals.
pub(crate) const KEYWORDS: &[&str] = &[
    "import", "type", "recipe", "mcp", "workflow", "step", "if", "else", "for", "as", "parallel",
    "branch", "approval", "kb_write", "handoff", "true", "false", "null",
];

/// Parses one file. Never fails: what cannot be read is reported and left out.
pub fn parse(source: &str, file: FileId) -> (SourceFile, Vec<Diagnostic>) {
    if let Some(refused) = refuse_too_deep(source, file) {
        return refused;
    }
    match parse_fast(source, file) {
        Some(tree) => (tree, Vec::new()),
        None => pest_parse(source, file),
    }
}

/// The pest parser with recovery: the grammar of record, and the path for
/// every file that has a problem (see `fast.rs` for the fast path).
#[cfg(test)]
pub(crate) fn parse_with_pest(source: &str, file: FileId) -> (SourceFile, Vec<Diagnostic>) {
    refuse_too_deep(source, file).unwrap_or_else(|| pest_parse(source, file))
}

/// Input nested deeper than both parsers recurse safely is refused whole.
fn refuse_too_deep(source: &str, file: FileId) -> Option<(SourceFile, Vec<Diagnostic>)> {
    let at = too_deep_at(source)?;
    let diagnostic = Diagnostic::new(
        Code::TooDeep,
        file,
        Span::new(at, at + 1),
        format!("nesting deeper than {MAX_DEPTH} levels"),
    )
    .label("too deep from here")
    .hint("the file is not parsed further; flatten the nesting");
    Some((SourceFile::default(), vec![diagnostic]))
}

/// The pest path.
///
/// A slip that a rewrite of the same length mends (the `:` of `retry: 3`
/// blanked, the third `/` of a `///` that documents nothing, `45 secs` as
/// `45s`) is reported, rewritten in a copy, and the copy parsed again, so
/// that the statement it broke is read as meant and checked: the tree and
/// every other diagnostic come from the last parse. Offsets do not move.
fn pest_parse(source: &str, file: FileId) -> (SourceFile, Vec<Diagnostic>) {
    let mut text = std::borrow::Cow::Borrowed(source);
    let mut mended = Vec::new();
    let mut parsed = parse_once(&text, file);
    // With more than one block left open at the end, mending one brace a
    // round cannot rebuild the structure (each round parses the file
    // again): the braces the layout shows open are reported as they are.
    let open_at_end = cursor::scan(source, source.len())
        .open
        .iter()
        .filter(|(_, b)| *b == b'{')
        .count();
    for round in 0.. {
        let (tree, problems, rewrites) = parsed;
        if round == MAX_REWRITE_ROUNDS {
            // The slips this round found are mistakes too, though no copy
            // reads them as meant.
            mended.extend(rewrites.into_iter().map(|(_, _, diagnostic)| diagnostic));
            mended.extend(problems);
            return (tree, mended);
        }
        if rewrites.is_empty() {
            // A brace the layout shows was left open: its copy is parsed
            // already, to see that it leaves fewer problems.
            let repaired = (open_at_end < 2)
                .then(|| {
                    closing_brace(&text, file, &problems)
                        .or_else(|| extra_brace(&text, file, &problems))
                })
                .flatten();
            let Some((closed, diagnostic, next)) = repaired else {
                mended.extend(problems);
                return (tree, mended);
            };
            mended.push(diagnostic);
            text = std::borrow::Cow::Owned(closed);
            parsed = next;
            continue;
        }
        let mut bytes = text.as_bytes().to_vec();
        for (at, text, diagnostic) in rewrites {
            // A rewrite is ASCII or text of the source moved whole, so the
            // copy stays UTF-8.
            bytes[at..at + text.len()].copy_from_slice(text.as_bytes());
            mended.push(diagnostic);
        }
        text = std::borrow::Cow::Owned(String::from_utf8(bytes).unwrap_or_default());
        parsed = parse_copy(&text, file);
    }
    unreachable!("the last round returns")
}

/// A rewrite of `text`, at an offset, with the diagnostic of the slip it
/// mends.
type Rewrite = (usize, String, Diagnostic);

/// One parse: the tree, the problems, and the rewrites found.
type Parsed = (SourceFile, Vec<Diagnostic>, Vec<Rewrite>);

/// A copy of the text with one mistake mended, its diagnostic, and the
/// copy's parse.
type Repair = (String, Diagnostic, Parsed);

/// `parse_once` of a mended copy, which is often well-formed: the fast
/// parser is tried first.
fn parse_copy(text: &str, file: FileId) -> Parsed {
    match parse_fast(text, file) {
        Some(tree) => (tree, Vec::new(), Vec::new()),
        None => parse_once(text, file),
    }
}

fn parse_once(text: &str, file: FileId) -> Parsed {
    let mut parser = Parser {
        source: text,
        file,
        problems: Vec::new(),
        too_deep_reported: false,
        rewrites: Vec::new(),
        hoisted: Vec::new(),
        cut_off: Vec::new(),
        reread_after: None,
    };
    let mut tree = parser.file();
    parser.left_open(&mut tree);
    parser.unclosed_at_end();
    let (mut rewrites, mut problems) = (parser.rewrites, parser.problems);
    if let Some(reread_after) = parser.reread_after {
        // What comes after waits for the copy; said as problems, which a
        // round with rewrites leaves for the next parse, and the last
        // round reports.
        let (kept, deferred): (Vec<Rewrite>, Vec<Rewrite>) = rewrites
            .into_iter()
            .partition(|(at, _, _)| *at <= reread_after);
        rewrites = kept;
        problems.extend(deferred.into_iter().map(|(_, _, diagnostic)| diagnostic));
    }
    (tree, problems, rewrites)
}

/// The header of a block (`if ...`, `} else if ...`, `for ... as x`,
/// `parallel`) that ends its line without its `{`, the lines under it
/// indented further and the block closed by a `}` back at the header's
/// indentation: a `{` written over the first blank of the block's first
/// line, so that the block is read as meant and every line keeps its
/// place. Reported as the statement left unfinished, the `}` that closed
/// the block then closed the one around it, and the rest of the file was
/// skipped (an audit: a missing `{` after `else if`). Without that `}`
/// (a block written by indentation alone, as in Python) there is nothing
/// the `{` would pair with, and the plain error stands.
fn missing_block_brace_rewrite(
    source: &str,
    file: FileId,
    unfinished: usize,
    expected: &[String],
) -> Option<Rewrite> {
    /// The words a statement of a block starts with.
    const STATEMENTS: &[&str] = &["step", "if", "for", "parallel", "output"];
    if !expected.iter().any(|word| word == "`{`") {
        return None;
    }
    let line_start = source[..unfinished].rfind('\n').map_or(0, |i| i + 1);
    let header_indent = indent(&source[line_start..]);
    let header = source[line_start..unfinished]
        .trim_start_matches([' ', '\t', '}'])
        .trim_start();
    let opens_block = ["if ", "else", "for ", "parallel"]
        .iter()
        .any(|word| header.starts_with(word));
    let line_break = unfinished + source[unfinished..].find('\n')?;
    if !opens_block || !source[unfinished..line_break].trim().is_empty() {
        return None;
    }
    // The lines after the header, each with its offset.
    let lines = source[line_break + 1..]
        .split_inclusive('\n')
        .scan(line_break + 1, |at, line| {
            let start = *at;
            *at += line.len();
            Some((start, line))
        })
        .filter(|(_, line)| !line.trim().is_empty());
    // The block's first statement: its first blank is where the `{` goes.
    // A doc comment before it would then document nothing: no `{` then.
    let mut code_lines = lines.filter(|(_, line)| !line.trim_start().starts_with("//"));
    let (brace_at, first) = code_lines.next()?;
    if source[line_break..brace_at]
        .lines()
        .any(|line| line.trim_start().starts_with("///"))
    {
        return None;
    }
    // A statement, not the rest of the header (`&& ...`, `concurrency 5
    // {` on a line of their own).
    let first_word = first.trim_start();
    let first_word = &first_word[..super::cursor::name_len(first_word)];
    if indent(first) <= header_indent || !STATEMENTS.contains(&first_word) {
        return None;
    }
    let closed = code_lines
        .find(|(_, line)| indent(line) <= header_indent)
        .is_some_and(|(_, line)| line.trim_start().starts_with('}'));
    if !closed {
        return None;
    }
    let last = source[..unfinished]
        .chars()
        .next_back()
        .map_or(0, char::len_utf8);
    let diagnostic = Diagnostic::new(
        Code::Syntax,
        file,
        Span::new(unfinished - last, unfinished),
        "the block's `{` is missing at the end of this line",
    )
    .label("`{` expected after this")
    .hint("the lines under it are read as its block")
    .fix_with(
        "Open the block with `{`",
        vec![Edit::insert(unfinished as u32, " {")],
    );
    // The block's first line is indented further than the header: its
    // first byte is a blank.
    Some((brace_at, "{".to_string(), diagnostic))
}

/// A `{` that the layout shows was never closed, though a later `}` closed
/// it in the parse (the `}` of the block around it), so that the errors
/// were found further on, at what that `}` left outside its block. When
/// closing it at the end of its line (the line break replaced) leaves fewer
/// problems than `problems`, that is the mistake: its diagnostic, and the
/// text closed, with its parse.
///
/// Nothing is tried when no problem comes after its item starts, or when
/// its line leaves a string open (that is the mistake, and a parse is not spent on
/// each keystroke of a half-typed `"{{step.`).
fn closing_brace(text: &str, file: FileId, problems: &[Diagnostic]) -> Option<Repair> {
    let (brace, why) = suspect_unclosed_brace(text)?;
    if !caused_from(text, problems, brace) {
        return None;
    }
    // When the parse itself blamed this brace, its item was skipped whole
    // with that one problem, which a copy with the item's other mistakes
    // in it cannot beat on count: the copy is taken for those mistakes.
    let blamed = problems
        .iter()
        .any(|p| p.message == UNCLOSED_BRACE && p.primary.span.start as usize == brace);
    let to_beat = (!blamed).then_some(problems);
    let line_end = brace + first_line_len(&text[brace..]);
    let closed_at = if text[..line_end].ends_with('\r') {
        line_end - 1
    } else {
        line_end
    };
    let line = cursor::scan(&text[brace..], line_end + 1 - brace);
    if closed_at >= text.len() || line.cut_string.is_some() || line.lexical != cursor::Lexical::Code
    {
        return None;
    }
    // A block's `{` (the last of its line) holds the lines indented under
    // it: it is closed before the first line back at its indentation.
    let line_start = text[..brace].rfind('\n').map_or(0, |i| i + 1);
    let opener_indent = indent(&text[line_start..]);
    let block_end = text[line_end..]
        .split_inclusive('\n')
        .scan(line_end, |at, line| {
            let start = *at;
            *at += line.len();
            Some((start, line))
        })
        .skip(1)
        .find(|(_, line)| {
            let code = line.trim();
            !code.is_empty() && !code.starts_with("//") && indent(line) <= opener_indent
        })
        .filter(|(_, line)| !line.trim_start().starts_with('}'))
        .map(|(start, _)| start);
    // A comment at the end of a line is not code: a `}` written after it
    // would be part of it (and in the copy, so would the next line).
    let code_end = |start: usize, end: usize| {
        trailing_comment(&text[start..end]).map_or(end, |comment| start + comment)
    };
    let block = text[brace + 1..code_end(brace, closed_at)]
        .trim()
        .is_empty();
    // Where a `}` goes at the end of the line ending at `end` (its line
    // break, or before its comment): the range it is written over in the
    // copy, keeping every offset.
    let closing_range = |end: usize| {
        let start = text[..end].rfind('\n').map_or(0, |i| i + 1);
        let end = if text[..end].ends_with('\r') {
            end - 1
        } else {
            end
        };
        let range = match trailing_comment(&text[start..end]) {
            Some(comment) => start + comment..end,
            None => end..end + 1,
        };
        let closing = format!("}}{}", " ".repeat(range.len() - 1));
        (range, closing)
    };
    let unclosed = |hint: &str, title: &str, edit: Edit| {
        Diagnostic::new(
            Code::Syntax,
            file,
            Span::new(brace, brace + 1),
            UNCLOSED_BRACE,
        )
        .label("not closed")
        .hint(hint)
        .fix_with(title, vec![edit])
    };
    if block && let Some(next_line) = block_end {
        let (copy, parsed) = {
            let (range, closing) = closing_range(next_line - 1);
            mended_copy(text, range, &closing, file, to_beat)?
        };
        let closing = format!("{}}}\n", &text[line_start..line_start + opener_indent]);
        let diagnostic = unclosed(
            BLOCK_ENDS_BACK,
            "Close the block before the line back at its indentation",
            Edit::insert(next_line as u32, closing),
        )
        .secondary(
            file,
            Span::new(next_line, next_line + first_line_len(&text[next_line..])),
            "the block ends before this line",
        );
        return Some((copy, diagnostic, parsed));
    }
    let (copy, parsed) = {
        let (range, closing) = closing_range(line_end);
        mended_copy(text, range, &closing, file, to_beat)?
    };
    let code = code_end(line_start, closed_at);
    let insert_at = line_start + text[line_start..code].trim_end().len();
    let diagnostic = unclosed(
        why,
        "Close the `{` at the end of its line",
        Edit::insert(insert_at as u32, " }"),
    );
    Some((copy, diagnostic, parsed))
}

/// Whether a problem comes after the item that `at` is in starts: one a
/// brace there could have caused, so that a copy is parsed only then (a
/// brace left open may end its item early, at a later line that starts
/// an item, as `workflow w` in a test, so its problems come before it).
fn caused_from(text: &str, problems: &[Diagnostic], at: usize) -> bool {
    let item_start = text[..at]
        .rmatch_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            text[i..]
                .bytes()
                .next()
                .is_some_and(|b| !b.is_ascii_whitespace() && b != b'}' && b != b'/')
        })
        .unwrap_or(0);
    problems
        .iter()
        .any(|p| p.primary.span.start as usize >= item_start)
}

/// Where a `//` comment starts in `line`, outside strings.
fn trailing_comment(line: &str) -> Option<usize> {
    line.match_indices("//")
        .map(|(at, _)| at)
        .find(|&at| cursor::scan(line, at).lexical == cursor::Lexical::Code)
}

/// `text` with `range` written over by `by` (of the same length, so that
/// every offset stays), and its parse, when that parse leaves fewer
/// problems than `to_beat` (whatever it leaves, without problems to beat).
fn mended_copy(
    text: &str,
    range: std::ops::Range<usize>,
    by: &str,
    file: FileId,
    to_beat: Option<&[Diagnostic]>,
) -> Option<(String, Parsed)> {
    debug_assert_eq!(range.len(), by.len());
    let mut copy = text.to_string();
    copy.replace_range(range, by);
    let parsed = parse_copy(&copy, file);
    let better = to_beat.is_none_or(|problems| parsed.1.len() + parsed.2.len() < problems.len());
    better.then_some((copy, parsed))
}

/// A `}` that the layout shows is one too many (see `suspect_extra_brace`):
/// when removing it leaves fewer problems than `problems`, that is the
/// mistake: its diagnostic, and the text without it, with its parse.
fn extra_brace(text: &str, file: FileId, problems: &[Diagnostic]) -> Option<Repair> {
    let (extra, shown_by) = suspect_extra_brace(text)?;
    if !caused_from(text, problems, extra) {
        return None;
    }
    let (copy, parsed) = mended_copy(text, extra..extra + 1, " ", file, Some(problems))?;
    let line = |at: usize| text[..at].matches('\n').count() + 1;
    let diagnostic = Diagnostic::new(
        Code::Syntax,
        file,
        Span::new(extra, extra + 1),
        "this `}` is one too many",
    )
    .label("closes a block early")
    .secondary(
        file,
        Span::new(shown_by, shown_by + 1),
        "indented as the end of the block that the extra `}` closed",
    )
    .hint(format!(
        "remove it: the block ends at the `}}` of line {}",
        line(shown_by)
    ))
    .fix("");
    Some((copy, diagnostic, parsed))
}

/// What to do about a `"` string opened at `quote` that its line ends. A
/// `\\` at the end of the line is how other languages carry a string on,
/// which this one does not: that is named.
fn string_cut_hint(source: &str, quote: usize) -> &'static str {
    let line = &source[quote..quote + first_line_len(&source[quote..])];
    if line.trim_end_matches('\r').ends_with('\\') {
        "a `\\` at the end of a line does not carry a string on to the next: \
         text of several lines goes between `\"\"\"` and `\"\"\"`"
    } else {
        "add the closing `\"`; text of several lines goes between `\"\"\"` and `\"\"\"`"
    }
}

/// How to close a `"` string opened at `quote` that its line does not
/// close: at the line's end, before the closing brackets and commas that
/// the string swallowed (`{ note: "text }`) but not before a `}` that
/// closes a `{{` reference of the string, then with the `}` of each record
/// its line still leaves open. `None` for a reference still being typed
/// (`"{{step.a.`), which no quote mends, and for text that goes on to a
/// quote on the next line.
fn string_closing(source: &str, quote: usize) -> Option<Edit> {
    let line_start = source[..quote].rfind('\n').map_or(0, |i| i + 1);
    let line = &source[quote..quote + first_line_len(&source[quote..])];
    // Text meant to go on over lines, closed on the next: a quote at this
    // line's end would leave that one open.
    let next = source[(quote + line.len() + 1).min(source.len())..]
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//"))
        .unwrap_or("");
    if next.matches('"').count() % 2 == 1 {
        return None;
    }
    let mut end = line.trim_end().len();
    // The `{` that ends a block's header (`if x == "a {`) opens the block,
    // which goes on after the line: the string closes before it.
    let before = source[line_start..quote].trim_start();
    let header = ["if ", "else ", "for "]
        .iter()
        .any(|word| before.starts_with(word));
    let block_brace = header && line.trim_end().ends_with('{');
    if block_brace {
        end -= 1;
    }
    while end > 1 {
        let swallowed = match line.as_bytes()[end - 1] {
            b' ' | b'\t' | b']' | b')' | b',' => true,
            // An ASCII byte, so `end - 1` is a character boundary.
            b'}' => {
                let before = &line[1..end - 1];
                before.matches("{{").count() == before.matches("}}").count()
            }
            _ => false,
        };
        if !swallowed {
            break;
        }
        end -= 1;
    }
    let text = &line[1..end];
    // A quote after a `\` would be escaped by it, closing nothing.
    if text.matches("{{").count() != text.matches("}}").count() || text.ends_with('\\') {
        return None;
    }
    let depth = |code: &str| {
        code.bytes().fold(0i64, |depth, b| match b {
            b'{' => depth + 1,
            b'}' => depth - 1,
            _ => depth,
        })
    };
    let open = depth(&source[line_start..quote]) + depth(&line[end..]) - i64::from(block_brace);
    let closing = format!("\"{}", " }".repeat(open.clamp(0, 8) as usize));
    Some(Edit::insert((quote + end) as u32, closing))
}

/// How many times a file is parsed again after rewriting slips: each round
/// mends all the slips it finds, so a second one is rare.
const MAX_REWRITE_ROUNDS: usize = 3;

struct Parser<'s> {
    source: &'s str,
    file: FileId,
    problems: Vec<Diagnostic>,
    too_deep_reported: bool,
    /// ASCII text to write over as much of a copy to parse again, at an
    /// offset, each with the diagnostic of the slip it mends (see
    /// `pest_parse_repaired`).
    rewrites: Vec<Rewrite>,
    /// Declarations written inside a workflow, read as the file's.
    hoisted: Vec<Item>,
    /// The `{` of each block cut off (`cut_off`), with where.
    cut_off: Vec<(usize, usize)>,
    /// Where the first rewrite that changes the file's structure is (an
    /// item's keyword respelt, `worklfow`; a block's `{` supplied): what
    /// came after it was read in the wrong block or outside any item, so
    /// its rewrites wait for the copy that reads it as meant (each `///`
    /// there was "a doc comment that documents nothing").
    reread_after: Option<usize>,
}

/// Where a catch-all region was, which decides what it should have been.
#[derive(Clone, Copy)]
enum Context {
    Item,
    RecipeMember,
    McpMember,
    /// A workflow body before its first statement, where settings may still come.
    WorkflowHead,
    /// A workflow body after its first statement.
    WorkflowBody,
    Block,
    Parallel,
    TestMember,
}

/// The span of a pair without the whitespace that pest's implicit rule
/// consumed after it (before an optional part that did not match).
fn span_of(pair: &Pair<'_, Rule>) -> Span {
    let span = pair.as_span();
    let text = span.as_str().trim_end_matches([' ', '\t', '\r', '\n']);
    Span::new(span.start(), span.start() + text.len())
}

fn docs(pair: &Pair<'_, Rule>) -> Vec<String> {
    pair.clone()
        .into_inner()
        .filter(|p| p.as_rule() == Rule::doc)
        .map(|p| docs_text(p.as_str()))
        .collect()
}

/// The text of a `///` doc comment, without the slashes and one space.
pub(crate) fn docs_text(comment: &str) -> String {
    let text = comment.trim_start_matches('/');
    text.strip_prefix(' ')
        .unwrap_or(text)
        .trim_end()
        .to_string()
}

/// A duration literal from its text: digits (a sign stays with them, so that
/// `-5` has no amount) and an optional unit; the checker validates both.
pub(crate) fn duration_lit(text: &str, span: Span) -> DurationLit {
    let (amount, unit) = amount_and_unit(text);
    DurationLit::new(amount, DurationUnit::of(unit), span)
}

/// A duration's digits, as a number when they make one, and its unit.
fn amount_and_unit(text: &str) -> (Option<u64>, &str) {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '-')
        .unwrap_or(text.len());
    (text[..digits_end].parse().ok(), &text[digits_end..])
}

/// The problem with a duration whose unit flow does not know. A unit of
/// another tool is converted, not matched by spelling: `2w` is `14d`, not
/// `2d`.
fn unknown_unit(text: &str, span: Span, file: FileId) -> Diagnostic {
    let (amount, unit) = amount_and_unit(text);
    let meant = foreign_unit_ms(unit)
        .and_then(|ms| amount?.checked_mul(ms))
        .filter(|ms| *ms > 0)
        .map(flow_plan::written::duration);
    const UNITS: [&str; 5] = ["ms", "s", "m", "h", "d"];
    // A unit in capitals (`5M`, `30S`) is the unit; any one letter is one
    // edit from every one-letter unit, so a letter is no near miss.
    let lower = unit.to_ascii_lowercase();
    let near = UNITS.into_iter().find(|known| *known == lower).or_else(|| {
        (unit.chars().count() > 1)
            .then(|| did_you_mean(unit, UNITS))
            .flatten()
    });
    let (hint, fix) = match (meant, near) {
        (Some(meant), _) => (
            format!("write `{meant}`: the units are `ms`, `s`, `m`, `h`, `d`"),
            Some(meant),
        ),
        (None, Some(best)) if unit.len() <= 3 => (
            format!("did you mean `{best}`? the units are `ms`, `s`, `m`, `h`, `d`"),
            amount.map(|amount| format!("{amount}{best}")),
        ),
        _ => ("the units are `ms`, `s`, `m`, `h`, `d`".to_string(), None),
    };
    let diagnostic = Diagnostic::new(
        Code::BadDuration,
        file,
        span,
        format!("unknown duration unit `{unit}`"),
    )
    .label("invalid duration")
    .hint(hint);
    match fix {
        Some(fix) => diagnostic.fix(fix),
        None => diagnostic,
    }
}

/// The children of `pair` other than doc comments.
fn children<'i>(pair: Pair<'i, Rule>) -> impl Iterator<Item = Pair<'i, Rule>> {
    pair.into_inner().filter(|p| p.as_rule() != Rule::doc)
}

fn first_child(pair: Pair<'_, Rule>) -> Pair<'_, Rule> {
    children(pair)
        .next()
        .expect("the grammar gives this rule a child")
}

fn name(pair: Pair<'_, Rule>) -> Name {
    Name {
        text: pair.as_str().into(),
        span: span_of(&pair),
    }
}

impl<'s> Parser<'s> {
    fn file(&mut self) -> SourceFile {
        let pairs = match FlowParser::parse(Rule::file, self.source) {
            Ok(pairs) => pairs,
            Err(error) => {
                // The catch-all productions let `file` match any input; this
                // is a safety net, not a path that input is known to reach.
                let at = match error.location {
                    pest::error::InputLocation::Pos(at) => at,
                    pest::error::InputLocation::Span((at, _)) => at,
                };
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        Span::new(at, at),
                        "the file could not be parsed",
                    )
                    .label("here"),
                );
                return SourceFile::default();
            }
        };
        self.cut_off = braces_cut_off(pairs.clone());
        let mut items = Vec::new();
        for pair in pairs.flatten().take(1).flat_map(|file| file.into_inner()) {
            match pair.as_rule() {
                Rule::item => {
                    if let Some(item) = self.item(pair) {
                        items.push(item);
                    }
                }
                Rule::bad_item => {
                    let blamed = self.recover(&pair, Context::Item);
                    if let Some(item) = self
                        .salvage_workflow(&pair, blamed)
                        .or_else(|| skipped_declaration(&pair))
                    {
                        items.push(item);
                    }
                }
                _ => {}
            }
        }
        items.append(&mut self.hoisted);
        SourceFile { items }
    }

    /// The part of a skipped workflow that comes before the line where its
    /// error was found (`blamed`), when that part parses on its own. (A `{`
    /// left open that the layout shows is closed before, by
    /// `closing_brace`; this keeps what it can of the rest.)
    ///
    /// A workflow with a `{` left open, as while a step's record or a
    /// `"{{step.` is being typed, does not match `workflow_decl`, so
    /// `bad_item` skips it whole, and with it every step that hover,
    /// definition and references could answer about. The copy parsed here
    /// has the file's offsets: everything outside the workflow's region and
    /// from the blamed line on is blanked, and the brackets open at that line
    /// are closed at the region's end, so the salvaged blocks span what the
    /// author sees. The copy is kept only if it parses without any syntax
    /// diagnostic (the fast parser accepts it), so the region's one stays
    /// the only one; the checker then checks the kept steps as any others.
    fn salvage_workflow(&self, region: &Pair<'_, Rule>, blamed: usize) -> Option<Item> {
        let (start, end) = (region.as_span().start(), region.as_span().end());
        let text = region.as_str();
        let decl = text
            .lines()
            .map(str::trim_start)
            .find(|line| !line.is_empty() && !line.starts_with("///"))?;
        if !decl.starts_with("workflow") || !(start..end).contains(&blamed) {
            return None;
        }
        // Byte for byte, so that every offset stays the file's; on bytes,
        // since the region's end less its closing brackets may fall inside
        // a character.
        let blank = |bytes: &[u8]| -> String {
            bytes
                .iter()
                .map(|b| if *b == b'\n' { '\n' } else { ' ' })
                .collect()
        };
        let cut = self.source[..blamed].rfind('\n').map_or(0, |i| i + 1);
        let kept = &self.source[start..cut.max(start)];
        let open = cursor::scan(kept, kept.len());
        if open.lexical != cursor::Lexical::Code
            || open.open.is_empty()
            || end - cut < open.open.len()
        {
            return None;
        }
        let mut copy = blank(&self.source.as_bytes()[..start]);
        copy.push_str(kept);
        copy.push_str(&blank(&self.source.as_bytes()[cut..end - open.open.len()]));
        copy.extend(open.open.iter().rev().map(|(_, b)| cursor::closing(*b)));
        let mut items = parse_fast(&copy, self.file)?.items;
        match items.pop() {
            Some(Item::Workflow(workflow)) if items.is_empty() => Some(Item::Workflow(workflow)),
            _ => None,
        }
    }

    fn item(&mut self, pair: Pair<'_, Rule>) -> Option<Item> {
        let docs = docs(&pair);
        let decl = first_child(pair);
        let span = span_of(&decl);
        Some(match decl.as_rule() {
            Rule::import_decl => Item::Import(Import {
                path: self.string_after(first_child(decl), "import", "an import's path"),
                span,
            }),
            Rule::from_import_slip => {
                let path = self.string_after(first_child(decl), "import", "an import's path");
                let written = &self.source[path.span.start as usize..path.span.end as usize];
                let meant = if written.starts_with('"') {
                    format!("import {written}")
                } else {
                    format!("import \"{written}\"")
                };
                self.slip(
                    span,
                    "flow imports a whole file",
                    "not a flow import",
                    format!("write `{meant}`: the file's recipes, types and MCP servers all come with it"),
                    meant,
                );
                Item::Import(Import { path, span })
            }
            Rule::type_decl => {
                let mut inner = decl.into_inner();
                let name = self.declared(inner.next()?);
                let ty = self.type_expr(inner.next()?);
                Item::Type(TypeDecl {
                    docs,
                    name,
                    ty,
                    span,
                })
            }
            Rule::recipe_decl => Item::Recipe(self.recipe(decl, docs)),
            Rule::mcp_decl => Item::Mcp(self.mcp(decl, docs)),
            Rule::workflow_decl => Item::Workflow(self.workflow(decl, docs)),
            Rule::test_decl => Item::Test(self.test_decl(decl, docs)),
            _ => return None,
        })
    }

    /// A name that a declaration introduces; keywords are refused here rather
    /// than in the grammar (see `ident` in flow.pest).
    fn declared(&mut self, pair: Pair<'_, Rule>) -> Name {
        if pair.as_rule() == Rule::name_slip {
            return self.name_slip(pair);
        }
        let name = name(pair);
        if KEYWORDS.contains(&name.text.as_str()) {
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    name.span,
                    format!("`{}` is a keyword and cannot be used as a name", name.text),
                )
                .label("keyword")
                .hint(format!("pick another name, such as `{}_step`", name.text)),
            );
        }
        name
    }

    /// A declared name written as flow does not read one (`name_slip` in
    /// flow.pest): reported, and the name meant stands in for it, so that
    /// what it names is checked and references to the name meant resolve.
    /// A missing name stands in as the empty name, which no reference
    /// matches and no duplicate check counts.
    fn name_slip(&mut self, pair: Pair<'_, Rule>) -> Name {
        let span = span_of(&pair);
        let written = pair.as_str();
        let keyword = self.source[..span.start as usize]
            .trim_end()
            .rsplit(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .next()
            .unwrap_or_default();
        if written.is_empty() {
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    span,
                    format!("this {keyword} has no name"),
                )
                .label("a name goes here")
                .hint(format!(
                    "name it after `{keyword}`, as `{keyword} {example} {{`: letters, digits and `_`",
                    example = match keyword {
                        "recipe" => "summarize",
                        "mcp" => "browser",
                        "parallel" => "lookups",
                        _ => "triage",
                    }
                )),
            );
            return Name {
                text: EcoString::new(),
                span,
            };
        }
        let quoted = written.starts_with('"');
        let bare = written.trim_matches('"');
        let meant = name_meant(bare);
        let (message, label, rule) = if quoted {
            (
                format!("`{written}` is a string, not a name"),
                "quoted".to_string(),
                "a name is written without quotes",
            )
        } else if let Some(odd) = written
            .chars()
            .find(|c| !c.is_ascii_alphanumeric() && *c != '_')
        {
            (
                format!("`{written}` is not a name"),
                format!("`{odd}` cannot be part of a name"),
                "a name is letters, digits and `_`",
            )
        } else {
            (
                format!("`{written}` is not a name"),
                "starts with a digit".to_string(),
                "a name starts with a letter or `_`",
            )
        };
        self.slip(
            span,
            &message,
            &label,
            format!("{rule}: `{meant}`"),
            meant.clone(),
        );
        Name {
            text: meant.into(),
            span,
        }
    }

    // ------------------------------------------------------------ errors

    /// A `"""` string or a `/*` comment that is never closed runs to the end
    /// of the file: it is the one mistake to report, at where it opens.
    /// What follows it (read as code by the parser's recovery) is dropped
    /// with the errors it drew; what comes before it is checked: a copy of
    /// the file ends there, the string as `""` and every bracket open
    /// there closed, so that the workflow the mistake is in is not lost
    /// with it.
    fn left_open(&mut self, tree: &mut SourceFile) {
        let scanned = cursor::scan(self.source, self.source.len());
        let opened = scanned.opened;
        let (what, close, len, ended) = match scanned.lexical {
            cursor::Lexical::String { triple: true }
            | cursor::Lexical::Template { triple: true } => {
                ("this `\"\"\"` string", "`\"\"\"`", 3, "\"\"")
            }
            cursor::Lexical::Comment if self.source[opened..].starts_with("/*") => {
                ("this `/*` comment", "`*/`", 2, "")
            }
            _ => return,
        };
        let diagnostic = Diagnostic::new(
            Code::Syntax,
            self.file,
            Span::new(opened, opened + len),
            format!("{what} is not closed"),
        )
        .label("opens here and runs to the end of the file")
        .hint(format!(
            "close it with {close}; nothing after it is checked"
        ));
        let closers: String = scanned
            .open
            .iter()
            .rev()
            .map(|(_, bracket)| cursor::closing(*bracket))
            .collect();
        let tail = self.source.len() - opened;
        if ended.len() + closers.len() <= tail {
            // Line breaks are kept, so that the layout still tells which
            // brace a `}` closes.
            let blanked: String = self.source[opened..]
                .bytes()
                .skip(ended.len() + closers.len())
                .map(|b| if b == b'\n' { '\n' } else { ' ' })
                .collect();
            self.rewrites
                .retain(|(at, text, _)| at + text.len() <= opened);
            self.rewrites
                .push((opened, format!("{ended}{closers}{blanked}"), diagnostic));
            return;
        }
        // More brackets open than room to close them: the items it ends
        // inside are dropped, and the braces it swallowed, which leave
        // those before it open, are no other mistake.
        self.problems
            .retain(|d| (d.primary.span.start as usize) < opened && d.message != UNCLOSED_BRACE);
        tree.items
            .retain(|item| (item.span().end as usize) <= opened);
        self.problems.push(diagnostic);
    }

    /// Reports each `{` left open, whose block the end of the file or the
    /// next workflow or test cut off (see `block_close`), that no other
    /// problem blamed already (a record's, which the recovery reports where
    /// its statement ends).
    ///
    /// Which ones: the parse counts the braces left open, but pairs each
    /// `}` with the nearest `{`, so the `}` the author wrote for the
    /// workflow closes the last `if` whose own was forgotten. The braces
    /// the layout shows were left open go first, then the innermost of
    /// those the parse cut off.
    fn unclosed_at_end(&mut self) {
        let cut_off = std::mem::take(&mut self.cut_off);
        if cut_off.is_empty() {
            return;
        }
        let mut by_layout = unclosed_by_layout(self.source);
        by_layout.truncate(cut_off.len());
        let mut braces: Vec<usize> = by_layout.iter().map(|(brace, ..)| *brace).collect();
        for (brace, _) in cut_off.iter().rev() {
            if braces.len() == cut_off.len() {
                break;
            }
            if !braces.contains(brace) {
                braces.push(*brace);
            }
        }
        braces.sort_unstable();
        for brace in braces {
            let blamed = self
                .problems
                .iter()
                .any(|p| p.message == UNCLOSED_BRACE && p.primary.span.start as usize == brace);
            if blamed {
                continue;
            }
            let unclosed = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(brace, brace + 1),
                UNCLOSED_BRACE,
            )
            .label("not closed");
            // Where the parse cut it off; the innermost's place for one
            // the layout chose that the parse closed.
            let cut = cut_off
                .iter()
                .find(|(at, _)| *at == brace)
                .or(cut_off.last())
                .map_or(self.source.len(), |(_, cut)| *cut);
            let diagnostic = match by_layout.iter().find(|(at, ..)| *at == brace) {
                Some(&(_, back, indent)) => unclosed
                    .hint(BLOCK_ENDS_BACK)
                    .fix_with(
                        "Close the block before the line back at its indentation",
                        vec![Edit::insert(back as u32, format!("{indent}}}\n"))],
                    )
                    .secondary(
                        self.file,
                        Span::new(back, back + first_line_len(&self.source[back..])),
                        "the block ends before this line",
                    ),
                None if cut < self.source.len() => unclosed
                    .hint("the next declaration starts before a `}` closes it")
                    .fix_with(
                        "Close the `{` before the next declaration",
                        vec![Edit::insert(cut as u32, "}\n")],
                    )
                    .secondary(
                        self.file,
                        Span::new(cut, cut + first_line_len(&self.source[cut..])),
                        "the next declaration",
                    ),
                None => unclosed
                    .hint("the file ends before a `}` closes it")
                    .fix_with(
                        "Close the `{` at the end of the file",
                        vec![Edit::insert(self.source.len() as u32, "}\n")],
                    ),
            };
            self.problems.push(diagnostic);
        }
    }

    /// Reports the region of a catch-all production; returns the offset the
    /// diagnostic points at.
    fn recover(&mut self, pair: &Pair<'_, Rule>, context: Context) -> usize {
        let start = pair.as_span().start();
        if let Some(diagnostic) = self.foreign_form(start, start, &[], context) {
            self.problems.push(diagnostic);
            return start;
        }
        if let Some(at) = self.misspelt_keyword(start, context) {
            return at;
        }
        let candidates: &[Rule] = match context {
            Context::Item => &[Rule::item],
            Context::RecipeMember => &[Rule::recipe_member],
            Context::McpMember => &[Rule::mcp_member],
            Context::WorkflowHead => &[Rule::statement, Rule::workflow_setting],
            Context::WorkflowBody | Context::Block => &[Rule::statement],
            Context::Parallel => &[Rule::branch],
            Context::TestMember => &[Rule::test_member],
        };
        let rest = &self.source[start..];
        if matches!(context, Context::Parallel)
            && let Some(id) = declared_id(rest, true)
        {
            let end = start + first_line_len(rest);
            let id = id.1;
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(start, end),
                    "a `parallel` block holds branches, not statements",
                )
                .label("not in a branch")
                .hint(format!(
                    "put the statements that run one after another in a branch: `branch {id} {{ ... }}`; the branches run at the same time"
                )),
            );
            return start;
        }
        // A step option that does not parse ends the step before it, so the
        // option's words arrive here as a statement: explain the option instead.
        let option_words = ["retry", "backoff", "timeout", "on_error", "idempotency"];
        let candidates: &[Rule] = if matches!(
            context,
            Context::Block | Context::WorkflowHead | Context::WorkflowBody
        ) && option_words.iter().any(|w| rest.starts_with(w))
        {
            &[Rule::step_option]
        } else if rest.starts_with("output")
            && !rest
                .as_bytes()
                .get(6)
                .is_some_and(|b| cursor::is_name_byte(*b))
        {
            // A workflow's output that does not parse: its record is what
            // to explain.
            &[Rule::workflow_output]
        } else if rest.starts_with("else")
            && !rest
                .as_bytes()
                .get(4)
                .is_some_and(|b| cursor::is_name_byte(*b))
        {
            // An `else if` whose condition does not parse ends the `if`
            // before it: its condition is what to explain.
            &[Rule::else_if, Rule::else_clause]
        } else {
            candidates
        };

        let (at, expected) = furthest_failure(candidates, rest);
        let at = start + at;
        if let Some(at) = self.stray_doc(start, at) {
            self.rewrites.push((
                at + 2,
                " ".to_string(),
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(at, at + 3),
                    "this doc comment documents nothing",
                )
                .label("`///` documents the declaration, field or statement after it")
                .hint("write `//` for a comment")
                .fix("//"),
            ));
            return at;
        }
        if let Some(rewrite) = self
            .unusual_character(at)
            .or_else(|| self.respelt(at, &expected))
        {
            self.rewrites.push(rewrite);
            return at;
        }
        // A duration's unit apart from its number inside a record
        // (`expires: 1 day`): the unit was read as the next field's name.
        let before = self.source[..at].trim_end_matches([' ', '\t']);
        let unit_len = before
            .bytes()
            .rev()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if unit_len > 0
            && let Some(number) =
                self.spaced_unit(before.len() - unit_len, &before[before.len() - unit_len..])
        {
            return number;
        }
        if let Some(diagnostic) = self.foreign_form(start, at, &expected, context) {
            self.problems.push(diagnostic);
            return at;
        }
        // A statement left unfinished at the end of its line (`step d =`):
        // the parse of what follows found the next line's words unexpected,
        // but the mistake is where the line ends.
        let written = self.source[start..pair.as_span().end()].trim_end();
        let unfinished = start + written.len();
        if matches!(
            context,
            Context::Block | Context::WorkflowHead | Context::WorkflowBody
        ) && at > unfinished
            && self.source[unfinished..at].contains('\n')
            && cursor::scan(written, written.len()).open.is_empty()
            && cursor::scan(written, written.len()).lexical == cursor::Lexical::Code
        {
            let last = written.len() - written.trim_end_matches(|c: char| !c.is_whitespace()).len();
            let span = Span::new(unfinished - last, unfinished);
            let (_, expected) = furthest_failure(candidates, written);
            if let Some(rewrite) =
                missing_block_brace_rewrite(self.source, self.file, unfinished, &expected)
            {
                self.reread_after(rewrite.0);
                self.rewrites.push(rewrite);
                return unfinished;
            }
            let diagnostic = if written.ends_with('=') && written.starts_with("step") {
                Diagnostic::new(Code::Syntax, self.file, span, "the step's call is missing")
                    .label("expected a call after this")
                    .hint("write what the step runs on this line: `RECIPE { ... }`, `approval { ... }`, `handoff \"TEAM\" { ... }`, `kb_write \"COLLECTION\" { ... }` or `SERVER.TOOL { ... }`")
            } else {
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    span,
                    "the statement ends unfinished at the end of this line",
                )
                .label("unfinished");
                if expected.is_empty() {
                    diagnostic
                } else {
                    diagnostic.hint(format!("expected {} after this", join_or(&expected)))
                }
            };
            self.problems.push(diagnostic);
            return unfinished;
        }
        // A parse that stopped inside a word (`approved` where `approve`
        // was a keyword) is about the whole word, and about what was
        // expected where the word starts.
        let (at, expected) = if self
            .source
            .as_bytes()
            .get(at)
            .is_some_and(|b| cursor::is_name_byte(*b))
        {
            let word_start = at - cursor::name_len_before(&self.source[start..at]);
            let before = &self.source[start..word_start];
            match furthest_failure(candidates, before) {
                (failed, words) if word_start > start && failed == before.len() => {
                    (word_start, words)
                }
                _ => (word_start, expected),
            }
        } else {
            (at, expected)
        };
        // `retry 3.5`: the whole number was read and the failure is at its
        // `.`; the number as written is what to show.
        let at = match fraction_start(&self.source[..at], &self.source[at..]) {
            Some(number) if expected.iter().any(|w| w == "a whole number") => number,
            _ => at,
        };
        let found = describe_found(&self.source[at..]);
        let end = at + found.1;
        // Between items, a `}` closes nothing: one too many, or the `{`
        // it was meant for is missing.
        if matches!(context, Context::Item) && self.source[at..].starts_with('}') {
            let diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(at, at + 1),
                "this `}` closes nothing",
            )
            .label("no `{` is open here")
            .hint("remove it, or add the `{` it was meant to close");
            let diagnostic = self.resumes(diagnostic, start, pair.as_span().end());
            self.problems.push(diagnostic);
            return at;
        }
        // A tool's name ending in its hyphen (`b.get- { }`): what stops
        // the parse is the blank after it, which says nothing (an audit).
        let hyphen_ends_a_name = expected.is_empty()
            && self.source[..at].ends_with('-')
            && self.source[..at - 1].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let message = if hyphen_ends_a_name {
            "a name does not end in `-`: a tool's name goes on after its hyphen (`get-sum`)"
                .to_string()
        } else if expected.is_empty() {
            match found.0.strip_prefix("the end of ") {
                Some(what) => format!("{what} ends too early"),
                None => format!("unexpected {}", found.0),
            }
        } else {
            format!("expected {}, found {}", join_or(&expected), found.0)
        };
        // A near miss of a keyword that was expected (`approved` for
        // `approve`): the keyword is the fix.
        let word = &self.source[at..end];
        let near_miss = (!word.is_empty() && word.bytes().all(cursor::is_name_byte))
            .then(|| {
                let keywords = expected.iter().filter_map(|expected| {
                    expected
                        .strip_prefix('`')?
                        .strip_suffix('`')
                        .filter(|keyword| keyword.bytes().all(cursor::is_name_byte))
                });
                did_you_mean(word, keywords)
            })
            .flatten()
            .map(str::to_string);
        let region = pair.as_span();
        // A `"..."` string ends at its line's end: left open, it swallowed
        // what followed it on that line, closing braces included, so it is
        // the mistake to name, wherever the re-parse stopped.
        // Of several, the first: a string meant to go on over lines leaves
        // its closing quote to open another on the last.
        let line_end = region.end() + first_line_len(&self.source[region.end()..]);
        let first_line_end = start + first_line_len(&self.source[start..]);
        let cut_string = [first_line_end, line_end]
            .into_iter()
            .find_map(|end| cursor::scan(&self.source[start..], end + 1 - start).cut_string);
        if let Some(quote) = cut_string {
            let quote = start + quote;
            let mut diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(quote, quote + 1),
                "this string is not closed",
            )
            .label("the string opens here and the line ends before its closing `\"`")
            .hint(string_cut_hint(self.source, quote));
            if let Some(closing) = string_closing(self.source, quote) {
                diagnostic = diagnostic.fix_with("Close the string", vec![closing]);
            }
            self.problems
                .push(self.resumes(diagnostic, start, region.end()));
            return quote;
        }
        // The re-parse ran past the region that was skipped: something opened
        // in it is never closed. The end of the file is no place to point at;
        // the brace left open is, when the layout shows which one it is, or
        // else the last one the region leaves open.
        if at >= region.end() {
            let suspect = suspect_unclosed_brace(region.as_str()).or_else(|| {
                let open = cursor::scan(region.as_str(), region.as_str().len()).open;
                open.iter().rev().find(|(_, b)| *b == b'{').map(|(brace, _)| {
                    (
                        *brace,
                        "the statement ends before a `}` closes this `{`: add it where the record ends",
                    )
                })
            });
            if let Some((brace, why)) = suspect {
                let brace = region.start() + brace;
                // Where the skipped statement's text ends: the record it
                // opened ends there too, as far as the layout tells.
                let statement_end = region.start() + region.as_str().trim_end().len();
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        Span::new(brace, brace + 1),
                        UNCLOSED_BRACE,
                    )
                    .label("not closed")
                    .hint(why)
                    .fix_with(
                        "Close the `{` where the statement ends",
                        vec![Edit::insert(statement_end as u32, " }")],
                    ),
                );
                let diagnostic = self.problems.pop().expect("just pushed");
                self.problems
                    .push(self.resumes(diagnostic, start, region.end()));
                return brace;
            }
        }
        let span = match hyphen_ends_a_name {
            true => Span::new(at - 1, at),
            false => Span::new(at, end),
        };
        let mut diagnostic =
            Diagnostic::new(Code::Syntax, self.file, span, message).label(if hyphen_ends_a_name {
                "ends the name".to_string()
            } else if expected.is_empty() {
                "unexpected here".to_string()
            } else {
                format!("expected {}", join_or(&expected))
            });
        if let Some(keyword) = near_miss {
            diagnostic = diagnostic
                .hint(format!("did you mean `{keyword}`?"))
                .fix(keyword);
        }
        // A statement skipped over several lines (a record's, say) is
        // checked no further: where checking goes on is shown.
        let skips_lines = self.source[end.min(region.end())..region.end()]
            .trim_end()
            .contains('\n');
        if matches!(
            context,
            Context::Item | Context::RecipeMember | Context::McpMember | Context::TestMember
        ) || at > pair.as_span().end()
            || skips_lines
        {
            diagnostic = self.resumes(diagnostic, start, region.end());
        }
        self.problems.push(diagnostic);
        at
    }

    /// A rewrite of the same length for what the parse stopped at, `at`,
    /// where `expected` was expected: a string in single quotes, a step's
    /// arguments in parentheses (`summarize(text: "x")`), `=` between a
    /// field and its value.
    /// A character that a word processor or a copy from a web page puts
    /// in code: a typographic quote (`“text”`, read in a copy with straight
    /// quotes and the string's text as it is) or an invisible character
    /// (a zero-width space, a no-break space, a byte order mark inside the
    /// file; blanks in the copy).
    fn unusual_character(&self, at: usize) -> Option<Rewrite> {
        let rest = &self.source[at..];
        let c = rest.chars().next()?;
        let width = c.len_utf8();
        if matches!(
            c,
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{2018}' | '\u{2019}'
        ) {
            let line = &rest[..first_line_len(rest)];
            // Each opening quote has its own closing ones: an apostrophe
            // (`’`) inside `“don’t”` closes nothing.
            let closers: &[char] = match c {
                '\u{2018}' | '\u{2019}' => &['\u{2019}', '\u{2018}'],
                _ => &['\u{201D}', '\u{201C}', '"'],
            };
            let closing = line[width..].find(closers);
            let (end, inner) = match closing {
                Some(close) => {
                    let close_width = line[width + close..]
                        .chars()
                        .next()
                        .map_or(1, char::len_utf8);
                    (width + close + close_width, &line[width..width + close])
                }
                None => (width, ""),
            };
            let quoted = format!("\"{inner}\"");
            let diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(at, at + end),
                format!("`{c}` is a typographic quote: a string is between straight quotes `\"`"),
            )
            .label("not a straight quote")
            .hint(format!(
                "write `{quoted}`; an editor or word processor may have curled the quotes"
            ));
            let diagnostic = if closing.is_some() {
                diagnostic.fix(quoted)
            } else {
                diagnostic
            };
            // The copy: the string with straight quotes, padded with blanks
            // to the bytes of the curly ones.
            let pad = end - inner.len() - 2;
            let copy = if closing.is_some() {
                format!(
                    "{}\"{inner}\"{}",
                    " ".repeat(pad / 2),
                    " ".repeat(pad - pad / 2)
                )
            } else {
                format!("\"{}", " ".repeat(width - 1))
            };
            return Some((at, copy, diagnostic));
        }
        // A letter of another alphabet, or with an accent, in a name
        // (`step résumé`, `input { naïve: string }`): the parse stopped at
        // it as at any stray character, and said it expected a name where
        // one was being written. The whole word is reported once, and read
        // on with `_` for each such letter, so that its uses resolve.
        if cursor::is_foreign_letter(c) {
            let word_start = at - cursor::name_len_before(&self.source[..at]);
            let word_len = self.source[word_start..]
                .char_indices()
                .find(|(_, c)| {
                    !(c.is_ascii_alphanumeric() || *c == '_' || cursor::is_foreign_letter(*c))
                })
                .map_or(self.source.len() - word_start, |(end, _)| end);
            let word = &self.source[word_start..word_start + word_len];
            let copy: String = word
                .chars()
                .map(|c| match c.is_ascii() {
                    true => c.to_string(),
                    false => "_".repeat(c.len_utf8()),
                })
                .collect();
            let diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(word_start, word_start + word_len),
                match word.chars().count() {
                    1 => format!("`{c}` is not an ASCII letter, as the letters of a name are"),
                    _ => format!("`{word}` is not a name: `{c}` is not an ASCII letter"),
                },
            )
            .label("not ASCII")
            .hint("a name is ASCII letters, digits and `_`: write it without accents or letters of other alphabets (text in strings may hold any)");
            return Some((word_start, copy, diagnostic));
        }
        // An ASCII control character (a NUL) was "found `\u{0}`" where a
        // string or a name was expected, and after a keyword the rest of
        // the file was skipped (an audit).
        let control = c.is_ascii_control() && !matches!(c, '\t' | '\n' | '\r');
        if is_invisible(c) || control {
            let code = format!("U+{:04X}", u32::from(c));
            let what = match control {
                true => "a control character",
                false => "an invisible character",
            };
            let diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(at, at + width),
                format!("{what}, {code}, is in the code here"),
            )
            .label(code.clone())
            .hint("remove it: it is often pasted from a web page or a chat along with the code")
            .fix("");
            return Some((at, " ".repeat(width), diagnostic));
        }
        None
    }

    /// Notes a rewrite at `at` that changes the file's structure.
    fn reread_after(&mut self, at: usize) {
        self.reread_after = Some(self.reread_after.map_or(at, |first| first.min(at)));
    }

    fn respelt(&self, at: usize, expected: &[String]) -> Option<Rewrite> {
        let line = &self.source[at..at + first_line_len(&self.source[at..])];
        // A field's name in quotes, as JSON writes it (`{ "message": "hi" }`):
        // read as the name meant, padded with blanks where the quotes were.
        if line.starts_with('"')
            && !line.starts_with("\"\"\"")
            && expected.iter().any(|w| w == "a name")
            && let Some(close) = line[1..].find('"')
            && line[close + 2..]
                .trim_start_matches([' ', '\t'])
                .starts_with(':')
        {
            let written = &line[1..close + 1];
            let meant = name_meant(written);
            // The copy keeps the offsets: as long as the quoted name, in
            // ASCII, or it is left to the generic error.
            let quoted = close + 2;
            if meant.len() <= quoted && written.is_ascii() {
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(at, at + quoted),
                    format!("a field's name is written without quotes: `{meant}`"),
                )
                .label("quoted")
                .hint(format!(
                    "write `{meant}: ...`; a string is a value, not a name"
                ))
                .fix(meant.clone());
                let copy = format!("{meant}{}", " ".repeat(quoted - meant.len()));
                return Some((at, copy, diagnostic));
            }
        }
        // A step option read as the next field of a record left open
        // (`{ message: x idempotency "k"`): the record's `}` is missing
        // before it, and the blank before the option becomes one.
        if expected == ["`:`"] {
            let before = self.source[..at].trim_end_matches([' ', '\t']);
            let word_len = cursor::name_len_before(before);
            let word = &before[before.len() - word_len..];
            let word_start = before.len() - word_len;
            let blank = self.source[..word_start].ends_with([' ', '\t']);
            let after_value = !self.source[..word_start]
                .trim_end()
                .ends_with([',', '{', ':']);
            // A field whose `:` is missing (`{ a: 1 b 2 }`, `{ a: 1 timeout
            // "5s" }`): a name after a value and before another, which no
            // step option takes; the blank after the name becomes the `:`.
            let word_end = word_start + word_len;
            let argument = &self.source[at..];
            let option_takes = match word {
                "timeout" | "retry" => argument.starts_with(|c: char| c.is_ascii_digit()),
                "idempotency" => true,
                "on_error" => argument.starts_with(|c: char| c.is_ascii_alphabetic()),
                _ => false,
            };
            let starts_value = argument.starts_with(['"', '[', '{'])
                || argument.starts_with(|c: char| c.is_ascii_digit());
            if word_len > 0
                && blank
                && !self.source[..word_start].trim_end().ends_with(':')
                && at > word_end
                && starts_value
                && !option_takes
                && !word.starts_with(|c: char| c.is_ascii_digit())
            {
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(word_start, word_end),
                    format!("the field `{word}` has no `:` before its value"),
                )
                .label("a field's name")
                .hint("a field is written `NAME: VALUE`")
                .fix_with("Add the `:`", vec![Edit::insert(word_end as u32, ":")]);
                return Some((word_end, ":".to_string(), diagnostic));
            }
            if ["idempotency", "retry", "timeout", "on_error"].contains(&word)
                && blank
                && after_value
            {
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(word_start, word_start + word_len),
                    format!("`{word}` is a step option: the record before it is not closed"),
                )
                .label("an option, not a field")
                .hint("close the step's record with `}` before its options")
                .fix_with(
                    "Close the record",
                    vec![Edit::insert(word_start as u32, "} ")],
                );
                return Some((word_start - 1, "}".to_string(), diagnostic));
            }
        }
        // A loop's `max N concurrency M`: the two swapped read as meant.
        if expected.iter().any(|word| word == "`{`")
            && let Some(rest) = line.strip_prefix("concurrency")
        {
            let digits = |text: &str| text.bytes().take_while(u8::is_ascii_digit).count();
            let count = rest.trim_start_matches([' ', '\t']);
            let count_len = digits(count);
            let before = self.source[..at].trim_end_matches([' ', '\t']);
            let max_count_len =
                before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            let max_word = before[..before.len() - max_count_len].trim_end_matches([' ', '\t']);
            if count_len > 0 && max_count_len > 0 && max_word.ends_with(" max") {
                let max_start = max_word.len() - 3;
                let concurrency_end = at + (line.len() - count.len()) + count_len;
                let max_part = &self.source[max_start..before.len()];
                let between = &self.source[before.len()..at];
                let concurrency_part = &self.source[at..concurrency_end];
                let swapped = format!("{concurrency_part}{between}{max_part}");
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(max_start, concurrency_end),
                    "a loop's `concurrency` comes before its `max`",
                )
                .label("in the other order")
                .hint(format!("write `{swapped}`"))
                .fix(swapped.clone());
                return Some((max_start, swapped, diagnostic));
            }
        }
        let diagnostic = |span: (usize, usize), message: &str, label: &str, meant: &str| {
            Diagnostic::new(Code::Syntax, self.file, Span::new(span.0, span.1), message)
                .label(label)
                .hint(format!("write `{meant}`"))
                .fix(meant)
        };
        // The one character at `at`, blanked.
        let removed = |message: &str, label: &str, hint: &str| -> Rewrite {
            let diagnostic =
                Diagnostic::new(Code::Syntax, self.file, Span::new(at, at + 1), message)
                    .label(label)
                    .hint(hint)
                    .fix("");
            (at, " ".to_string(), diagnostic)
        };
        let statement_start = expected.iter().any(|word| word == "`step`");
        // A `{` missing at the end of the line before (`workflow w` alone on
        // its line): the line break becomes the brace.
        let mut before = self.source[..at].trim_end_matches([' ', '\t', '\r']);
        // Blank and comment lines between the two do not count.
        while let Some(newline) = before.strip_suffix('\n') {
            let line = &newline[newline.rfind('\n').map_or(0, |i| i + 1)..];
            if !(line.trim().is_empty() || line.trim_start().starts_with("//")) {
                break;
            }
            before = &newline[..newline.len() - line.len()];
        }
        let line_start = before
            .trim_end_matches('\n')
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let declaration = before.trim_end_matches('\n');
        // The body a `{` would open is indented under its declaration; a
        // line at the same indentation (`input` after `workflow w` in a
        // test) is not in it.
        let at_line = &self.source[self.source[..at].rfind('\n').map_or(0, |i| i + 1)..];
        if expected == ["`{`"]
            && before.ends_with('\n')
            && indent(at_line) > indent(&declaration[line_start..])
            && cursor::scan(&declaration[line_start..], declaration.len() - line_start).lexical
                == cursor::Lexical::Code
        {
            let newline = before.len() - 1;
            let opener = self.source[..newline]
                .trim_end_matches([' ', '\t', '\r'])
                .len();
            let diagnostic = Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(opener, opener),
                "`{` is missing at the end of this line",
            )
            .label("expected `{` here")
            .hint("add `{` here: a body opens on the line of its declaration")
            .fix(" {");
            return Some((newline, "{".to_string(), diagnostic));
        }
        // Python's and JavaScript's words for operators: `and` is `&&`.
        let word_len = cursor::name_len(line);
        let operator = match &line[..word_len] {
            "and" if expected.iter().any(|w| w == "an operator") => Some("&&"),
            "or" if expected.iter().any(|w| w == "an operator") => Some("||"),
            "not" if expected.iter().any(|w| w == "an expression") => Some("!"),
            _ => None,
        };
        // `not x` reads as the path `not`, and the parse stops at `x`.
        let before_word = self.source[..at].trim_end_matches([' ', '\t']);
        if expected.iter().any(|w| w == "an operator")
            && before_word.ends_with("not")
            && before_word.len() < at
            && !before_word[..before_word.len() - 3]
                .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            let not = before_word.len() - 3;
            let diagnostic = diagnostic(
                (not, not + 3),
                "flow writes `not` as `!`",
                "not an operator",
                "!",
            );
            return Some((not, "!  ".to_string(), diagnostic));
        }
        if let Some(operator) = operator {
            let word = &line[..word_len];
            let diagnostic = diagnostic(
                (at, at + word_len),
                &format!("flow writes `{word}` as `{operator}`"),
                "not an operator",
                operator,
            );
            return Some((at, format!("{operator:<word_len$}"), diagnostic));
        }
        match line.as_bytes().first()? {
            // Python's single quotes and JavaScript's backticks.
            quote @ (b'\'' | b'`') => {
                let close = line[1..].find(char::from(*quote))? + 1;
                let text = &line[1..close];
                if text.contains(['"', '\\']) {
                    return None;
                }
                let meant = format!("\"{text}\"");
                let diagnostic = diagnostic(
                    (at, at + close + 1),
                    "strings are written between double quotes",
                    if *quote == b'`' {
                        "backticks"
                    } else {
                        "single quotes"
                    },
                    &meant,
                );
                Some((at, meant, diagnostic))
            }

            b'(' if self.source[..at]
                .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && expected.iter().any(|word| word == "`{`") =>
            {
                let scanned = cursor::scan(line, line.len());
                // The `(` must be closed on its line, outside strings.
                if scanned.open.iter().any(|(_, b)| *b == b'(')
                    || scanned.lexical != cursor::Lexical::Code
                {
                    return None;
                }
                let close = (1..=line.len()).find(|end| {
                    line.as_bytes()[end - 1] == b')'
                        && cursor::scan(&line[..*end], *end).open.is_empty()
                })?;
                // Keyword arguments (`text=x`) become fields (`text:x`) in
                // the same stroke, so that the hint is flow and the copy
                // reads one mistake, not two.
                let inner = &line[1..close - 1];
                // `tool({ ... })`: the record is there, in parentheses.
                let record = inner.trim();
                if record.starts_with('{') && record.ends_with('}') {
                    let diagnostic = diagnostic(
                        (at, at + close),
                        "a step's arguments are a record, without parentheses",
                        "not a call",
                        record,
                    );
                    return Some((at, format!(" {inner} "), diagnostic));
                }
                let (fields, shown) = keyword_arguments(inner);
                let diagnostic = diagnostic(
                    (at, at + close),
                    "a step's arguments are a record, in braces",
                    "not a call",
                    &format!("{{ {shown} }}"),
                );
                Some((at, format!("{{{fields}}}"), diagnostic))
            }
            // JavaScript's and Rust's statement ends: a statement ends
            // with its line, and a record's fields are apart without one.
            b';' => Some(removed(
                "flow needs no `;`",
                "not a separator",
                "remove it: a statement ends with its line, and a record's fields are separated by `,` or a line break",
            )),
            // Python's `:` before a block that is written with braces too.
            b':' if expected.iter().any(|word| word == "`{`")
                && line[1..].trim_start().starts_with('{') =>
            {
                Some(removed(
                    "a block opens with `{`, without a `:` before it",
                    "not before a block",
                    "remove the `:`",
                ))
            }
            // Where a statement starts, a `,` follows the one before it
            // (copied from a list of arguments), and a `)` or `]` closes
            // nothing.
            b',' if statement_start => Some(removed(
                "this `,` follows a complete statement",
                "not a separator",
                "remove it: a statement ends with its line",
            )),
            b')' | b']' if statement_start => {
                let bracket = &line[..1];
                let opener = if bracket == ")" { "(" } else { "[" };
                Some(removed(
                    &format!("this `{bracket}` closes nothing"),
                    &format!("no `{opener}` is open here"),
                    &format!("remove it, or add the `{opener}` it was meant to close"),
                ))
            }
            // `step c: recipe { ... }`, as YAML names things.
            b':' if expected.iter().any(|word| word == "`=`") => {
                let diagnostic = diagnostic(
                    (at, at + 1),
                    "a step's id and its call are separated by `=`",
                    "not `=`",
                    "=",
                );
                Some((at, "=".to_string(), diagnostic))
            }
            // JavaScript's arrow before a block (`if x > 1 => {`): no
            // word goes there.
            b'>' if self.source[..at].ends_with('=')
                && self.source[at + 1..]
                    .trim_start_matches([' ', '\t'])
                    .starts_with('{')
                && block_header(&self.source[..at]) =>
            {
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(at - 1, at + 1),
                    "a block opens with `{`, without `=>` before it",
                )
                .label("not flow's")
                .hint("remove the `=>`")
                .fix("");
                Some((at - 1, "  ".to_string(), diagnostic))
            }
            // JavaScript's arrow and strict equality.
            b'>' if self.source[..at].ends_with('=') => {
                let diagnostic =
                    diagnostic((at - 1, at + 1), "flow has no `=>`", "not flow's", "=");
                Some((at - 1, "= ".to_string(), diagnostic))
            }
            b'=' if self.source[..at].ends_with("==") || self.source[..at].ends_with("!=") => {
                let operator = &self.source[at - 2..at];
                let diagnostic = diagnostic(
                    (at - 2, at + 1),
                    &format!("flow compares with `{operator}`"),
                    "not flow's",
                    operator,
                );
                Some((at, " ".to_string(), diagnostic))
            }
            // TypeScript's optional field, `name?: type`.
            b'?' if line.starts_with("?:") && expected.iter().any(|word| word == "`:`") => {
                let after = line[2..].trim_start();
                let ty = cursor::name_len(after);
                let diagnostic = Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(at, at + 1),
                    "an optional field is written `NAME: TYPE?`",
                )
                .label("not before the `:`")
                .hint(format!("write `: {}?`", &after[..ty.max(1)]));
                let type_end = at + (line.len() - after.len()) + ty;
                let simple = ty > 0 && !after[ty..].starts_with(['<', '.', '|']);
                let diagnostic = if simple {
                    diagnostic.fix_with(
                        "Make the field's type optional",
                        vec![
                            Edit {
                                span: Span::new(at, at + 1),
                                text: String::new(),
                            },
                            Edit::insert(type_end as u32, "?"),
                        ],
                    )
                } else {
                    diagnostic
                };
                // Read as a required field, so that the type is declared.
                Some((at, ": ".to_string(), diagnostic))
            }
            // TypeScript's array type (`tags: string[]`): read as the type
            // before it, with `list<...>` as the fix.
            b'[' if line.starts_with("[]")
                && expected.iter().any(|word| word == "`|`")
                && expected.iter().any(|word| word == "`?`") =>
            {
                let name_len = cursor::name_len_before(&self.source[..at]);
                let item = &self.source[at - name_len..at];
                let meant = format!("list<{item}>");
                let diagnostic = diagnostic(
                    (at - name_len, at + 2),
                    "flow writes a list type `list<ITEM>`",
                    "not a flow type",
                    &meant,
                );
                Some((at, "  ".to_string(), diagnostic))
            }
            // A default value after a field's type (`max_words: int = 50`),
            // as in TypeScript and Python: blanked, the field kept.
            b'=' if expected.iter().any(|word| word == "`|`")
                && expected.iter().any(|word| word == "`?`")
                && !line.starts_with("==") =>
            {
                let scanned_end = (1..=line.len())
                    .find(|end| {
                        matches!(line.as_bytes().get(*end), Some(b',' | b'}') | None)
                            && cursor::scan(&line[..*end], *end).open.is_empty()
                            && cursor::scan(&line[..*end], *end).lexical == cursor::Lexical::Code
                    })
                    .unwrap_or(line.len());
                let default = line[..scanned_end].trim_end();
                let diagnostic =
                    Diagnostic::new(Code::Syntax, self.file, Span::new(at, at + default.len()), "a field's type takes no default value")
                        .label("not part of a type")
                        .hint("leave it out: give the value where the step is called, or make the field optional (`int?`) and write `?? VALUE` where it is read")
                        .fix("");
                Some((at, " ".repeat(default.len()), diagnostic))
            }
            b'=' if expected.iter().any(|word| word == "`:`") && !line.starts_with("==") => {
                let diagnostic = diagnostic(
                    (at, at + 1),
                    "a field and its value are separated by `:`",
                    "not `:`",
                    ":",
                )
                .hint("a record is written `{ name: value }`");
                Some((at, ":".to_string(), diagnostic))
            }
            _ => None,
        }
    }

    /// Where an `if` between `start` and `at` is followed by its block's
    /// `{` with no condition between: the `if` that starts the statement,
    /// or one after `else`, in code.
    fn if_without_condition(&self, start: usize, at: usize) -> Option<usize> {
        let text = &self.source[start..at.min(self.source.len())];
        let bytes = text.as_bytes();
        let mut from = 0;
        while let Some(found) = text[from..].find("if") {
            let word = from + found;
            from = word + 2;
            let before = text[..word].trim_end();
            let opens_statement = before.is_empty()
                || before.strip_suffix("else").is_some_and(|rest| {
                    !rest
                        .as_bytes()
                        .last()
                        .is_some_and(|b| cursor::is_name_byte(*b))
                });
            let then = &text[word + 2..];
            let block_next = then.trim_start_matches([' ', '\t']).starts_with('{');
            // `elseif {` is another slip, said where it is read.
            let whole_word = !bytes
                .get(word + 2)
                .is_some_and(|b| cursor::is_name_byte(*b))
                && !word
                    .checked_sub(1)
                    .is_some_and(|b| cursor::is_name_byte(bytes[b]));
            if opens_statement
                && whole_word
                && block_next
                && cursor::scan(text, word).lexical == cursor::Lexical::Code
            {
                return Some(start + word);
            }
        }
        None
    }

    /// A form that another language taught, in a region that starts at
    /// `start` and whose parse stopped at `at`: anywhere, a comment that
    /// starts with `#`, text without quotes as a field's value, a step's
    /// arguments without braces; in a statement's place, a loop word flow
    /// does not have (`while`, `foreach`, `loop`, `unless`), a header
    /// ended with Python's `:` and no `{`, an `if` with no condition, or a
    /// recipe's member.
    fn foreign_form(
        &self,
        start: usize,
        at: usize,
        expected: &[String],
        context: Context,
    ) -> Option<Diagnostic> {
        let diagnostic = |span: Span, message: String, label: &str, hint: &str| {
            Diagnostic::new(Code::Syntax, self.file, span, message)
                .label(label)
                .hint(hint)
        };
        // A number as a type (`type Priority = 1 | 2 | 3`, `p: 1 | 2`), or
        // after a union's `|` (`"low" | 2`, where the type ended before
        // the `|`): unions are of string literals.
        let after_bar = self.source[at..].strip_prefix('|').map(|rest| {
            (
                at + 1 + rest.len() - rest.trim_start().len(),
                rest.trim_start(),
            )
        });
        let number_at = match after_bar {
            Some((number_at, rest)) if self.source[..at].trim_end().ends_with('"') => rest
                .starts_with(|c: char| c.is_ascii_digit())
                .then_some(number_at),
            _ => (self.source[at..].starts_with(|c: char| c.is_ascii_digit())
                && expected.iter().any(|w| w == "a type")
                && self.source[at..at + first_line_len(&self.source[at..])].contains('|'))
            .then_some(at),
        };
        if let Some(number_at) = number_at {
            return Some(self.number_as_type(number_at));
        }
        // Python's, YAML's and the shell's comments: the rest of the line
        // is skipped with the region, as a comment would be.
        if self.source[at..].starts_with('#') {
            let message = "flow writes comments with `//`".to_string();
            let comment = diagnostic(
                Span::new(at, at + 1),
                message,
                "not a comment",
                "write `//` for a comment",
            );
            return Some(comment.fix("//"));
        }
        // Python's block header (`if x > 1:` and its statements indented
        // under it): wherever the parse then stopped, the `:` is the mistake.
        if matches!(
            context,
            Context::Block | Context::WorkflowHead | Context::WorkflowBody
        ) {
            let rest = &self.source[start..];
            let header = rest[..first_line_len(rest)].trim_end();
            if starts_block_header(header) && header.ends_with(':') && !header.contains('{') {
                let colon = start + header.len() - 1;
                return Some(diagnostic(
                    Span::new(colon, colon + 1),
                    "a block is written between `{` and `}`, not after `:`".to_string(),
                    "expected `{`",
                    "write `{` here and close the block with `}` after its statements: indentation does not make a block",
                ));
            }
        }
        // `if {` and `} else if {`: the condition is missing. Its `{` was
        // read as a record to test, so the parse stopped after the block,
        // and "expected `{` or an expression" named what was there.
        if matches!(
            context,
            Context::Block | Context::WorkflowHead | Context::WorkflowBody
        ) && let Some(word) = self.if_without_condition(start, at)
        {
            return Some(diagnostic(
                Span::new(word, word + 2),
                "this `if` has no condition".to_string(),
                "a condition goes between `if` and `{`",
                "write what decides it: `if step.ID.FIELD > 3 {`, `if workflow_input.FLAG {`",
            ));
        }
        // A number as other languages write it (`1e5`, `1.5e3`, `0x10`):
        // read as a duration with an odd unit, it drew "expected a
        // duration".
        if let Some(span) = foreign_number(self.source, at) {
            let text = &self.source[span.start as usize..span.end as usize];
            return Some(foreign_number_diagnostic(text, span, self.file));
        }
        // `return x` in a workflow (`return { ... }` is read as the
        // `output` it means, below), `function f() {` or `def f():` among
        // the items: a program of another language.
        let word_len = cursor::name_len(&self.source[at..]);
        let word = &self.source[at..at + word_len];
        let then = self.source[at + word_len..].trim_start_matches([' ', '\t']);
        let foreign = match word {
            "return"
                if !then.starts_with('{')
                    && matches!(
                        context,
                        Context::Block | Context::WorkflowHead | Context::WorkflowBody
                    ) =>
            {
                Some((
                    "flow has no `return`",
                    "a workflow runs its steps to the end, and its `output { ... }` says what it gives back; `if` around the steps that should not run",
                ))
            }
            "function" | "def" | "fn" | "func"
                if matches!(context, Context::Item)
                    && then.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') =>
            {
                Some((
                    "flow has no functions",
                    "a `recipe` is a model call with a typed input and output, and a `workflow` the steps that call them: `recipe summarize { model \"default\" input { text: string } output { summary: string } prompt \"...\" }`",
                ))
            }
            _ => None,
        };
        if let Some((message, hint)) = foreign {
            return Some(diagnostic(
                Span::new(at, at + word_len),
                message.to_string(),
                "not flow's",
                hint,
            ));
        }
        // `let x = step.a.b`: a variable of another language (a step
        // written `let x = r { ... }` is read as one, `stepless_stmt`).
        let rest = &self.source[at..];
        if let Some(word) = ["let", "var", "const"].into_iter().find(|word| {
            rest.strip_prefix(word)
                .is_some_and(|after| after.starts_with([' ', '\t']))
        }) && rest[word.len()..]
            .trim_start_matches([' ', '\t'])
            .trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
            .trim_start_matches([' ', '\t'])
            .starts_with('=')
        {
            return Some(diagnostic(
                Span::new(at, at + word.len()),
                "flow has no variables".to_string(),
                "not a flow keyword",
                "write the reference where the value is used (`step.ID.FIELD`, `workflow_input.FIELD`); a value a model computes is a step's output (`step NAME = RECIPE { ... }`)",
            ));
        }
        // `5.`: read as a duration's number, it drew "expected a duration
        // such as `30s`".
        if let Some(whole) = self.source[..at].strip_suffix('.') {
            let digits = whole.len() - whole.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            let start = whole.len() - digits;
            let alone = !whole[..start]
                .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.');
            let then_digit =
                self.source[at..].starts_with(|c: char| c.is_ascii_digit() || c == '.');
            if digits > 0 && alone && !then_digit {
                let number = &whole[start..];
                return Some(diagnostic(
                    Span::new(start, at),
                    format!("`{number}.` has no digits after its `.`"),
                    "not a flow number",
                    &format!(
                        "a float has digits on both sides of its point: write `{number}.0`, or `{number}` for a whole number"
                    ),
                ));
            }
        }
        // A function or method call in an expression (`names.length()`,
        // `len(x)`): flow has none.
        if self.source[at..].starts_with('(')
            && self.source[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && !expected.iter().any(|w| w == "`{`")
        {
            let name_len = cursor::name_len_before(&self.source[..at]);
            return Some(diagnostic(
                Span::new(at - name_len, at + 1),
                "flow has no function calls".to_string(),
                "not a flow value",
                "a value is a literal, a reference (`step.ID.FIELD`, `workflow_input.FIELD`) or an operation on them; what a model should compute goes in a recipe's prompt",
            ));
        }
        // C's conditional operator (`a ? b : c`).
        if self.source[at..].starts_with("? ")
            && expected.iter().any(|w| w == "an operator")
            && self.source[at..at + first_line_len(&self.source[at..])].contains(" : ")
        {
            return Some(diagnostic(
                Span::new(at, at + 1),
                "flow has no `? :`".to_string(),
                "not an operator",
                "choose with `if CONDITION { ... } else { ... }` around the steps that differ; `??` gives a default for an optional value",
            ));
        }
        // Arithmetic after a value (`workflow_input.n * 2`, `a - b`): `+`
        // is in the grammar to be reported with its template, the others
        // stop the parse. A `/` was taken as the start of a comment that
        // is not one, so the parse stopped after it. A `-` between two
        // words with no blank (`step.my-step`) is a name's, not this.
        let slash = self.source[..at].ends_with('/') && !self.source[..at].ends_with("//");
        // A minus before a reference (`-workflow_input.n`) was read as a
        // negative number's sign, and the parse stopped at the name.
        let word_start = at - cursor::name_len_before(&self.source[..at]);
        let negated = self.source[..word_start].ends_with('-')
            && self.source[word_start..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        let op_at = if slash || negated {
            at.min(word_start) - 1
        } else {
            at
        };
        let op = self.source[op_at..].chars().next().unwrap_or(' ');
        let hyphen = op == '-'
            && self.source[..op_at]
                .ends_with(|c: char| c.is_ascii() && cursor::is_name_byte(c as u8))
            && self.source[op_at + 1..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        // `step.my-step.x`: the name a declaration `step my-step` is read
        // as (`name_slip`) is `my_step`.
        if hyphen {
            let start = op_at - cursor::name_len_before(&self.source[..op_at]);
            let len = self.source[start..]
                .bytes()
                .take_while(|b| cursor::is_name_byte(*b) || *b == b'-')
                .count();
            let word = &self.source[start..start + len];
            let meant = word.replace('-', "_");
            return Some(
                diagnostic(
                    Span::new(start, start + len),
                    format!("`{word}` is not a name: `-` cannot be part of one"),
                    "not a name",
                    &format!("a name is letters, digits and `_`: `{meant}`"),
                )
                .fix(meant.clone()),
            );
        }
        if matches!(op, '*' | '-' | '/' | '%')
            && (negated
                || expected.iter().any(|w| w == "an operator")
                || (slash
                    && !self.source[..op_at]
                        .trim_end()
                        .ends_with(['{', ',', ':', '('])))
        {
            return Some(diagnostic(
                Span::new(op_at, op_at + 1),
                format!("flow has no `{op}`: a workflow computes no numbers itself"),
                "not an operator in flow",
                "what a value is computed from goes in a recipe's input, and the recipe's model computes it (or the system that starts the run passes it in); conditions compare with `==`, `!=`, `<`, `<=`, `>` and `>=`",
            ));
        }
        // `timeout -5s`, `retry -1`: the sign was read, the rest is no
        // whole number.
        if self.source[..word_start].ends_with('-')
            && expected.iter().any(|w| w == "a whole number")
        {
            return Some(
                diagnostic(
                    Span::new(word_start - 1, word_start),
                    "a duration or a count is never negative".to_string(),
                    "not allowed here",
                    "remove the `-`",
                )
                .fix(""),
            );
        }
        // JSONPath's wildcard (`step.loop[*].s.x`): flow indexes a list
        // with a number, and a loop's outputs are a list already.
        if self.source[at..].starts_with("*]") && expected.iter().any(|w| w == "a whole number") {
            return Some(diagnostic(
                Span::new(at - 1, at + 2),
                "flow has no `[*]`".to_string(),
                "not an index",
                "index a list with a number (`[0]` is the first item); a loop's `step.ID` is already the list of its iterations' outputs, and a whole list can be passed as a value",
            ));
        }
        let line_start = self.source[..at].rfind('\n').map_or(0, |i| i + 1);
        let before = &self.source[line_start..at];
        // `text: hello world }`: the second word was read as the next
        // field's name, which wants a `:`.
        if expected == ["`:`"]
            && let Some(colon) = before.rfind(':')
        {
            let value = before[colon + 1..].trim();
            let words = value.split_whitespace().count();
            let plain = value
                .bytes()
                .all(|b| cursor::is_name_byte(b) || matches!(b, b' ' | b'\t' | b'-' | b'\''));
            if words >= 2 && plain {
                let from = line_start
                    + colon
                    + 1
                    + (before[colon + 1..].len() - before[colon + 1..].trim_start().len());
                let meant = format!("\"{value}\"");
                let text = diagnostic(
                    Span::new(from, from + value.len()),
                    "text is written between double quotes".to_string(),
                    "not a value",
                    &format!("write `{meant}`"),
                );
                return Some(text.fix(meant));
            }
        }
        // `step c = recipe text: "x"`: the record's braces left out.
        let rest = &self.source[at..];
        let name_len = cursor::name_len(rest);
        if expected.iter().any(|w| w == "`{`")
            && name_len > 0
            && rest[name_len..]
                .trim_start_matches([' ', '\t'])
                .starts_with(':')
        {
            let line = first_line_len(rest);
            let arguments = rest[..line].trim_end();
            return Some(diagnostic(
                Span::new(at, at + arguments.len()),
                "a step's arguments are a record, in braces".to_string(),
                "not in braces",
                &format!("write `{{ {arguments} }}`"),
            ));
        }
        if !matches!(
            context,
            Context::Block | Context::WorkflowHead | Context::WorkflowBody
        ) {
            return None;
        }
        let rest = &self.source[start..];
        let word = &rest[..cursor::name_len(rest)];
        let word_span = Span::new(start, start + word.len());
        match word {
            "model" | "prompt" => Some(diagnostic(
                word_span,
                format!("`{word}` belongs in a recipe, not in a workflow"),
                "a recipe's member",
                "declare a `recipe NAME { model \"...\" input { ... } output { ... } prompt \"...\" }` and call it from a step: `step ID = NAME { ... }`",
            )),
            "while" | "loop" | "until" => Some(diagnostic(
                word_span,
                format!("flow has no `{word}` loop"),
                "not a flow keyword",
                "a loop goes over a list: `for LIST as ID max N { ... }`; to act on a condition, write `if CONDITION { ... }`",
            )),
            "foreach" => Some(diagnostic(
                word_span,
                "flow writes a loop `for LIST as ID`".to_string(),
                "not a flow keyword",
                "write `for LIST as ID { ... }`; in its body the current item is `loop_item`",
            )),
            "unless" => Some(diagnostic(
                word_span,
                "flow has no `unless`".to_string(),
                "not a flow keyword",
                "write `if !(CONDITION) { ... }`",
            )),
            "try" | "catch" | "except" | "finally" | "rescue" => Some(diagnostic(
                word_span,
                format!("flow has no `{word}`: a step's failure is handled by the step"),
                "not a flow keyword",
                "after a step, `retry N` tries it again, and `on_error continue` or `on_error fallback { ... }` goes on without it",
            )),
            "switch" | "match" | "case" | "select" => Some(diagnostic(
                word_span,
                format!("flow has no `{word}`"),
                "not a flow keyword",
                "write `if A { ... } else if B { ... } else { ... }`",
            )),
            _ if self.source[at..].starts_with(':')
                && expected.iter().any(|w| w == "`{`")
                && self.source[at + 1..first_line_len(&self.source[at..]) + at]
                    .trim()
                    .is_empty() =>
            {
                Some(diagnostic(
                    Span::new(at, at + 1),
                    "a block is written between `{` and `}`, not after `:`".to_string(),
                    "expected `{`",
                    "write `{` here and close the block with `}` after its statements: indentation does not make a block",
                ))
            }
            _ => None,
        }
    }

    /// Where a `///` is that led the parse of a region starting at `start`
    /// to fail at `at`: the one `at` is in, or doc lines that start the
    /// region and are all of it up to `at` (before a `}`, say).
    fn stray_doc(&self, start: usize, at: usize) -> Option<usize> {
        let bytes = self.source.as_bytes();
        let slashes = (1..=2)
            .take_while(|back| at >= *back && bytes[at - back] == b'/')
            .count();
        let doc = at - slashes;
        if self.source[doc..].starts_with("///") {
            return Some(doc);
        }
        let before = &self.source[start..at];
        let only_docs = before.starts_with("///")
            && before
                .lines()
                .all(|line| line.trim().is_empty() || line.trim_start().starts_with("//"));
        only_docs.then_some(start)
    }

    /// A region that starts with a keyword of its context followed by `:`
    /// (`retry: 3`, a habit of YAML), or with a near miss of one (`retyr 3`,
    /// `promt`): reported as such, the `:` blanked to parse again. Returns
    /// where the diagnostic points.
    fn misspelt_keyword(&mut self, start: usize, context: Context) -> Option<usize> {
        const OPTIONS: &[&str] = &["retry", "timeout", "on_error", "idempotency"];
        const STATEMENTS: &[&str] = &["step", "if", "else", "for", "parallel"];
        const SETTINGS: &[&str] = crate::syntax::WORKFLOW_SETTINGS;
        let keywords: Vec<&str> = match context {
            Context::Item => vec!["import", "type", "recipe", "mcp", "workflow", "test"],
            Context::RecipeMember => vec!["model", "input", "output", "prompt", "context"],
            Context::McpMember => vec!["command", "args", "url", "env"],
            Context::WorkflowHead => [SETTINGS, STATEMENTS, &["output"]].concat(),
            Context::WorkflowBody => [STATEMENTS, OPTIONS, &["output"]].concat(),
            Context::Block => [STATEMENTS, OPTIONS].concat(),
            Context::Parallel => vec!["branch"],
            Context::TestMember => vec!["workflow", "input", "mock", "decide", "expect"],
        };
        let rest = &self.source[start..];
        let len = cursor::name_len(rest);
        let word = &rest[..len];
        let after = rest[len..].trim_start_matches([' ', '\t']);
        if len == 0 {
            return None;
        }
        let what = |word: &str| {
            if OPTIONS.contains(&word) && !matches!(context, Context::WorkflowHead) {
                "step option"
            } else if STATEMENTS.contains(&word)
                || (word == "output" && !matches!(context, Context::RecipeMember))
                || matches!(context, Context::Item | Context::Parallel)
            {
                "keyword"
            } else if matches!(context, Context::WorkflowHead) {
                "setting"
            } else {
                "member"
            }
        };
        if keywords.contains(&word) {
            if !after.starts_with(':') {
                return None;
            }
            let colon = start + (rest.len() - after.len());
            let value = after[1..].lines().next().unwrap_or("").trim();
            self.rewrites.push((
                colon,
                " ".to_string(),
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(colon, colon + 1),
                    format!("`{word}` takes no `:`"),
                )
                .label("no `:` after a keyword")
                .hint(format!("write `{word} {value}`"))
                .fix(""),
            ));
            return Some(colon);
        }
        if let Some(at) = self.spaced_unit(start, word) {
            return Some(at);
        }
        // Other languages' `return { ... }`: a workflow's result is its
        // `output`, a word of the same length, so the copy reads it as one.
        if word == "return"
            && after.starts_with('{')
            && matches!(
                context,
                Context::WorkflowHead | Context::WorkflowBody | Context::Block
            )
        {
            self.rewrites.push((
                start,
                "output".to_string(),
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(start, start + len),
                    "a workflow's result is its `output`",
                )
                .label("not a flow keyword")
                .hint("write `output { ... }` after the workflow's last statement")
                .fix("output"),
            ));
            return Some(start);
        }
        if word == "backoff" && keywords.contains(&"retry") {
            // Right after `retry N`, it is the range that does not read.
            let before = self.source[..start].trim_end();
            let count = before.trim_end_matches(|c: char| c.is_ascii_digit());
            if count.len() < before.len()
                && count.trim_end().ends_with("retry")
                && count.ends_with([' ', '\t'])
            {
                let range = after.split([' ', '\t', '\r', '\n']).next().unwrap_or("");
                let range_start = start + (rest.len() - after.len());
                let shown = if range.is_empty() {
                    start..start + len
                } else {
                    range_start..range_start + range.len()
                };
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        Span::new(shown.start, shown.end),
                        "a backoff range is written `MIN..MAX`",
                    )
                    .label("not a range of two durations")
                    .hint("write `backoff 2s..30s`: the first wait, doubled at each attempt up to the last"),
                );
                return Some(start);
            }
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    Span::new(start, start + len),
                    "`backoff` comes right after `retry N`, with a range of durations",
                )
                .label("not read as a backoff")
                .hint("write `retry 3 backoff 2s..30s`"),
            );
            return Some(start);
        }
        // A word followed by `=` or `:` names something (a step without
        // `step`, a field); a keyword's near miss is followed by its value.
        if after.starts_with(['=', ':', '.', '(', '[']) {
            return None;
        }
        if let Some(at) = self.glued_keyword(start, word, &keywords, what) {
            return Some(at);
        }
        // Other tools' names for the step options (`max_retries 3`,
        // `on_failure continue`) are too far from flow's for a near miss.
        const OPTION_SYNONYMS: &[(&str, &str)] = &[
            ("retries", "retry"),
            ("max_retries", "retry"),
            ("retry_count", "retry"),
            ("attempts", "retry"),
            ("max_attempts", "retry"),
            ("on_failure", "on_error"),
            ("on_fail", "on_error"),
            ("onerror", "on_error"),
            ("on_exception", "on_error"),
            ("timeout_ms", "timeout"),
            ("timeout_secs", "timeout"),
            ("timeout_seconds", "timeout"),
            ("idempotency_key", "idempotency"),
        ];
        let synonym = OPTION_SYNONYMS
            .iter()
            .find(|(other, meant)| *other == word && keywords.contains(meant))
            .map(|(_, meant)| *meant);
        let best = match synonym {
            Some(meant) => meant,
            None => did_you_mean(word, keywords.iter().copied())?,
        };
        let diagnostic = Diagnostic::new(
            Code::Syntax,
            self.file,
            Span::new(start, start + len),
            format!("unknown {} `{word}`", what(best)),
        )
        .label(format!("not a {}", what(best)))
        .hint(format!("did you mean `{best}`?"))
        .fix(best);
        // Where the keyword meant fits in the word's place and the blanks
        // after it (`stpe`, `improt`, `stepp` as `step `, `idempotncy "k"`
        // as `idempotency"k"`), a copy reads it as meant, so that the step
        // is declared, the file imported, the option set: their uses are
        // not reported again. A word is not glued to the next.
        let room = len + (rest.len() - len - rest[len..].trim_start_matches([' ', '\t']).len());
        let glued = best.len() == room
            && after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if best.len() <= room && !glued {
            let meant = format!("{best:<room$}");
            if matches!(context, Context::Item) {
                self.reread_after(start);
            }
            self.rewrites.push((start, meant, diagnostic));
        } else {
            self.problems.push(diagnostic);
        }
        Some(start)
    }

    /// A keyword run into the word or number after it (`retry3`,
    /// `timeout30s`, `branchA`, `branchone`): reported with the space put
    /// back. The copy cannot read it as meant (the space does not fit in
    /// the word's place), so the region stays skipped. One more lowercase
    /// letter (`outputs`, `steps`, `expected`) is more likely a slip of
    /// the keyword itself, and so is a lowercase word after a keyword that
    /// takes no name (`format_text` is no `for mat_text`) unless it is a
    /// word the keyword takes (`expectstatus`): all are left to the near
    /// miss.
    fn glued_keyword(
        &mut self,
        start: usize,
        word: &str,
        keywords: &[&str],
        what: impl Fn(&str) -> &'static str,
    ) -> Option<usize> {
        const NAMING: &[&str] = &[
            "step", "branch", "parallel", "workflow", "recipe", "mcp", "type",
        ];
        let keyword = keywords
            .iter()
            .filter(|keyword| word.len() > keyword.len() && word.starts_with(**keyword))
            .max_by_key(|keyword| keyword.len())?;
        let rest = &word[keyword.len()..];
        let marked = rest.starts_with(|c: char| c.is_ascii_digit() || c.is_ascii_uppercase());
        // The words a keyword takes after it, where they are few.
        let named = match *keyword {
            "expect" => ["status", "ran", "not", "attempts"].contains(&rest),
            "durability" => ["full", "approval"].contains(&rest),
            "on_error" => ["fail", "continue", "fallback"].contains(&rest),
            "context" => rest == "kb",
            keyword => rest.len() >= 2 && NAMING.contains(&keyword),
        };
        if !(marked || named) {
            return None;
        }
        let meant = format!("{keyword} {rest}");
        self.problems.push(
            Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(start, start + word.len()),
                format!("the {} `{keyword}` runs into `{rest}`", what(keyword)),
            )
            .label(format!("a space is missing after `{keyword}`"))
            .hint(format!("write `{meant}`"))
            .fix(meant),
        );
        Some(start)
    }

    /// A duration's unit written apart from its number (`timeout 45 secs`),
    /// which ends the number's statement and starts a region with the unit
    /// (`word`, at `start`): reported with the duration meant, which is
    /// written over the two in a copy when it fits.
    fn spaced_unit(&mut self, start: usize, word: &str) -> Option<usize> {
        let per = unit_ms(word).or_else(|| foreign_unit_ms(word))?;
        let before = self.source[..start].trim_end_matches([' ', '\t']);
        let digits = before.bytes().rev().take_while(u8::is_ascii_digit).count();
        if digits == 0 || before.len() == start {
            return None;
        }
        let number = before.len() - digits;
        let amount: u64 = before[number..].parse().ok()?;
        let meant = flow_plan::written::duration(amount.checked_mul(per)?);
        let end = start + word.len();
        let diagnostic = Diagnostic::new(
            Code::BadDuration,
            self.file,
            Span::new(number, end),
            format!("a duration is written as one word: `{meant}`"),
        )
        .label("a number and a unit apart")
        .hint(format!(
            "write `{meant}`: the units are `ms`, `s`, `m`, `h`, `d`"
        ))
        .fix(meant.clone());
        if meant.len() <= end - number {
            let padded = format!("{meant:<width$}", width = end - number);
            self.rewrites.push((number, padded, diagnostic));
        } else {
            self.problems.push(diagnostic);
        }
        Some(number)
    }

    /// Labels where checking resumes after text skipped from `from` up to
    /// `end`: the first line after it that holds something, unless that is
    /// the line of the diagnostic itself; or, when nothing follows, where
    /// the skipped text starts.
    fn resumes(&self, mut diagnostic: Diagnostic, from: usize, end: usize) -> Diagnostic {
        diagnostic
            .secondary
            .retain(|label| label.message != RESUMES && label.message != SKIPPED_TO_END);
        let rest = &self.source[end.min(self.source.len())..];
        let at = self.source.len() - rest.trim_start().len();
        let line = |offset: usize| self.source[..offset].matches('\n').count();
        if at == self.source.len() {
            let from = self.source[..from].rfind('\n').map_or(0, |i| i + 1);
            let span = Span::new(from, from + first_line_len(&self.source[from..]));
            diagnostic.secondary(self.file, span, SKIPPED_TO_END)
        } else if line(at) == line(diagnostic.primary.span.start as usize) {
            diagnostic
        } else {
            let span = Span::new(at, at + first_line_len(&self.source[at..]));
            diagnostic.secondary(self.file, span, RESUMES)
        }
    }

    fn too_deep(&mut self, span: Span) {
        if !self.too_deep_reported {
            self.too_deep_reported = true;
            self.problems.push(
                Diagnostic::new(
                    Code::TooDeep,
                    self.file,
                    span,
                    format!("nesting deeper than {MAX_DEPTH} levels"),
                )
                .label("too deep from here"),
            );
        }
    }

    /// An integer literal; on overflow, reports it and gives `neutral`, a
    /// value that draws no second diagnostic where it is used.
    fn int(&mut self, pair: Pair<'_, Rule>, neutral: i64) -> i64 {
        pair.as_str().parse().unwrap_or_else(|_| {
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    span_of(&pair),
                    "integer literal does not fit in 64 bits",
                )
                .label("too large"),
            );
            neutral
        })
    }

    /// A float literal's value. One past what a 64-bit float holds read as
    /// infinity, which JSON has not: the run got `null` where the checker
    /// had proved a `float` (an audit).
    fn float(&mut self, pair: Pair<'_, Rule>) -> f64 {
        match pair.as_str().parse::<f64>() {
            Ok(value) if value.is_finite() => value,
            _ => {
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        span_of(&pair),
                        "float literal is too large for a 64-bit float",
                    )
                    .label("too large"),
                );
                0.0
            }
        }
    }

    // ------------------------------------------------------------ types

    fn type_expr(&mut self, pair: Pair<'_, Rule>) -> TypeExpr {
        let span = span_of(&pair);
        let mut alternatives: Vec<TypeExpr> =
            pair.into_inner().map(|p| self.type_postfix(p)).collect();
        if alternatives.len() == 1 {
            alternatives.pop().expect("one alternative")
        } else {
            TypeExpr {
                kind: TypeExprKind::Union(alternatives),
                span,
            }
        }
    }

    fn type_postfix(&mut self, pair: Pair<'_, Rule>) -> TypeExpr {
        let start = span_of(&pair).start;
        let mut inner = pair.into_inner();
        let atom = inner.next().expect("type_postfix has an atom");
        let ty = self.type_atom(atom);
        let Some(first) = inner.next().map(|mark| span_of(&mark).end) else {
            return ty;
        };
        let last = inner.last().map_or(first, |mark| span_of(&mark).end);
        optional_marks(ty, start as usize, first as usize, last as usize)
    }

    fn type_atom(&mut self, pair: Pair<'_, Rule>) -> TypeExpr {
        let span = span_of(&pair);
        let inner = first_child(pair);
        let kind = match inner.as_rule() {
            Rule::list_type => TypeExprKind::List(Box::new(self.type_expr(first_child(inner)))),
            Rule::record_type => TypeExprKind::Record(self.fields(inner)),
            Rule::string => {
                let lit = self.string(inner);
                TypeExprKind::Literal(lit.display_text())
            }
            Rule::paren_type => return self.type_expr(first_child(inner)),
            _ => TypeExprKind::Named(name(first_child(inner))),
        };
        TypeExpr { kind, span }
    }

    fn fields(&mut self, record_type: Pair<'_, Rule>) -> Vec<FieldDecl> {
        record_type
            .into_inner()
            .map(|field| {
                let docs = docs(&field);
                if field.as_rule() == Rule::bad_field {
                    let name = self.bad_field(first_child(field));
                    return FieldDecl {
                        docs,
                        ty: unknown_type(name.span),
                        name,
                    };
                }
                let mut inner = children(field);
                let name = name(inner.next().expect("field name"));
                let ty = self.type_expr(inner.next().expect("field type"));
                FieldDecl { docs, name, ty }
            })
            .collect()
    }

    /// A number written where a type goes (`1 | 2 | 3`), at `number_at`.
    fn number_as_type(&self, number_at: usize) -> Diagnostic {
        let len = self.source[number_at..]
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number = &self.source[number_at..number_at + len];
        Diagnostic::new(
            Code::BadUnion,
            self.file,
            Span::new(number_at, number_at + len),
            format!("`{number}` cannot be part of a type: a union is of string literals"),
        )
        .label("a number")
        .hint(format!(
            "write it as a string (`\"{number}\"`), or use `int` and state its range in the field's `///` doc (`/// 1 to 3`), which models and the offline provider read"
        ))
    }

    /// Reports the type of a field that does not parse; the field's name.
    fn bad_field(&mut self, text: Pair<'_, Rule>) -> Name {
        let mut inner = text.into_inner();
        let name = name(inner.next().expect("field name"));
        let bad = inner.next().expect("the field's type");
        let written = bad.as_str().trim();
        let start = bad.as_span().start() + (bad.as_str().len() - bad.as_str().trim_start().len());
        let (found, len) = if written.is_empty() {
            describe_found(&self.source[start..])
        } else {
            (format!("`{}`", flow_plan::cut(written, 40)), written.len())
        };
        let end = if written.is_empty() {
            start
        } else {
            start + len
        };
        if written.starts_with(|c: char| c.is_ascii_digit()) && written.contains('|') {
            let diagnostic = self.number_as_type(start);
            self.problems.push(diagnostic);
            return name;
        }
        self.problems.push(
            Diagnostic::new(
                Code::Syntax,
                self.file,
                Span::new(start, end),
                format!("expected the type of `{}`, found {found}", name.text),
            )
            .label("expected a type")
            .hint(format!(
                "a type follows the field's `:` (`string`, `int`, `list<string>`, `{{ ... }}`); until it parses, `{}` is taken as `json`",
                name.text
            )),
        );
        name
    }

    fn record_type_decl(&mut self, pair: Pair<'_, Rule>) -> RecordTypeDecl {
        let record = first_child(pair);
        RecordTypeDecl {
            span: span_of(&record),
            fields: self.fields(record),
        }
    }

    // ------------------------------------------------------------ declarations

    /// Reports a member given twice; the first one stays.
    fn once<T>(&mut self, slot: &mut Option<T>, value: T, span: Span, what: &str) {
        if slot.is_some() {
            self.problems.push(
                Diagnostic::new(
                    Code::Member,
                    self.file,
                    span,
                    format!("`{what}` is given twice"),
                )
                .label("second one here")
                .hint("keep one of them"),
            );
        } else {
            *slot = Some(value);
        }
    }

    fn recipe(&mut self, pair: Pair<'_, Rule>, docs: Vec<String>) -> Recipe {
        let span = span_of(&pair);
        let mut inner = pair.into_inner().peekable();
        let name = self.declared(inner.next().expect("recipe name"));
        let params = inner
            .next_if(|part| part.as_rule() == Rule::params_slip)
            .map(|slip| self.params_slip(slip));
        let mut recipe = Recipe {
            span,
            ..Recipe::named(docs, name)
        };
        for member in inner {
            if member.as_rule() == Rule::bad_member {
                self.recover(&member, Context::RecipeMember);
                recipe.recovered = true;
                continue;
            }
            let member = first_child(member);
            let member_span = span_of(&member);
            match member.as_rule() {
                Rule::model_member => {
                    let model = self.string_after(first_child(member), "model", "a model name");
                    self.once(&mut recipe.model, model, member_span, "model");
                }
                Rule::input_member => {
                    let input = self.record_type_decl(member);
                    self.once(&mut recipe.input, input, member_span, "input");
                }
                Rule::output_type_member => {
                    let output = self.type_expr(first_child(member));
                    self.once(&mut recipe.output, output, member_span, "output");
                }
                Rule::prompt_member => {
                    let prompt = self.string(first_child(member));
                    self.once(&mut recipe.prompt, prompt, member_span, "prompt");
                }
                Rule::context_member => {
                    let context: Vec<StringLit> =
                        member.into_inner().map(|s| self.string(s)).collect();
                    recipe.context.extend(context);
                }
                _ => {}
            }
        }
        if let Some(params) = params
            && let Some(input) = self.report_params(params, "recipe", &recipe.input)
        {
            recipe.input = Some(input);
        }
        recipe
    }

    /// The string after `keyword` (a recipe's `model`, a handoff's
    /// department, a kb_write's collection), or a name written bare or after
    /// `:`, which is said and then read as the string meant: a reference
    /// (`workflow_input.team`) as its template, anything else as its text.
    fn string_after(&mut self, pair: Pair<'_, Rule>, keyword: &str, what: &str) -> StringLit {
        if pair.as_rule() != Rule::bare_string {
            return self.string(pair);
        }
        let text = pair.as_str();
        let value = text.trim_start_matches(':').trim_start_matches([' ', '\t']);
        let at = pair.as_span().start() + (text.len() - value.len());
        let reference = value.contains('.')
            && crate::syntax::template::parse_path(value, at)
                .is_ok_and(|path| crate::syntax::ROOTS.contains(&path.root.text.as_str()));
        // The quotes and braces are not in the source: the literal is read
        // at offsets that put its text, or its reference, where it is.
        let (lit, meant) = if value.starts_with('"') {
            (self.string_at(value, at), value.to_string())
        } else if reference {
            let meant = format!("\"{{{{{value}}}}}\"");
            (self.string_at(&meant, at.saturating_sub(3)), meant)
        } else {
            let meant = format!("\"{value}\"");
            (self.string_at(&meant, at.saturating_sub(1)), meant)
        };
        let message = if text.starts_with(':') {
            format!("`{keyword}` takes no `:`")
        } else {
            format!("{what} is a string")
        };
        self.slip(
            span_of(&pair),
            &message,
            "not a string",
            format!("write `{keyword} {meant}`"),
            meant,
        );
        lit
    }

    fn mcp(&mut self, pair: Pair<'_, Rule>, docs: Vec<String>) -> McpServer {
        let span = span_of(&pair);
        let mut inner = pair.into_inner();
        let name = self.declared(inner.next().expect("server name"));
        let mut server = McpServer {
            span,
            ..McpServer::named(docs, name)
        };
        let mut args_seen = None;
        for member in inner {
            if member.as_rule() == Rule::bad_member {
                self.recover(&member, Context::McpMember);
                server.recovered = true;
                continue;
            }
            let member = first_child(member);
            let member_span = span_of(&member);
            match member.as_rule() {
                Rule::command_member => {
                    let command = self.string(first_child(member));
                    self.once(&mut server.command, command, member_span, "command");
                }
                Rule::url_member => {
                    let url = self.string(first_child(member));
                    self.once(&mut server.url, url, member_span, "url");
                }
                Rule::args_member => {
                    let list = first_child(member);
                    let args: Vec<Expr> = list.into_inner().map(|e| self.expr(e)).collect();
                    self.once(&mut args_seen, (), member_span, "args");
                    server.args.extend(args);
                }
                Rule::env_member => {
                    let env = self.record_lit(first_child(member));
                    self.once(&mut server.env, env, member_span, "env");
                }
                _ => {}
            }
        }
        server
    }

    fn workflow(&mut self, pair: Pair<'_, Rule>, docs: Vec<String>) -> Workflow {
        let span = span_of(&pair);
        let mut inner = pair.into_inner().peekable();
        let workflow_name = self.declared(inner.next().expect("workflow name"));
        let params = inner
            .next_if(|part| part.as_rule() == Rule::params_slip)
            .map(|slip| self.params_slip(slip));
        let mut workflow = Workflow {
            docs,
            name: workflow_name,
            input: None,
            timeout: None,
            context: Vec::new(),
            department: None,
            durability: None,
            on_error: None,
            destinations: Vec::new(),
            body: Vec::new(),
            output: None,
            span,
        };
        let mut output_at: Option<Span> = None;
        for part in inner {
            // The output comes after the last statement: one before a
            // statement is read, and said once. The end of a file that
            // leaves the workflow open (`cut_off`) is no statement.
            if let Some(output) = output_at.take()
                && !matches!(part.as_rule(), Rule::workflow_output | Rule::cut_off)
            {
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        output,
                        "the workflow's `output` comes after its last statement",
                    )
                    .label("statements follow it")
                    .secondary(self.file, span_of(&part), "this comes after the output")
                    .hint("move `output { ... }` to the end of the workflow"),
                );
            }
            match part.as_rule() {
                Rule::workflow_setting => {
                    // After a statement, a setting is out of place (but
                    // read); after lines that did not parse, it is not.
                    if !workflow.body.is_empty() {
                        self.problems.push(
                            Diagnostic::new(
                                Code::Syntax,
                                self.file,
                                span_of(&part),
                                SETTING_AFTER_STATEMENT,
                            )
                            .label("this setting comes after a statement")
                            .hint(SETTINGS_FIRST),
                        );
                    }
                    let setting = first_child(part);
                    let setting_span = span_of(&setting);
                    match setting.as_rule() {
                        Rule::input_member => {
                            let input = self.record_type_decl(setting);
                            self.once(&mut workflow.input, input, setting_span, "input");
                        }
                        Rule::timeout_setting => {
                            let timeout = self.duration_value(first_child(setting));
                            self.once(&mut workflow.timeout, timeout, setting_span, "timeout");
                        }
                        Rule::context_member => {
                            let context: Vec<StringLit> =
                                setting.into_inner().map(|s| self.string(s)).collect();
                            workflow.context.extend(context);
                        }
                        Rule::department_setting => {
                            let department = self.string(first_child(setting));
                            self.once(
                                &mut workflow.department,
                                department,
                                setting_span,
                                "department",
                            );
                        }
                        Rule::durability_setting => {
                            let mode = name(first_child(setting));
                            self.once(&mut workflow.durability, mode, setting_span, "durability");
                        }
                        Rule::on_error_setting => {
                            let policy = self.error_policy(first_child(setting));
                            self.once(&mut workflow.on_error, policy, setting_span, "on_error");
                        }
                        Rule::deliver_setting => {
                            let destination = self.destination(setting);
                            workflow.destinations.push(destination);
                        }
                        _ => {}
                    }
                }
                Rule::statement => {
                    if let Some(stmt) = self.statement(part) {
                        workflow.body.push(stmt);
                    }
                }
                Rule::stepless_stmt => workflow.body.extend(self.stepless_stmt(part)),
                Rule::bad_block_stmt => {
                    let context = if workflow.body.is_empty() {
                        Context::WorkflowHead
                    } else {
                        Context::WorkflowBody
                    };
                    workflow.body.extend(self.bad_block_stmt(part, context));
                }
                Rule::bad_stmt => {
                    let context = if workflow.body.is_empty() {
                        Context::WorkflowHead
                    } else {
                        Context::WorkflowBody
                    };
                    self.recover(&part, context);
                    workflow.body.extend(broken_steps(&part));
                }
                Rule::nested_item_slip => {
                    let decl = first_child(part.clone());
                    let keyword = decl.as_str().split_whitespace().next().unwrap_or("");
                    let at = decl.as_span().start();
                    self.problems.push(
                        Diagnostic::new(
                            Code::Syntax,
                            self.file,
                            Span::new(at, at + keyword.len()),
                            format!("`{keyword}` is declared at the top level of a file, not inside a workflow"),
                        )
                        .label("inside a workflow")
                        .hint(format!("move it out of `workflow {}`, before or after it", workflow.name.text)),
                    );
                    if let Some(item) = self.item(part) {
                        self.hoisted.push(item);
                    }
                }
                Rule::workflow_output => {
                    let at = span_of(&part);
                    output_at = Some(Span::new(
                        at.start as usize,
                        at.start as usize + "output".len(),
                    ));
                    let output = self.record_lit(first_child(part));
                    self.once(&mut workflow.output, output, at, "output");
                }
                _ => {}
            }
        }
        if let Some(params) = params
            && let Some(input) = self.report_params(params, "workflow", &workflow.input)
        {
            workflow.input = Some(input);
        }
        workflow
    }

    /// Reads parameters written after a declaration's name, as other
    /// languages declare them (`workflow triage(text: string) {`): the
    /// input they declare when they are fields. Reported by
    /// [`Self::report_params`] once the body says whether it declares an
    /// input of its own.
    fn params_slip(&mut self, slip: Pair<'_, Rule>) -> Params {
        let span = span_of(&slip);
        let end = span.end as usize;
        // The `{` that opens the body: only blanks and comments come between.
        let body_at = end + self.source[end..].find('{').unwrap_or(0) + 1;
        let fields = slip
            .into_inner()
            .find(|part| part.as_rule() == Rule::params_input)
            .map(|fields| {
                let fields_span = span_of(&fields);
                let (fields, text) = match fields.clone().into_inner().next() {
                    Some(record) if record.as_rule() == Rule::record_type => {
                        let text = record.as_str().to_string();
                        (self.fields(record), text)
                    }
                    _ => {
                        let listed = fields
                            .as_str()
                            .trim_end_matches([',', ' ', '\t', '\n', '\r']);
                        (self.fields(fields), format!("{{ {listed} }}"))
                    }
                };
                let record = RecordTypeDecl {
                    span: fields_span,
                    fields,
                };
                (record, text)
            });
        Params {
            span,
            body_at,
            fields,
        }
    }

    /// Reports `params` of a `what` (a workflow, a recipe) whose body
    /// declares `input` or not; the input they stand for when it does not.
    fn report_params(
        &mut self,
        params: Params,
        what: &str,
        input: &Option<RecordTypeDecl>,
    ) -> Option<RecordTypeDecl> {
        let remove = Edit {
            span: params.span,
            text: String::new(),
        };
        let diagnostic = Diagnostic::new(
            Code::Syntax,
            self.file,
            params.span,
            format!("a {what} takes no parameters"),
        )
        .label("parameters in parentheses");
        let (diagnostic, input) = match (params.fields, input) {
            (Some((record, text)), None) => {
                let declared = format!("input {text}");
                let diagnostic = diagnostic
                    .hint(format!(
                        "declare them first inside its braces: `{declared}`"
                    ))
                    .fix_with(
                        "Declare the parameters as the input",
                        vec![
                            remove,
                            Edit::insert(params.body_at as u32, format!("\n  {declared}")),
                        ],
                    );
                (diagnostic, Some(record))
            }
            (Some(_), Some(_)) => {
                let diagnostic = diagnostic
                    .hint("its input is the `input { ... }` inside its braces: declare these fields there");
                (diagnostic, None)
            }
            (None, _) => {
                let diagnostic = diagnostic
                    .hint(format!(
                        "a {what}'s input is declared inside its braces: `input {{ name: type }}`"
                    ))
                    .fix_with("Remove the parentheses", vec![remove]);
                (diagnostic, None)
            }
        };
        self.problems.push(diagnostic);
        input
    }

    /// `deliver on EVENTS to TARGET`.
    fn destination(&mut self, pair: Pair<'_, Rule>) -> Destination {
        let span = span_of(&pair);
        let mut events = Vec::new();
        let mut target = None;
        for part in pair.into_inner() {
            match part.as_rule() {
                Rule::ident => events.push(name(part)),
                Rule::deliver_webhook => {
                    target = Some(DestinationTarget::Webhook {
                        endpoint: self.string(first_child(part)),
                    });
                }
                Rule::deliver_email => {
                    let mut strings: Vec<StringLit> =
                        part.into_inner().map(|s| self.string(s)).collect();
                    let body = strings.pop().expect("an email's body");
                    let subject = strings.pop().expect("an email's subject");
                    target = Some(DestinationTarget::Email {
                        to: strings,
                        subject,
                        body,
                    });
                }
                Rule::deliver_kb => {
                    let mut inner = part.into_inner();
                    let collection = self.string(inner.next().expect("a collection"));
                    let title = self.string(inner.next().expect("a title"));
                    let content = self.expr(inner.next().expect("a content"));
                    target = Some(DestinationTarget::Kb {
                        collection,
                        title,
                        content,
                    });
                }
                _ => {}
            }
        }
        Destination {
            events,
            target: target.expect("the grammar requires a target"),
            span,
        }
    }

    // ------------------------------------------------------------ statements

    fn block(&mut self, pair: Pair<'_, Rule>) -> Block {
        let span = span_of(&pair);
        let mut stmts = Vec::new();
        for part in pair.into_inner() {
            match part.as_rule() {
                Rule::statement => stmts.extend(self.statement(part)),
                Rule::stepless_stmt => stmts.extend(self.stepless_stmt(part)),
                Rule::bad_block_stmt => stmts.extend(self.bad_block_stmt(part, Context::Block)),
                Rule::bad_stmt => {
                    self.recover(&part, Context::Block);
                    stmts.extend(broken_steps(&part));
                }
                _ => {}
            }
        }
        Block { stmts, span }
    }

    fn statement(&mut self, pair: Pair<'_, Rule>) -> Option<Stmt> {
        let docs = docs(&pair);
        let stmt = first_child(pair);
        let span = span_of(&stmt);
        Some(match stmt.as_rule() {
            Rule::step_stmt => return self.step_stmt(stmt, docs),
            Rule::if_stmt => {
                let mut inner = stmt.into_inner();
                let condition = self.expr(inner.next()?);
                let block = self.block(inner.next()?);
                self.if_stmt((condition, block), inner, span)?
            }
            Rule::for_stmt => {
                let mut inner = stmt.into_inner().peekable();
                let (collection, id, names_item) = match inner
                    .next_if(|p| matches!(p.as_rule(), Rule::for_in_slip | Rule::for_unnamed_slip))
                {
                    Some(slip) if slip.as_rule() == Rule::for_in_slip => {
                        let (collection, id) = self.for_in(slip)?;
                        (collection, id, true)
                    }
                    Some(slip) => {
                        let (collection, id) = self.for_unnamed(slip)?;
                        (collection, id, false)
                    }
                    None => {
                        let collection = self.expr(inner.next()?);
                        (collection, self.declared(inner.next()?), false)
                    }
                };
                let mut concurrency = None;
                let mut max_items = None;
                let mut body = None;
                for part in inner {
                    match part.as_rule() {
                        Rule::concurrency | Rule::max_items => {
                            let rule = part.as_rule();
                            let int = first_child(part);
                            let int_span = span_of(&int);
                            let value = Some((self.int(int, 1), int_span));
                            if rule == Rule::concurrency {
                                concurrency = value;
                            } else {
                                max_items = value;
                            }
                        }
                        _ => body = Some(self.block(part)),
                    }
                }
                Stmt::For(Box::new(ForStmt {
                    collection,
                    id,
                    concurrency,
                    max_items,
                    body: body?,
                    span,
                    names_item,
                }))
            }
            Rule::parallel_stmt => {
                let mut inner = stmt.into_inner();
                let id = self.declared(inner.next()?);
                let mut branches = Vec::new();
                let mut recovered = false;
                let mut broken = Vec::new();
                let mut outside_branches = false;
                for part in inner {
                    match part.as_rule() {
                        Rule::branch => {
                            let branch_span = span_of(&part);
                            let mut parts = part.into_inner();
                            let name = self.declared(parts.next()?);
                            let body = self.block(parts.next()?);
                            branches.push(Branch {
                                name,
                                body,
                                span: branch_span,
                            });
                        }
                        Rule::bad_branch => {
                            recovered = true;
                            let branch_span = span_of(&part);
                            let mut parts = part.into_inner();
                            let header = parts.next()?;
                            self.recover(&header, Context::Parallel);
                            let body = self.block(parts.next()?);
                            match branch_name(&header) {
                                Some(name) => branches.push(Branch {
                                    name,
                                    body,
                                    span: branch_span,
                                }),
                                None => broken.extend(body.stmts),
                            }
                        }
                        // Reported with the file's other open braces.
                        Rule::cut_off => {}
                        _ => {
                            recovered = true;
                            // Statements written straight in the block are
                            // one mistake, said once: the branches are missing.
                            let statement = FlowParser::parse(Rule::statement, part.as_str())
                                .is_ok_and(|pairs| pairs.as_str() == part.as_str().trim_end());
                            if !(statement && outside_branches) {
                                self.recover(&part, Context::Parallel);
                            }
                            outside_branches |= statement;
                            broken.extend(broken_steps(&part));
                        }
                    }
                }
                Stmt::Parallel(Box::new(ParallelStmt {
                    id,
                    branches,
                    recovered,
                    broken,
                    span,
                }))
            }
            _ => return None,
        })
    }

    /// A block statement whose header does not parse: the header is
    /// reported, and the block read as the statement's body, so that it is
    /// checked. A `for` with `as ID` stays a loop of that id over a list of
    /// unknown items, so that `loop_item` in its body is not reported again;
    /// a header of another language's block word (`while`, `unless`) is
    /// read as an `if` of an unknown condition; one of a word flow knows
    /// nothing of (`try {`, `switch x {`) leaves its block's statements in
    /// place, as if it were not there, so that a step used after it is
    /// not said to maybe not have run.
    fn bad_block_stmt(&mut self, pair: Pair<'_, Rule>, context: Context) -> Vec<Stmt> {
        /// The words of `block_word_slip` in the grammar.
        const BLOCK_WORDS: &[&str] = &[
            "if", "foreach", "for", "while", "elseif", "elsif", "else", "elif", "loop", "unless",
        ];
        let span = span_of(&pair);
        let mut inner = pair.into_inner();
        let Some(header) = inner.next() else {
            return Vec::new();
        };
        let text = header.as_str();
        let word = &text[..cursor::name_len(text)];
        if BLOCK_WORDS.contains(&word) || text.starts_with("for") {
            return self
                .block_word_stmt(header, inner, span, context)
                .into_iter()
                .collect();
        }
        self.recover(&header, context);
        let mut stmts = Vec::new();
        // Its block, and those of an `else if` or `else` after it.
        for part in inner {
            let block = match part.as_rule() {
                Rule::block => Some(part),
                _ => part.into_inner().find(|p| p.as_rule() == Rule::block),
            };
            if let Some(block) = block {
                stmts.extend(self.block(block).stmts);
            }
        }
        stmts
    }

    /// `bad_block_stmt` of a block word: a loop or an `if`.
    fn block_word_stmt<'i>(
        &mut self,
        header: Pair<'i, Rule>,
        mut inner: impl Iterator<Item = Pair<'i, Rule>>,
        span: Span,
        context: Context,
    ) -> Option<Stmt> {
        self.recover(&header, context);
        let unknown = Expr {
            kind: ExprKind::Error,
            span: span_of(&header),
        };
        let block = self.block(inner.next()?);
        let text = header.as_str();
        let loop_id = text
            .starts_with("for")
            .then(|| text.rfind(" as "))
            .flatten()
            .and_then(|at| {
                let rest = &text[at + 4..];
                let skipped = rest.len() - rest.trim_start().len();
                let len = cursor::name_len(&rest[skipped..]);
                let start = header.as_span().start() + at + 4 + skipped;
                (len > 0).then(|| Name {
                    text: rest[skipped..skipped + len].into(),
                    span: Span::new(start, start + len),
                })
            });
        if let Some(id) = loop_id {
            return Some(Stmt::For(Box::new(ForStmt {
                collection: unknown,
                id,
                concurrency: None,
                max_items: None,
                body: block,
                span,
                names_item: false,
            })));
        }
        self.if_stmt((unknown, block), inner, span)
    }

    /// An `if` statement of its first branch and the `else if`s and `else`
    /// that follow it.
    fn if_stmt<'i>(
        &mut self,
        first: (Expr, Block),
        rest: impl Iterator<Item = Pair<'i, Rule>>,
        span: Span,
    ) -> Option<Stmt> {
        let mut branches = vec![first];
        let mut else_block = None;
        for part in rest {
            match part.as_rule() {
                Rule::else_if => {
                    let mut parts = part.into_inner().peekable();
                    if let Some(elif) = parts.next_if(|p| p.as_rule() == Rule::elif_slip) {
                        self.slip(
                            span_of(&elif),
                            "flow writes `else if`",
                            "not a keyword",
                            "write `else if`".to_string(),
                            "else if".to_string(),
                        );
                    }
                    let condition = self.expr(parts.next()?);
                    let block = self.block(parts.next()?);
                    branches.push((condition, block));
                }
                _ => else_block = Some(self.block(first_child(part))),
            }
        }
        Some(Stmt::If(Box::new(IfStmt {
            branches,
            else_block,
            span,
        })))
    }

    /// A `step_stmt`, or a `stepless_stmt` whose children are the same but
    /// for the doc comments that lead it.
    fn step_stmt(&mut self, stmt: Pair<'_, Rule>, docs: Vec<String>) -> Option<Stmt> {
        self.step_named(stmt, docs, None)
    }

    /// `step_stmt`, with `id` standing in for the one written when given.
    fn step_named(
        &mut self,
        stmt: Pair<'_, Rule>,
        docs: Vec<String>,
        id: Option<Name>,
    ) -> Option<Stmt> {
        let span = span_of(&stmt);
        let mut inner = children(stmt).filter(|p| p.as_rule() != Rule::declare_slip);
        let written = inner.next()?;
        let id = match id {
            Some(id) => id,
            None => self.declared(written),
        };
        let call = self.step_call(inner.next()?);
        let mut options = StepOptions::default();
        for option in inner {
            self.step_option(option, &mut options);
        }
        Some(Stmt::Step(Box::new(Step {
            docs: docs.into(),
            id,
            call,
            options,
            span,
        })))
    }

    /// A step written without `step`: said, then read as the step meant.
    fn stepless_stmt(&mut self, stmt: Pair<'_, Rule>) -> Option<Stmt> {
        let docs = docs(&stmt);
        let id = children(stmt.clone()).next()?;
        // `step = call`: the keyword is there and the id is not. Said once
        // (it read as a step named `step` missing its keyword, and then as a
        // keyword used as a name), and the step read with the empty name,
        // which no reference matches and no duplicate check counts.
        if id.as_rule() == Rule::ident && id.as_str() == "step" {
            let at = span_of(&id);
            self.problems.push(
                Diagnostic::new(Code::Syntax, self.file, at, "this step has no id")
                    .label("an id goes between `step` and `=`")
                    .hint("write `step NAME = ...`: the id names the step's record, and references read it as `step.NAME`"),
            );
            let missing = Name {
                text: "".into(),
                span: Span {
                    start: at.end,
                    end: at.end,
                },
            };
            return self.step_named(stmt, docs, Some(missing));
        }
        if id.as_rule() == Rule::declare_slip {
            let id = children(stmt.clone()).nth(1)?;
            self.slip(
                span_of(&children(stmt.clone()).next()?),
                "a step is declared with the keyword `step`",
                "not a flow keyword",
                format!("write `step {} = ...`", id.as_str()),
                "step".to_string(),
            );
        } else {
            let meant = format!("step {}", id.as_str());
            self.slip(
                span_of(&id),
                "a step starts with the keyword `step`",
                "`step` is missing",
                format!("write `{meant} = ...`"),
                meant,
            );
        }
        self.step_stmt(stmt, docs)
    }

    /// `for x in list`: said, then read as `for list as x`, so that the body
    /// is checked (where `x` is reported with the way to the item).
    fn for_in(&mut self, slip: Pair<'_, Rule>) -> Option<(Expr, Name)> {
        let span = span_of(&slip);
        let mut inner = slip.into_inner();
        let id = self.declared(inner.next()?);
        let _in = inner.next()?;
        let collection = inner.next()?;
        let written = collection.as_str().trim_end().to_string();
        let collection = self.expr(collection);
        let meant = format!("{written} as {}", id.text);
        self.slip(
            span,
            "a loop is written `for COLLECTION as ID`",
            "not a flow loop",
            format!(
                "write `for {meant}`: `{}` then names the loop, and its current item is `loop_item`",
                id.text
            ),
            meant,
        );
        Some((collection, id))
    }

    /// `for COLLECTION {`, the loop's name left out: reported, and the loop
    /// read with a name no one can write (`as@OFFSET`), so that its
    /// body is checked as a loop's (`loop_item` in it) rather than
    /// skipped, which reported each use of `loop_item` and each step
    /// after it as well.
    fn for_unnamed(&mut self, slip: Pair<'_, Rule>) -> Option<(Expr, Name)> {
        let span = span_of(&slip);
        let collection = first_child(slip);
        let written = collection.as_str().trim_end().to_string();
        let collection = self.expr(collection);
        self.slip(
            span,
            "a loop is written `for COLLECTION as ID`",
            "the loop has no name",
            format!(
                "write `for {written} as each`: `each` then names the loop, and its current item is `loop_item`"
            ),
            format!("{written} as each"),
        );
        // Its offset makes it unique, so that two such loops are not also
        // reported as one id used twice.
        let id = Name {
            text: format!("as@{}", span.start).into(),
            span: Span {
                start: span.end,
                end: span.end,
            },
        };
        Some((collection, id))
    }

    /// Reports a slip from another language (see the end of flow.pest): an
    /// E001 at `span`, with the form meant as a hint and, as the fix,
    /// `replacement` for the span.
    fn slip(&mut self, span: Span, message: &str, label: &str, hint: String, replacement: String) {
        self.problems.push(
            Diagnostic::new(Code::Syntax, self.file, span, message)
                .label(label)
                .hint(hint)
                .fix(replacement),
        );
    }

    fn step_call(&mut self, call: Pair<'_, Rule>) -> StepCall {
        let rule = call.as_rule();
        let keyword = Span::new(call.as_span().start(), call.as_span().start() + 8);
        let mut inner = call.into_inner();
        let mut next = || inner.next().expect("the grammar fixes the call's parts");
        match rule {
            Rule::approval_call => StepCall::Approval {
                keyword,
                args: self.record_lit(next()),
            },
            Rule::kb_write_call => {
                let collection = self.string_after(next(), "kb_write", "a collection");
                StepCall::KbWrite {
                    collection: Box::new(collection),
                    args: self.record_lit(next()),
                }
            }
            Rule::handoff_call => {
                let department = self.string_after(next(), "handoff", "a department");
                StepCall::Handoff {
                    department: Box::new(department),
                    args: self.record_lit(next()),
                }
            }
            Rule::browser_call => {
                let server = name(next());
                let tool = name(next());
                StepCall::Browser {
                    server: Box::new(server),
                    tool: Box::new(tool),
                    args: self.record_lit(next()),
                }
            }
            _ => {
                let recipe = name(next());
                StepCall::Recipe {
                    recipe,
                    args: self.record_lit(next()),
                }
            }
        }
    }

    fn step_option(&mut self, pair: Pair<'_, Rule>, options: &mut StepOptions) {
        let option = first_child(pair);
        let span = span_of(&option);
        match option.as_rule() {
            Rule::retry_option => {
                let mut inner = option.into_inner();
                let attempts_pair = inner.next().expect("retry count");
                let attempts_span = span_of(&attempts_pair);
                let attempts = self.int(attempts_pair, 1);
                let mut durations = Vec::new();
                for part in inner {
                    if part.as_rule() == Rule::range_slip {
                        self.slip(
                            span_of(&part),
                            "a backoff range is written `MIN..MAX`",
                            "not a range",
                            "write the range with `..`, as in `backoff 2s..30s`".to_string(),
                            "..".to_string(),
                        );
                    } else {
                        durations.push(part);
                    }
                }
                let mut inner = durations.into_iter();
                let backoff = match (inner.next(), inner.next()) {
                    (Some(min), Some(max)) => {
                        Some((self.duration_value(min), self.duration_value(max)))
                    }
                    _ => None,
                };
                let retry = Retry {
                    attempts,
                    attempts_span,
                    backoff,
                };
                self.once(&mut options.retry, retry, span, "retry");
            }
            Rule::timeout_option => {
                let timeout = self.duration_value(first_child(option));
                self.once(&mut options.timeout, timeout, span, "timeout");
            }
            Rule::on_error_option => {
                let policy = self.error_policy(first_child(option));
                self.once(&mut options.on_error, Box::new(policy), span, "on_error");
            }
            Rule::idempotency_option => {
                let key = self.expr(first_child(option));
                self.once(&mut options.idempotency, Box::new(key), span, "idempotency");
            }
            _ => {}
        }
    }

    fn error_policy(&mut self, policy: Pair<'_, Rule>) -> ErrorPolicy {
        let span = span_of(&policy);
        match policy.as_rule() {
            Rule::fallback_policy => {
                ErrorPolicy::Fallback(Box::new(self.block(first_child(policy))))
            }
            _ if policy.as_str().starts_with("continue") => ErrorPolicy::Continue(span),
            _ => ErrorPolicy::Fail(span),
        }
    }

    /// A duration; one with a fraction (`1.5m`) is reported with the whole
    /// amount of a smaller unit that it means (`90s`), and read as that.
    fn duration_value(&mut self, inner: Pair<'_, Rule>) -> DurationLit {
        let text = inner.as_str();
        let span = span_of(&inner);
        if is_foreign_number(text) {
            self.problems
                .push(foreign_number_diagnostic(text, span, self.file));
            return duration_lit(text, span);
        }
        // `1h30m`, as Go writes durations, and `1.5m`: one whole amount of
        // one unit is meant, said with it when every unit is known; else
        // the checker says what is wrong with the first amount and unit.
        let (meant, why) = if let Some(parts) = units_in_a_row(text) {
            let total = parts.iter().try_fold(0u64, |total, (amount, unit)| {
                let amount: u64 = amount.parse().ok()?;
                total.checked_add(amount.checked_mul(unit_ms(unit)?)?)
            });
            let Some(ms) = total.filter(|ms| *ms > 0) else {
                let (amount, unit) = parts[0];
                return self.duration(&format!("{amount}{unit}"), span);
            };
            (
                ms,
                ("a duration is one number and one unit", "several units"),
            )
        } else {
            let Some((whole, rest)) = text.split_once('.') else {
                return self.duration(text, span);
            };
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (fraction, unit) = rest.split_at(digits);
            // Exact in integers: 1.5m is 15 times 60000 ms, over 10.
            let meant = unit_ms(unit).and_then(|per| {
                let scale = 10u64.checked_pow(u32::try_from(digits).ok()?)?;
                let scaled: u64 = format!("{whole}{fraction}").parse().ok()?;
                let ms = scaled.checked_mul(per)?;
                (ms.is_multiple_of(scale) && ms > 0).then(|| ms / scale)
            });
            let Some(ms) = meant else {
                // An unknown unit or less than a millisecond.
                return self.duration(&format!("{whole}{unit}"), span);
            };
            (
                ms,
                ("a duration is a whole number of a unit", "has a fraction"),
            )
        };
        let written = flow_plan::written::duration(meant);
        self.problems.push(
            Diagnostic::new(
                Code::BadDuration,
                self.file,
                span,
                format!("{}, and `{text}` is not", why.0),
            )
            .label(why.1)
            .hint(format!("write `{written}`"))
            .fix(written.clone()),
        );
        self.duration(&written, span)
    }

    /// The duration `text` writes, at `span`; a unit flow does not know is
    /// reported here, where its text is.
    fn duration(&mut self, text: &str, span: Span) -> DurationLit {
        let duration = duration_lit(text, span);
        if duration.unit() == DurationUnit::Unknown {
            self.problems.push(unknown_unit(text, span, self.file));
        }
        duration
    }

    // ------------------------------------------------------------ expressions

    fn record_lit(&mut self, pair: Pair<'_, Rule>) -> RecordLit {
        let span = span_of(&pair);
        let fields = pair
            .into_inner()
            .map(|field| {
                let mut inner = field.into_inner();
                let name = name(inner.next().expect("field name"));
                let value = self.expr(inner.next().expect("field value"));
                RecordField { name, value }
            })
            .collect();
        RecordLit { fields, span }
    }

    fn string(&mut self, pair: Pair<'_, Rule>) -> StringLit {
        self.string_at(pair.as_str(), pair.as_span().start())
    }

    fn string_at(&mut self, raw: &str, offset: usize) -> StringLit {
        parse_string(raw, offset, self.file, &mut self.problems)
    }

    fn expr(&mut self, pair: Pair<'_, Rule>) -> Expr {
        let span = span_of(&pair);
        // The grammar gives a flat list, but the tree a chain of operators
        // builds is as deep as the chain, and every later pass recurses on it.
        let operators_in_chain = pair
            .clone()
            .into_inner()
            .filter(|p| p.as_rule() == Rule::infix)
            .count();
        if operators_in_chain > MAX_DEPTH {
            self.problems.push(
                Diagnostic::new(
                    Code::TooDeep,
                    self.file,
                    span,
                    format!("more than {MAX_DEPTH} operators in one expression"),
                )
                .label("this expression")
                .hint("split the condition into steps, or simplify it"),
            );
            return Expr {
                kind: ExprKind::Error,
                span,
            };
        }
        if pair
            .clone()
            .into_inner()
            .any(|p| p.as_rule() == Rule::infix && p.as_str() == "+")
        {
            return self.plus(pair);
        }
        // Operator precedence by shunting-yard over the flat operand/operator
        // list the grammar gives, so that long chains do not recurse here.
        let mut operands: Vec<Expr> = Vec::new();
        let mut operators: Vec<BinaryOp> = Vec::new();
        let mut nots: Vec<Span> = Vec::new();
        for part in pair.into_inner() {
            match part.as_rule() {
                Rule::prefix => nots.push(span_of(&part)),
                Rule::infix => {
                    if part.as_str() == "=" {
                        self.slip(
                            span_of(&part),
                            "`=` is not a comparison",
                            "compares nothing",
                            "write `==` to compare two values".to_string(),
                            "==".to_string(),
                        );
                    }
                    let op = match part.as_str() {
                        "??" => BinaryOp::Coalesce,
                        "==" | "=" => BinaryOp::Eq,
                        "||" => BinaryOp::Or,
                        "&&" => BinaryOp::And,
                        "!=" => BinaryOp::Ne,
                        "<=" => BinaryOp::Le,
                        ">=" => BinaryOp::Ge,
                        "<" => BinaryOp::Lt,
                        _ => BinaryOp::Gt,
                    };
                    while operators
                        .last()
                        .is_some_and(|top| top.precedence() >= op.precedence())
                    {
                        reduce(&mut operands, &mut operators);
                    }
                    operators.push(op);
                }
                _ => {
                    let mut operand = self.primary(part);
                    // `!` chains are flat in the grammar, so the bracket scan
                    // does not bound them; later passes recurse once per `!`.
                    if nots.len() > MAX_DEPTH {
                        self.too_deep(operand.span);
                        nots.clear();
                    }
                    while let Some(not) = nots.pop() {
                        operand = Expr {
                            span: not.to(operand.span),
                            kind: ExprKind::Not(Box::new(operand)),
                        };
                    }
                    operands.push(operand);
                }
            }
        }
        while !operators.is_empty() {
            reduce(&mut operands, &mut operators);
        }
        operands.pop().unwrap_or(Expr {
            kind: ExprKind::Error,
            span,
        })
    }

    /// An expression with `+`, which flow does not have: text is built with
    /// a template. Said once for the expression, with the template meant
    /// when the operands are strings and references; the expression is then
    /// `any`, so that nothing else is reported of it.
    fn plus(&mut self, pair: Pair<'_, Rule>) -> Expr {
        let span = span_of(&pair);
        let mut template = String::new();
        let mut only_text = true;
        for part in pair.clone().into_inner() {
            match part.as_rule() {
                Rule::infix if part.as_str() == "+" => {}
                Rule::string => {
                    let raw = part.as_str();
                    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
                        Some(body) if !raw.starts_with("\"\"\"") => template.push_str(body),
                        _ => only_text = false,
                    }
                }
                Rule::path => template.push_str(&format!("{{{{{}}}}}", part.as_str())),
                _ => only_text = false,
            }
        }
        let plus = pair
            .into_inner()
            .find(|p| p.as_rule() == Rule::infix && p.as_str() == "+")
            .map_or(span, |p| span_of(&p));
        let mut diagnostic = Diagnostic::new(
            Code::Syntax,
            self.file,
            plus,
            "flow has no `+`: text is built with a template",
        )
        .label("not an operator in flow");
        diagnostic = if only_text {
            diagnostic
                .hint(format!("write `\"{template}\"`"))
                .secondary(self.file, span, "this expression")
                .fix_with(
                    "Build the text with a template",
                    vec![Edit {
                        span,
                        text: format!("\"{template}\""),
                    }],
                )
        } else {
            diagnostic.hint("put values in a string as `{{path}}`: `\"Total: {{step.sum.total}}\"`; arithmetic belongs in a recipe")
        };
        self.problems.push(diagnostic);
        Expr {
            kind: ExprKind::Error,
            span,
        }
    }

    fn primary(&mut self, inner: Pair<'_, Rule>) -> Expr {
        let span = span_of(&inner);
        let kind = match inner.as_rule() {
            Rule::duration => ExprKind::Duration(self.duration_value(inner)),
            Rule::float => ExprKind::Float(self.float(inner)),
            Rule::int => ExprKind::Int(self.int(inner, 0)),
            Rule::bool => ExprKind::Bool(inner.as_str() == "true"),
            Rule::null => ExprKind::Null,
            Rule::string => ExprKind::String(self.string(inner)),
            Rule::list_lit => ExprKind::List(inner.into_inner().map(|e| self.expr(e)).collect()),
            Rule::record_lit => ExprKind::Record(self.record_lit(inner)),
            Rule::path => ExprKind::Path(self.path(inner)),
            Rule::paren_expr => {
                // Labels on a parenthesised expression cover its parentheses.
                let mut expr = self.expr(first_child(inner));
                expr.span = span;
                return expr;
            }
            Rule::braces_slip => {
                let value = first_child(inner);
                let written = value.as_str().trim().to_string();
                self.slip(
                    span,
                    "`{{ }}` inserts a value into a string, and is not needed here",
                    "outside a string",
                    format!("write the value as `{written}`, or text as `\"{{{{{written}}}}}\"`"),
                    written,
                );
                return self.expr(value);
            }
            _ => ExprKind::Error,
        };
        Expr { kind, span }
    }

    fn path(&mut self, pair: Pair<'_, Rule>) -> Path {
        let mut inner = pair.into_inner();
        let root = name(inner.next().expect("path root"));
        let mut segments = Vec::new();
        for seg in inner {
            let seg_span = span_of(&seg);
            match seg.as_rule() {
                Rule::index_seg => {
                    let index = self.int(first_child(seg), 0);
                    if index < 0 {
                        self.problems.push(
                            Diagnostic::new(
                                Code::Syntax,
                                self.file,
                                seg_span,
                                "a list index is 0 or more",
                            )
                            .label("negative index")
                            .hint("indices count from 0, the first element"),
                        );
                    }
                    segments.push(Segment::Index {
                        index,
                        span: seg_span,
                    });
                }
                rule => segments.push(Segment::Field {
                    optional: rule == Rule::opt_field_seg,
                    name: name(first_child(seg)),
                }),
            }
        }
        Path {
            root,
            segments: super::exact(segments),
        }
    }
}

/// A recipe, MCP server or type whose declaration was skipped, as a
/// declaration of its name alone (a recipe or server marked recovered, a
/// type as `json`): what uses it is not told that it does not exist, nor
/// that it lacks what its skipped body holds.
fn skipped_declaration(region: &Pair<'_, Rule>) -> Option<Item> {
    let text = region.as_str();
    let base = region.as_span().start();
    let mut offset = 0;
    let decl = text.split_inclusive('\n').find_map(|line| {
        let trimmed = line.trim_start();
        let at = offset + line.len() - trimmed.len();
        offset += line.len();
        (!trimmed.trim_end().is_empty() && !trimmed.starts_with("//")).then_some((at, trimmed))
    });
    let (at, line) = decl?;
    let keyword = line.split([' ', '\t']).next()?;
    let rest = &line[keyword.len()..];
    let skipped = rest.len() - rest.trim_start_matches([' ', '\t']).len();
    let len = cursor::name_len(&rest[skipped..]);
    let start = base + at + keyword.len() + skipped;
    let name = Name {
        text: rest[skipped..skipped + len].into(),
        span: Span::new(start, start + len),
    };
    if len == 0 || KEYWORDS.contains(&name.text.as_str()) {
        return None;
    }
    let span = span_of(region);
    match keyword {
        "recipe" => Some(Item::Recipe(Recipe {
            recovered: true,
            span,
            ..Recipe::named(Vec::new(), name)
        })),
        "mcp" => Some(Item::Mcp(McpServer {
            recovered: true,
            span,
            ..McpServer::named(Vec::new(), name)
        })),
        // Its fields are unknown: `json` lets every use of them through.
        "type" => Some(Item::Type(TypeDecl {
            docs: Vec::new(),
            ty: unknown_type(name.span),
            name,
            span,
        })),
        _ => None,
    }
}

/// Call arguments (`text=x, n = 2`) as a record's fields: each `=` that
/// follows a name (not `==`, `<=`, `>=`, `!=`), outside strings, becomes
/// `:`. The first text keeps every offset (for the parse of the copy); the
/// second is as an author writes it (for the hint and the fix).
fn keyword_arguments(arguments: &str) -> (String, String) {
    let bytes = arguments.as_bytes();
    let mut in_string = false;
    let mut named = Vec::new();
    for (index, &byte) in bytes.iter().enumerate() {
        if byte == b'"' && (index == 0 || bytes[index - 1] != b'\\') {
            in_string = !in_string;
        } else if !in_string
            && byte == b'='
            && bytes.get(index + 1) != Some(&b'=')
            && index > 0
            && !matches!(bytes[index - 1], b'=' | b'<' | b'>' | b'!')
            && arguments[..index]
                .trim_end()
                .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            named.push(index);
        }
    }
    let mut fields = arguments.to_string();
    let mut shown = String::with_capacity(arguments.len() + named.len());
    let mut from = 0;
    for &at in &named {
        fields.replace_range(at..at + 1, ":");
        shown.push_str(arguments[from..at].trim_end());
        shown.push_str(": ");
        from = at + 1 + (arguments[at + 1..].len() - arguments[at + 1..].trim_start().len());
    }
    shown.push_str(&arguments[from..]);
    (fields, shown)
}

/// Where the parse of `text` with the first of `rules` that gets furthest
/// fails, and the words expected there.
fn furthest_failure(rules: &[Rule], text: &str) -> (usize, Vec<String>) {
    // pest finds the line of each error it builds by scanning from the end
    // of its input back to the failure, so parsing the rest of the file for
    // each of many slips in it was quadratic (2,000 broken lines took
    // seconds). The rules are parsed on the text up to a line's end, a
    // window that grows while the failure lies in its last line: before
    // that line no attempt reached the cut, and the whole text would fail
    // at the same place with the same expectations.
    let mut window = FIRST_WINDOW;
    loop {
        // A byte search: a `\n` is never inside a character of several.
        let end = match (text.as_bytes().get(window..))
            .and_then(|after| after.iter().position(|b| *b == b'\n'))
        {
            Some(newline) => window + newline + 1,
            None => text.len(),
        };
        let cut = &text[..end];
        let (found, parsed) = furthest_failure_in(rules, cut);
        let last_line = cut.as_bytes()[..cut.len().saturating_sub(1)]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |newline| newline + 1);
        // A rule that matched the window may not match the whole: a block
        // left open closes at the end of the input (`cut_off`).
        if end == text.len() || (!parsed && found.0 < last_line) {
            return found;
        }
        window = window.saturating_mul(4);
    }
}

/// The text `furthest_failure` first parses: a few statements' worth.
const FIRST_WINDOW: usize = 4096;

/// `furthest_failure` on the whole of `text`, and whether any of the
/// rules matched it.
fn furthest_failure_in(rules: &[Rule], text: &str) -> ((usize, Vec<String>), bool) {
    // pest collects which tokens it tried at the furthest position only when
    // error detail is on: on for this re-parse (another thread parsing
    // meanwhile only pays in speed).
    let _detail = ErrorDetail::on();
    let mut best: Option<(usize, Vec<String>)> = None;
    let mut parsed = false;
    for rule in rules {
        let Err(error) = FlowParser::parse(*rule, text) else {
            parsed = true;
            continue;
        };
        // pest's own position is that of the furthest failed *rule*;
        // the furthest failed token (a missing `=`, say) is further on,
        // and is where the reader should look.
        let at = match (error.parse_attempts(), &error.location) {
            (Some(attempts), _) => attempts.max_position,
            (None, pest::error::InputLocation::Pos(at)) => *at,
            (None, pest::error::InputLocation::Span((at, _))) => *at,
        };
        let expected = expected_words(&error);
        match &mut best {
            Some((best_at, words)) if *best_at == at => words.extend(expected),
            Some((best_at, _)) if *best_at > at => {}
            _ => best = Some((at, expected)),
        }
    }
    let (at, mut expected) = best.unwrap_or((0, Vec::new()));
    expected.sort();
    expected.dedup();
    // `=` and `+` are operators only as slips (see flow.pest), and `from`
    // starts an item only as one.
    if expected.iter().any(|w| w == "an operator") {
        expected.retain(|w| w != "`=`" && w != "`+`");
    }
    expected.retain(|w| w != "`from`");
    ((at, expected), parsed)
}

/// pest's error detail, on while any thread's `furthest_failure` runs. The
/// switch is process-wide: a re-parse that turned it off as it ended turned
/// it off under another thread's, whose message then changed from
/// "expected a string" to "unexpected" (the diagnostics fixtures, run on
/// several threads, caught it).
struct ErrorDetail;

/// How many re-parses want the detail now; the switch is set under it.
static DETAILED_PARSES: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

impl ErrorDetail {
    fn on() -> ErrorDetail {
        let mut parses = DETAILED_PARSES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *parses += 1;
        if *parses == 1 {
            pest::set_error_detail(true);
        }
        ErrorDetail
    }
}

impl Drop for ErrorDetail {
    fn drop(&mut self) {
        let mut parses = DETAILED_PARSES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *parses -= 1;
        if *parses == 0 {
            pest::set_error_detail(false);
        }
    }
}

/// The amounts and units of a duration written with several (`1h30m`),
/// or `None` for one of one unit.
fn units_in_a_row(text: &str) -> Option<Vec<(&str, &str)>> {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let letters = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || letters == 0 {
            return None;
        }
        parts.push((&rest[..digits], &rest[digits..digits + letters]));
        rest = &rest[digits + letters..];
    }
    (parts.len() > 1).then_some(parts)
}

/// The name a branch whose header did not parse was meant to have: the
/// last word of its header (`branch "billing"`, `brnach billing`), unless
/// that is a keyword.
fn branch_name(header: &Pair<'_, Rule>) -> Option<Name> {
    let text = header.as_str().trim_end();
    let word = text.trim_end_matches('"');
    let start = word
        .bytes()
        .rposition(|b| !cursor::is_name_byte(b))
        .map_or(0, |i| i + 1);
    let id = &word[start..];
    let starts_well = id
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !starts_well || KEYWORDS.contains(&id) {
        return None;
    }
    let at = header.as_span().start() + start;
    Some(Name {
        text: id.into(),
        span: Span::new(at, at + id.len()),
    })
}

/// The steps a skipped statement declares, each as a `StepCall::Broken`
/// step: a line of it that starts `step ID =`, and its first line when that
/// starts `ID =` (the `step` left out), `parallel ID` or `for ... as ID`.
/// Keeping their ids declared, with an unknown output, spares each later
/// reference to them a second error for the one mistake.
fn broken_steps(region: &Pair<'_, Rule>) -> Vec<Stmt> {
    let text = region.as_str();
    let base = region.as_span().start();
    let span = span_of(region);
    let mut steps = Vec::new();
    let mut line_start = 0;
    let mut first = true;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let at = line_start + (line.len() - trimmed.len());
        line_start += line.len();
        if trimmed.is_empty() || trimmed.starts_with("//") {
            continue;
        }
        let id = declared_id(trimmed, first);
        first = false;
        let Some((offset, id)) = id else { continue };
        if KEYWORDS.contains(&id) || cursor::scan(text, at).lexical != cursor::Lexical::Code {
            continue;
        }
        let start = base + at + offset;
        steps.push(Stmt::Step(Box::new(Step {
            docs: Box::default(),
            id: Name {
                text: id.into(),
                span: Span::new(start, start + id.len()),
            },
            call: StepCall::Broken {
                args: RecordLit {
                    fields: Vec::new(),
                    span,
                },
            },
            options: StepOptions::default(),
            span: Span::new(base + at, span.end as usize),
        })));
    }
    steps
}

/// The id that a statement's line declares, with its offset in the line:
/// `step ID =` on any line, and on the statement's first line also `ID =`,
/// `parallel ID` and `for ... as ID`.
fn declared_id<'l>(line: &'l str, first: bool) -> Option<(usize, &'l str)> {
    let word = |from: usize| -> Option<(usize, &'l str)> {
        let rest = &line[from..];
        let skipped = rest.len() - rest.trim_start_matches([' ', '\t']).len();
        let start = from + skipped;
        let len = cursor::name_len(&line[start..]);
        let starts_well = line[start..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        (len > 0 && starts_well).then(|| (start, &line[start..start + len]))
    };
    let assigned = |(start, id): (usize, &'l str)| -> Option<(usize, &'l str)> {
        let after = line[start + id.len()..].trim_start_matches([' ', '\t']);
        (after.starts_with('=') && !after.starts_with("==")).then_some((start, id))
    };
    let (start, head) = word(0)?;
    match head {
        // A line that starts `step ID` declares ID, whatever the slip after
        // it (`step c: recipe {`), unless ID is followed by a path's `.`.
        "step" if start + 4 < line.len() => {
            word(start + 4).filter(|(at, id)| !line[at + id.len()..].starts_with(['.', '?', '[']))
        }
        "parallel" if first => word(start + 8),
        "for" if first => {
            let header = &line[..line.find('{').unwrap_or(line.len())];
            let r#as = header.rfind(" as ")?;
            word(r#as + 4)
        }
        _ if first => assigned((start, head)),
        _ => None,
    }
}

/// The offset of a `{` that is likely never closed: it is left open at the end
/// of its line, and the next line that is not blank starts at the same or a
/// smaller indentation with something other than `}`. That is how a missing
/// `}` at the end of a one-line record looks; a multi-line record indents its
/// fields and is not suspected. When such a record is the last statement of
/// a block, the next line is the block's `}`: a `}` that starts a line less
/// indented than the line of the `{` it would close belongs to an outer
/// brace, and the one it would close is suspected. Returns the offset and
/// why, as a hint.
fn suspect_unclosed_brace(text: &str) -> Option<(usize, &'static str)> {
    let lines = lines_with_starts(text);
    let mut open: Vec<(usize, usize)> = Vec::new();
    let mut in_triple = false;
    for (index, (line_start, line)) in lines.iter().enumerate() {
        if !in_triple
            && line.trim_start().starts_with('}')
            && let Some(&(brace, opened_on)) = open.last()
            && indent(line) < indent(lines[opened_on].1)
        {
            return Some((
                brace,
                "a later `}` is indented as for an outer block, so `}` is probably missing at the end of this line",
            ));
        }
        for (i, brace) in code_braces(line, &mut in_triple) {
            if brace == b'{' {
                open.push((line_start + i, index));
            } else {
                open.pop();
            }
        }
        let Some(&(brace, opened_on)) = open.last() else {
            continue;
        };
        if opened_on != index || in_triple {
            continue;
        }
        // Comments say nothing of the structure.
        let next = lines[index + 1..].iter().find(|(_, l)| {
            let l = l.trim_start();
            !l.is_empty() && !l.starts_with("//")
        });
        if let Some((_, next)) = next
            && indent(next) <= indent(line)
            && !next.trim_start().starts_with('}')
        {
            return Some((
                brace,
                "the next line starts at the same indentation, so `}` is probably missing at the end of this line",
            ));
        }
    }
    None
}

/// The `{` of each block, workflow or `parallel` that was cut off (its
/// last part is `cut_off`: the end of the file, or the next workflow or
/// test), with where, in the order they open.
fn braces_cut_off(pairs: pest::iterators::Pairs<'_, Rule>) -> Vec<(usize, usize)> {
    let mut braces: Vec<(usize, usize)> = pairs
        .flatten()
        .filter(|pair| {
            matches!(
                pair.as_rule(),
                Rule::block | Rule::workflow_decl | Rule::parallel_stmt | Rule::test_decl
            )
        })
        .filter_map(|pair| {
            let cut = pair
                .clone()
                .into_inner()
                .last()
                .filter(|last| last.as_rule() == Rule::cut_off)?;
            // A block starts at its `{`; a workflow's, `parallel`'s or
            // test's is the first after its name (a test's, a string, may
            // hold one).
            let start = match pair.as_rule() {
                Rule::test_decl => pair.clone().into_inner().next()?.as_span().end(),
                _ => pair.as_span().start(),
            };
            let brace = start + pair.get_input()[start..].find('{')?;
            Some((brace, cut.as_span().start()))
        })
        .collect();
    braces.sort_unstable();
    braces
}

/// The type of what did not parse, at `span`: `json`, which lets every
/// use through rather than report each one.
fn unknown_type(span: Span) -> TypeExpr {
    TypeExpr {
        kind: TypeExprKind::Named(Name {
            text: "json".into(),
            span,
        }),
        span,
    }
}

/// The span of a number written with an exponent or in hexadecimal,
/// octal or binary (`1e5`, `2.5E-3`, `0x1F`), around or just before `at`.
fn foreign_number(source: &str, at: usize) -> Option<Span> {
    let part = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'_';
    let bytes = source.as_bytes();
    let mut start = at.min(bytes.len());
    while start > 0
        && (part(bytes[start - 1])
            || (bytes[start - 1] == b'-' && start > 1 && matches!(bytes[start - 2], b'e' | b'E')))
    {
        start -= 1;
    }
    let mut end = at.min(bytes.len());
    while end < bytes.len()
        && (part(bytes[end])
            || (bytes[end] == b'-' && end > 0 && matches!(bytes[end - 1], b'e' | b'E')))
    {
        end += 1;
    }
    let word = &source[start..end];
    let digits_then = |rest: &str| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit());
    let radix = ["0x", "0X", "0o", "0O", "0b", "0B"].iter().any(|prefix| {
        word.strip_prefix(prefix)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    let exponent = word.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && word
            .split_once(['e', 'E'])
            .is_some_and(|(mantissa, power)| {
                mantissa.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                    && digits_then(power.strip_prefix(['-', '+']).unwrap_or(power))
            });
    (radix || exponent).then(|| Span::new(start, end))
}

/// Whether all of `text` is a number of another language (`0x1F` reads as
/// a duration of unit `x`).
fn is_foreign_number(text: &str) -> bool {
    foreign_number(text, text.len()).is_some_and(|whole| whole == Span::new(0, text.len()))
}

/// The problem with `text`, a number of another language at `span`.
fn foreign_number_diagnostic(text: &str, span: Span, file: FileId) -> Diagnostic {
    Diagnostic::new(
        Code::Syntax,
        file,
        span,
        format!("flow writes numbers in decimal digits, not `{text}`"),
    )
    .label("not a flow number")
    .hint("write the digits: `100000` for `1e5`, `1500.0` for `1.5e3`, `16` for `0x10`")
}

/// How far `line` is indented, in spaces and tabs.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches([' ', '\t']).len()
}

/// The lines of `text` (split at `\n`), each with the offset it starts at.
fn lines_with_starts(text: &str) -> Vec<(usize, &str)> {
    text.split('\n')
        .scan(0, |start, line| {
            let at = *start;
            *start += line.len() + 1;
            Some((at, line))
        })
        .collect()
}

/// The block braces the layout shows were left open: each `{` that ends
/// its line and whose lines under it end at a line back at its indentation
/// that is not its `}`, in the order they open, with where that line
/// starts and the indentation of the `{`'s line.
fn unclosed_by_layout(text: &str) -> Vec<(usize, usize, &str)> {
    let lines = lines_with_starts(text);
    let mut unclosed = Vec::new();
    let mut in_triple = false;
    for (index, (line_start, line)) in lines.iter().enumerate() {
        let braces = code_braces(line, &mut in_triple);
        let Some(&(at, b'{')) = braces.last() else {
            continue;
        };
        let rest = &line[at + 1..];
        let ends_line = rest.trim().is_empty() || rest.trim_start().starts_with("//");
        if in_triple || !ends_line {
            continue;
        }
        let back = lines[index + 1..].iter().find(|(_, next)| {
            let code = next.trim();
            !code.is_empty() && !code.starts_with("//") && indent(next) <= indent(line)
        });
        if let Some((back_start, back)) = back
            && !back.trim_start().starts_with('}')
        {
            unclosed.push((line_start + at, *back_start, &line[..indent(line)]));
        }
    }
    unclosed
}

/// The braces of one line that are code (not in a string or a comment),
/// with their offsets in the line; `in_triple` carries a `"""` string
/// from line to line.
fn code_braces(line: &str, in_triple: &mut bool) -> Vec<(usize, u8)> {
    let bytes = line.as_bytes();
    let mut braces = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if *in_triple {
            match line[i..].find("\"\"\"") {
                Some(end) => {
                    *in_triple = false;
                    i += end + 3;
                    continue;
                }
                None => break,
            }
        }
        match bytes[i] {
            b'"' if line[i..].starts_with("\"\"\"") => {
                *in_triple = true;
                i += 3;
                continue;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if line[i..].starts_with("//") => break,
            b'{' | b'}' => braces.push((i, bytes[i])),
            _ => {}
        }
        i += 1;
    }
    braces
}

/// The offset of a `}` that is likely one too many, and the offset of the
/// `}` that shows it: a `}` after others on its line (`}}`, `} }`), or one
/// starting its line indented deeper than the `{` it closes, closed a
/// block opened on an earlier line, and a later `}` that starts its line is
/// indented deeper than the `{` it then closes, or closes nothing. That is
/// how a doubled `}` at the end of a step looks: the block it closed early
/// still has its own `}` further down, indented for it.
fn suspect_extra_brace(text: &str) -> Option<(usize, usize)> {
    let mut open: Vec<usize> = Vec::new();
    let mut early: Option<usize> = None;
    let mut in_triple = false;
    let mut line_start = 0;
    for line in text.split('\n') {
        let starts_with_brace = !in_triple && line.trim_start().starts_with('}');
        for (i, brace) in code_braces(line, &mut in_triple) {
            let at = line_start + i;
            if brace == b'{' {
                open.push(at);
                continue;
            }
            let first = starts_with_brace && i == indent(line);
            let closed = open.pop();
            if first {
                let deeper = closed.is_none_or(|brace| {
                    let opened_line = text[..brace].rfind('\n').map_or(0, |n| n + 1);
                    indent(line) > indent(&text[opened_line..brace])
                });
                if deeper {
                    match early {
                        Some(early) => return Some((early, at)),
                        // A `}` of its own line indented deeper than the
                        // `{` it closes (a workflow's, by the `}` of an
                        // `if` typed twice) is suspect once a later `}`
                        // shows the block ending after it.
                        None if closed.is_some() => early = Some(at),
                        None => {}
                    }
                }
            } else if closed.is_some_and(|brace| brace < line_start) {
                early = Some(at);
            }
        }
        line_start += line.len() + 1;
    }
    None
}

/// The offset of the first bracket that opens more than `MAX_DEPTH` levels,
/// if any. pest recurses once per level and is built without its stack probe
/// (see Cargo.toml), so input this deep is refused before it is parsed.
///
/// The scan is deliberately conservative: it counts brackets inside comments
/// and after an unterminated string too, because the recovery productions
/// (`bad_stmt`'s `balanced`) recurse on those; only properly closed strings are
/// skipped. `list` followed by `<` (with any whitespace or comments between)
/// opens a level as well.
pub(crate) fn too_deep_at(source: &str) -> Option<usize> {
    let bytes = source.as_bytes();
    let mut open: Vec<u8> = Vec::new();
    let mut i = 0;
    // Only quotes and brackets count: the scan goes from one to the next,
    // rather than through every word and space (it was the single costliest
    // loop of parsing a well-formed file).
    while let Some(skip) = bytes[i..].iter().position(|b| {
        matches!(
            b,
            b'"' | b'(' | b'[' | b'{' | b'<' | b'>' | b')' | b']' | b'}'
        )
    }) {
        i += skip;
        let byte = bytes[i];
        match byte {
            b'"' if bytes[i..].starts_with(b"\"\"\"") => {
                if let Some(end) = source[i + 3..].find("\"\"\"") {
                    i += 3 + end + 3;
                    continue;
                }
            }
            b'"' => {
                let mut end = i + 1;
                while end < bytes.len() && bytes[end] != b'"' && bytes[end] != b'\n' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                if end < bytes.len() && bytes[end] == b'"' {
                    i = end + 1;
                    continue;
                }
            }
            b'(' | b'[' | b'{' => open.push(byte),
            b'<' if follows_list(bytes, i) => open.push(b'<'),
            b'>' if open.last() == Some(&b'<') => {
                open.pop();
            }
            b')' | b']' | b'}' => {
                open.pop();
            }
            _ => {}
        }
        if open.len() > MAX_DEPTH {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Whether the `<` at `at` follows the word `list` with nothing but
/// whitespace and comment characters (`/`, `*`) between: the `<` of a
/// `list<...>` type, which opens a level.
fn follows_list(bytes: &[u8], at: usize) -> bool {
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let word_end = bytes[..at]
        .iter()
        .rposition(|b| !(b.is_ascii_whitespace() || *b == b'/' || *b == b'*'))
        .map_or(0, |last| last + 1);
    let before = &bytes[..word_end];
    before.ends_with(b"list") && (before.len() == 4 || !is_word(before[before.len() - 5]))
}

pub(crate) fn reduce(operands: &mut Vec<Expr>, operators: &mut Vec<BinaryOp>) {
    let (Some(op), Some(right), Some(left)) = (operators.pop(), operands.pop(), operands.pop())
    else {
        return;
    };
    operands.push(Expr {
        span: left.span.to(right.span),
        kind: ExprKind::Binary(op, Box::new(left), Box::new(right)),
    });
}

/// Turns pest's record of what it tried at the failure point into words.
fn expected_words(error: &pest::error::Error<Rule>) -> Vec<String> {
    let mut words = Vec::new();
    let Some(attempts) = error.parse_attempts() else {
        return words;
    };
    // The `(` of parameters after a name is a slip, not what is expected.
    let mut slip_paren = false;
    for stack in attempts.call_stacks() {
        let rule = stack.deepest.get_rule().copied().or(stack.parent);
        slip_paren |= rule == Some(Rule::params_open);
        if let Some(word) = rule.and_then(rule_word) {
            words.push(word);
        }
    }
    // pest does not export its token type, so tokens are read through Display;
    // ranges and built-in classes are covered by the rule words above.
    for token in attempts.expected_tokens() {
        let token = token.to_string();
        let keyword = token.len() > 1 && token.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        let punctuation = matches!(
            token.as_str(),
            "{" | "}" | "[" | "]" | "(" | ")" | "=" | ":" | "," | "." | "|" | "?" | ".." | "?."
        );
        if (keyword || punctuation) && !(slip_paren && token == "(") {
            words.push(format!("`{token}`"));
        }
    }
    words
}

/// Parameters written after a declaration's name (`Parser::params_slip`).
struct Params {
    span: Span,
    /// Just after the `{` that opens the body.
    body_at: usize,
    /// The fields they declare, with their text as a record, if they are
    /// fields.
    fields: Option<(RecordTypeDecl, String)>,
}

/// The words for rules that stand for a kind of token or phrase.
fn rule_word(rule: Rule) -> Option<String> {
    let word = match rule {
        Rule::ident | Rule::field_name => "a name",
        Rule::string => "a string",
        Rule::int => "a whole number",
        Rule::duration => "a duration such as `30s`",
        Rule::expr | Rule::path => "an expression",
        Rule::type_expr | Rule::type_atom | Rule::type_postfix | Rule::named_type => "a type",
        Rule::record_lit => "`{`",
        Rule::doc => "a doc comment",
        Rule::infix => "an operator",
        Rule::EOI => "the end of the file",
        // A keyword as a whole word (`kw_output` is `output` and no longer
        // word): the word is the rule's name after `kw_`.
        _ => {
            let name = format!("{rule:?}");
            return name.strip_prefix("kw_").map(|word| format!("`{word}`"));
        }
    };
    Some(word.to_string())
}

/// Describes the text at an error position: what it is, and how long.
/// Where the number ends `before` starts, when `rest` goes on with its
/// fraction (`3` then `.5`).
fn fraction_start(before: &str, rest: &str) -> Option<usize> {
    let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let fraction = rest.strip_prefix('.')?;
    (digits > 0 && fraction.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| before.len() - digits)
}

fn describe_found(rest: &str) -> (String, usize) {
    let Some(c) = rest.chars().next() else {
        return ("the end of the file".into(), 0);
    };
    // A number with its fraction, as written (`3.5`).
    if c.is_ascii_digit() {
        let whole = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if let Some(fraction) = rest[whole..].strip_prefix('.')
            && fraction.starts_with(|c: char| c.is_ascii_digit())
        {
            let len = whole
                + 1
                + (fraction.len()
                    - fraction
                        .trim_start_matches(|c: char| c.is_ascii_digit())
                        .len());
            return (format!("`{}`", &rest[..len]), len);
        }
    }
    // A short string on one line, quotes and all (`timeout "5m"`).
    if c == '"'
        && let Some(close) = rest[1..].find(['"', '\\', '\n'])
        && rest.as_bytes()[1 + close] == b'"'
        && close <= 40
    {
        let len = close + 2;
        return (format!("`{}`", &rest[..len]), len);
    }
    // What is not seen is named by its code point.
    if is_invisible(c) {
        return (
            format!("U+{:04X}, an invisible character", u32::from(c)),
            c.len_utf8(),
        );
    }
    if c == '\n' || c == '\r' {
        return ("the end of the line".into(), 1);
    }
    if c.is_ascii_alphanumeric() || c == '_' {
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        return (format!("`{}`", &rest[..len]), len);
    }
    (format!("`{c}`"), c.len_utf8())
}

/// Whether the last line of `before` starts a block's header (`if`,
/// `else`, `for`, `parallel`, `branch`).
fn block_header(before: &str) -> bool {
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    starts_block_header(before[line_start..].trim_start())
}

/// Whether `head`, a line from its first word, starts a block's header:
/// flow's, or one other languages' authors write (`elif`, `while`).
fn starts_block_header(head: &str) -> bool {
    let word = head.split([' ', '\t', '(', ':']).next().unwrap_or("");
    ["if", "else", "elif", "for", "while", "parallel", "branch"].contains(&word)
}

/// A character not seen where it stands: a non-ASCII blank or control,
/// a zero-width or direction mark, a byte order mark inside the file.
fn is_invisible(c: char) -> bool {
    !c.is_ascii()
        && (c.is_whitespace()
            || c.is_control()
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}' | '\u{FEFF}'))
}

/// The name meant by `written`, a name as flow does not read one
/// (`triage-v2`, `2nd`, `quoted key`): `_` for each character a name cannot
/// hold, and before a first digit.
fn name_meant(written: &str) -> String {
    let mut meant: String = written
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c,
            false => '_',
        })
        .collect();
    if meant.is_empty() || meant.starts_with(|c: char| c.is_ascii_digit()) {
        meant.insert(0, '_');
    }
    meant
}

fn first_line_len(text: &str) -> usize {
    text.find('\n').unwrap_or(text.len())
}

fn join_or(words: &[String]) -> String {
    match words {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `furthest_failure` parses a window of the text that grows while the
    /// failure lies in its last line (pest made recovery quadratic in the
    /// file's length): a failure far past the first window, one inside it
    /// and one in a text without a line break are found as on the whole.
    #[test]
    fn a_window_finds_the_failure_the_whole_text_has() {
        let long_record = format!(
            "step a = r {{\n{}  c: ]\n}}\n{}",
            "  b: \"y\",\n".repeat(1_000),
            "step d = r { a: 1 }\n".repeat(1_000)
        );
        let early = format!("step ; = ;\n{}", "step d = r { a: 1 }\n".repeat(1_000));
        let one_line = format!("step a = r {{ b: \"{}é\", c: ] }}", "x".repeat(9_000));
        // A workflow past the first window whose last step's record is
        // left open: cut, the block closes at the cut's end and matches.
        let open_at_end = format!(
            "workflow w {{\n{}  step z = r {{\n",
            "  step d = r { a: 1 }\n".repeat(400)
        );
        for text in [&long_record, &early, &one_line] {
            let (whole, _) = furthest_failure_in(&[Rule::statement], text);
            assert_eq!(furthest_failure(&[Rule::statement], text), whole);
            assert!(whole.0 > 0, "{whole:?}");
        }
        let (whole, parsed) = furthest_failure_in(&[Rule::item], &open_at_end);
        assert!(!parsed && whole.0 > FIRST_WINDOW, "{whole:?}");
        assert_eq!(furthest_failure(&[Rule::item], &open_at_end), whole);
        assert!(furthest_failure(&[Rule::statement], &long_record).0 > FIRST_WINDOW);
    }

    /// A NUL byte (or another ASCII control character) is named for what
    /// it is, and the rest of the file is read. Regression: in a string it
    /// was "expected a string, found `\u{0}`", and after a keyword the
    /// rest of the file was skipped. (A fixture file cannot hold a NUL.)
    #[test]
    fn a_control_character_is_named_and_the_rest_is_read() {
        for source in [
            "workflow w {\n  output { a: \"x\0y\" }\n}\n",
            "workflow\0w {\n  step a = handoff \"d\" { message: \"m\" } retry 1\n}\n",
            "workflow w {\n  step a = handoff \"d\" {\u{7}message: \"m\" } retry 1\n}\n",
        ] {
            let (tree, problems) = parse(source, FileId(0));
            let messages: Vec<&str> = problems.iter().map(|p| p.message.as_str()).collect();
            assert_eq!(messages.len(), 1, "{source:?}: {messages:?}");
            assert!(
                messages[0].starts_with("a control character, U+00"),
                "{source:?}: {messages:?}"
            );
            assert_eq!(tree.items.len(), 1, "{source:?}: the workflow is read");
        }
    }
}
