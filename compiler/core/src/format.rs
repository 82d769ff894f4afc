//! The source formatter behind `flowc fmt`.
//!
//! The formatter is a token-stream pretty printer, like a small gofmt, rather than a
//! printer of the parse tree: comments are ordinary tokens here, so they survive as
//! written, and a file with semantic errors still formats (one that does not parse is
//! refused, see `format_source`). It changes the whitespace between tokens and the commas between a
//! record's fields (which the grammar makes optional), and never adds, drops or
//! reorders another token, so the parser reads the same program before and after.
//!
//! The layout is canonical: the same tokens give the same file whatever their line
//! breaks and spaces, but for two things of the author's that are kept: a blank line
//! (at most one) before a statement or a comment of a block, and whether a comment ends
//! a line of code or has a line of its own. `canonical_layout` decides the line breaks,
//! then the printer indents and spaces.
//!
//! The layout rules:
//! * Each statement and member of a block (a declaration's body, a workflow, an `if`,
//!   `else`, `for`, `parallel`, `branch` or `on_error fallback` body) starts a line of
//!   its own; a block's content is indented and its `}` has a line of its own (`{}`
//!   when empty). `} else {` stays together.
//! * A record (a step's arguments, a record literal, a record type, `input { ... }`) or
//!   a list is written on one line when it fits in 100 columns (by an estimate of the
//!   width that does not depend on the input's spacing) and holds no comment and no
//!   multi-line string: `{ a: 1, b: 2 }`, with `, ` between fields. Otherwise each field
//!   or item gets a line of its own, fields without commas.
//! * A step's options follow its call on the same line (after the `}` of a record written
//!   on several lines), or all go to the next line, indented one level more, when they
//!   do not fit. An option after a comment line starts a continuation line too.
//! * A union that starts with `|` (`type Tier =`, then `| "free"`, `| "pro"`) has one
//!   alternative a line; any other is written on one line. An alternative on a line of
//!   its own (after a comment) is a continuation line, indented one level more.
//! * A line is indented by two spaces for every earlier line that left a bracket
//!   (`{`, `[`, `(`) open; several brackets opened on one line count once. A line that
//!   starts with closing brackets is indented like the line that opened them. A block
//!   opened on a continuation line (`on_error fallback {`) indents its content from that
//!   line and closes at its indentation. Indentation stops growing at 64 levels.
//! * Within a line: one space around binary operators (`== != < <= > >= && || ??`, `=`
//!   and `|` in types); a space after `,` and `:` and none before; nothing inside
//!   `( )` and `[ ]` or after `!`; `{ a: 1 }` keeps one space inside its braces and
//!   `{}` none; `.`, `?.` and `..` are tight; `list<T>` is tight; `T?` is tight; an
//!   index (`rows[0]`) is tight and a list after a keyword (`args ["x"]`) is not; a
//!   space separates everything else.
//! * Comments keep their text (minus trailing whitespace) and stay on their own line,
//!   re-indented, or at the end of the line they were on, one space after the code; a
//!   line comment ends its line.
//! * The content of strings, including multi-line `"""` strings, is never touched.
//! * Characters the language does not use are left with the spacing the author gave
//!   them, and two tokens are never written adjacent when the result would read as
//!   different tokens (`! =` is not `!=`).

use std::borrow::Cow;
use std::fmt;

/// Why a source could not be formatted: it could not be tokenised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    /// Byte offset of the start of the token that could not be read.
    pub offset: usize,
    /// What was wrong, in words for the user.
    pub message: String,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for FormatError {}

/// Formats a .flow file. Returns Err with the byte offset and a message when the
/// source cannot be tokenised (an unterminated string or block comment) or does not
/// parse; callers refuse to format such files. Never panics on any input.
///
/// A file that does not parse is refused, as gofmt and rustfmt refuse one: its tokens
/// say nothing of the structure the author meant, and laid out anyway they read as
/// other code (`=>` spaced to `= >`, a word of a `#` comment moved to a line of its
/// own as a statement, a block left open indenting the rest of the file), which then
/// draws other errors than the file had.
pub fn format_source(source: &str) -> Result<String, FormatError> {
    // Lone `\r` line ends are written back as `\n`.
    let source = &*crate::syntax::lone_cr_as_lf(source);
    // A byte order mark is kept as it is, not laid out as a token.
    let (mark, text) = match source.strip_prefix('\u{FEFF}') {
        Some(text) => ("\u{FEFF}", text),
        None => ("", source),
    };
    let tokens = tokens_of(text).map_err(|mut refused| {
        refused.offset += mark.len();
        refused
    })?;
    let (_, problems) = crate::syntax::parse(source, crate::diagnostic::FileId(0));
    if let Some(problem) = problems
        .iter()
        .filter(|problem| problem.severity == crate::diagnostic::Severity::Error)
        .min_by_key(|problem| problem.primary.span.start)
    {
        return Err(FormatError {
            offset: problem.primary.span.start as usize,
            message: format!(
                "{} (a file that does not parse is not formatted; `flowc check` says more)",
                problem.message
            ),
        });
    }
    let printed = print(&tokens);
    // A file written with CRLF line endings keeps them, all of them (the
    // printer writes `\n`, and a `"""` string keeps the ones it holds).
    let crlf = text.find('\n').is_some_and(|at| text[..at].ends_with('\r'));
    let printed = if crlf {
        printed.replace("\r\n", "\n").replace('\n', "\r\n")
    } else {
        printed
    };
    Ok(format!("{mark}{printed}"))
}

/// The tokens of `source`, refused when one is not terminated.
fn tokens_of(source: &str) -> Result<Vec<Token<'_>>, FormatError> {
    let (tokens, unterminated) = tokenize(source);
    match unterminated {
        Some(open) => Err(FormatError {
            offset: open.offset,
            message: format!("unterminated {}", open.what),
        }),
        None => Ok(tokens),
    }
}

/// The tokens laid out and printed.
fn print(tokens: &[Token<'_>]) -> String {
    Printer::new(&canonical_layout(tokens)).print()
}

// ---------------------------------------------------------------- layout

/// The widest a line of an inline record or list may grow, by the estimate
/// `Layout::width` makes, before the record or list is written one field
/// or item per line.
const MAX_WIDTH: usize = 100;

/// The words that start a statement or a member in a block: a line of its
/// own each. The step options among them continue a step's line instead
/// (see `statement_at`); after anything else they are a mistake the parser
/// reports, and keep a line of their own.
const STATEMENT_WORDS: &[&str] = &[
    "import",
    "type",
    "recipe",
    "mcp",
    "workflow",
    "step",
    "if",
    "for",
    "parallel",
    "branch",
    "model",
    "input",
    "output",
    "prompt",
    "context",
    "department",
    "durability",
    "deliver",
    "timeout",
    "on_error",
    "retry",
    "backoff",
    "idempotency",
    "command",
    "args",
    "url",
    "env",
    "test",
    "mock",
    "decide",
    "expect",
];

/// The statements whose `{` opens a block of statements rather than a record.
const BLOCK_STATEMENTS: &[&str] = &[
    "workflow", "recipe", "mcp", "parallel", "branch", "if", "for", "test",
];

/// What a bracket holds, for the line breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// Statements or members: one per line, always.
    Block,
    /// Fields of a record literal or type: on one line with `, ` between
    /// them when it fits, else one per line without commas.
    Record { expanded: bool },
    /// Items of a list: on one line when it fits, else one per line.
    List { expanded: bool },
    /// Anything else (parentheses, a stray closer's content): one line.
    Inline,
}

struct Level {
    holds: Holds,
    /// The indentation of its lines, in levels: one per enclosing block and
    /// record or list written on several lines.
    indent: usize,
    /// The bracket that opened it (`{`, `[`, `(`); the file's level has none.
    opener: &'static str,
    /// The word that started the current statement of a block.
    statement: Option<&'static str>,
    /// Whether the current statement is a `type` whose union starts with
    /// `|`: its alternatives then go one to a line.
    union_by_line: bool,
    /// The `list<` of the statement open here: a union inside one stays
    /// on its line.
    open_lists: u32,
}

/// The statement word that the token at `index` starts in a block, if it
/// starts one: not a path's root (`step.a`), a field (`type: 1`), a step's
/// option, or the `if` of an `else if`.
fn statement_at(tokens: &[Token<'_>], index: usize, level: &Level) -> Option<&'static str> {
    let token = &tokens[index];
    if level.holds != Holds::Block || token.kind != Kind::Word {
        return None;
    }
    let word = STATEMENT_WORDS.iter().find(|word| **word == token.text)?;
    let next = tokens.get(index + 1).map(|next| next.text);
    let prev = index.checked_sub(1).map(|at| tokens[at].text);
    let part_of_path = matches!(next, Some("." | "?." | ":")) || matches!(prev, Some("." | "?."));
    // A name being declared (`step mock = ...`, `for xs as test`) is no
    // statement word, whatever it spells.
    let declared = matches!(
        prev,
        Some(
            "step"
                | "recipe"
                | "type"
                | "mcp"
                | "workflow"
                | "as"
                | "branch"
                | "parallel"
                | "mock"
                | "="
        )
    );
    // What a mock's call fails with (`fails timeout`) is a word of its
    // line, not the `timeout` option starting one.
    if declared || prev == Some("fails") {
        return None;
    }
    let option = STEP_OPTION_KEYWORDS.contains(word) && level.statement == Some("step");
    (!part_of_path && !option).then_some(word)
}

/// Whether the `,` at `tokens[index]`, in a record, stands where the layout
/// writes a comma or none: before a field (`name:`) or the record's end,
/// other commas aside. Any other comma is kept: dropped, it could make the
/// word before a `:` a field, which the next formatting would give a comma
/// of its own.
fn separates_fields(tokens: &[Token<'_>], index: usize) -> bool {
    let mut rest = tokens
        .iter()
        .enumerate()
        .skip(index + 1)
        .filter(|(_, token)| {
            !matches!(token.kind, Kind::LineComment | Kind::BlockComment) && token.text != ","
        });
    match rest.next() {
        None => true,
        Some((_, next)) if next.text == "}" => true,
        Some((at, next)) => {
            next.kind == Kind::Word && tokens.get(at + 1).is_some_and(|after| after.text == ":")
        }
    }
}

/// The line breaks of the canonical layout, whatever the author's: each
/// statement on a line of its own, blocks expanded, a record or a list on
/// one line when it fits and has no comment or multi-line string inside,
/// else one field or item per line. Only two things of the author's layout
/// are kept: a blank line (at most one) before a statement, and whether a
/// comment ends a line of code or has a line of its own. Records get `, `
/// between fields on one line and no commas on several; no other token is
/// added or dropped.
fn canonical_layout<'a>(tokens: &[Token<'a>]) -> Vec<Token<'a>> {
    let partner = partners(tokens);
    let mut out: Vec<Token<'a>> = Vec::with_capacity(tokens.len());
    let mut levels = vec![Level {
        holds: Holds::Block,
        indent: 0,
        opener: "",
        statement: None,
        union_by_line: false,
        open_lists: 0,
    }];
    // How many levels each opener (`{`, `[`, `(`) has open, so that a closer
    // that closes nothing is known without searching the levels.
    let mut open_counts = [0usize; 3];
    // The estimated column where the next token goes, for widths.
    let mut column = 0;
    let mut index = 0;
    while let Some(&token) = tokens.get(index) {
        let level = levels.last().expect("the file's level is never closed");
        let field_start =
            token.kind == Kind::Word && tokens.get(index + 1).is_some_and(|next| next.text == ":");
        // Commas between fields are the layout's to write.
        if token.text == ","
            && matches!(level.holds, Holds::Record { .. })
            && separates_fields(tokens, index)
        {
            index += 1;
            continue;
        }
        let mut breaks = breaks(tokens, index, &levels, &open_counts, out.last());
        // A union written with a leading `|` (`type Tier =` then `| "free"`
        // ...) has one alternative a line, each a continuation line.
        let leading_bar = token.text == "|"
            && level.statement == Some("type")
            && out
                .iter()
                .rev()
                .find(|prev| !matches!(prev.kind, Kind::LineComment | Kind::BlockComment))
                .is_some_and(|prev| prev.text == "=");
        if token.text == "|" && (leading_bar || (level.union_by_line && level.open_lists == 0)) {
            breaks = 1;
        }
        // A step's options follow its call on its line, or all go to the
        // next line when they do not fit there.
        if level.holds == Holds::Block
            && level.statement == Some("step")
            && STEP_OPTION_KEYWORDS.contains(&token.text)
            && out.last().is_some_and(|prev| prev.text == "}")
            && !fits(
                options(tokens, index, level),
                MAX_WIDTH.saturating_sub(column),
            )
        {
            breaks = 1;
        }
        if let Holds::Record { expanded: false } = level.holds
            && field_start
            && out.last().is_some_and(|prev| prev.text != "{")
        {
            out.push(Token {
                kind: Kind::Punct,
                text: ",",
                start: token.start,
                newlines_before: 0,
                spaced: false,
            });
            column += 2;
            breaks = 0;
        }
        if breaks > 0 {
            column = 2 * level.indent;
        }
        // A token that spans lines (a block comment, a `"""` string) leaves
        // the column at its last line's end: counting all its text made the
        // layout after it depend on the line ends inside it (`\r\n` or
        // `\n`), so that formatting twice differed.
        column = match token.text.rfind('\n') {
            Some(at) => token.text.len() - at,
            None => column + token.text.len() + 1,
        };
        // A statement word starts the block's statement.
        let level = levels.last_mut().expect("the file's level is never closed");
        if let Some(word) = statement_at(tokens, index, level) {
            level.statement = Some(word);
            level.union_by_line = false;
            level.open_lists = 0;
        }
        level.union_by_line |= leading_bar;
        if level.statement == Some("type") {
            match token.text {
                "<" => level.open_lists += 1,
                ">" => level.open_lists = level.open_lists.saturating_sub(1),
                _ => {}
            }
        }
        match token.text {
            "{" | "[" | "(" => {
                let end = partner[index].unwrap_or(tokens.len());
                let inner = &tokens[index + 1..end.min(tokens.len())];
                let fits = || fits(inner, MAX_WIDTH.saturating_sub(column + 2));
                let holds = match token.text {
                    "{" if opens_block(level, out.last()) => Holds::Block,
                    "{" => Holds::Record { expanded: !fits() },
                    "[" => Holds::List { expanded: !fits() },
                    _ => Holds::Inline,
                };
                let indent = level.indent
                    + usize::from(matches!(
                        holds,
                        Holds::Block
                            | Holds::Record { expanded: true }
                            | Holds::List { expanded: true }
                    ));
                let opener = opener_of(token.text);
                open_counts[bracket_index(opener)] += 1;
                levels.push(Level {
                    holds,
                    indent,
                    opener,
                    statement: None,
                    union_by_line: false,
                    open_lists: 0,
                });
            }
            "}" | "]" | ")" => {
                // As the printer does: a closer closes the innermost bracket
                // of its kind and those opened inside it; one that closes
                // nothing is ignored.
                let wanted = opener_of(token.text);
                if open_counts[bracket_index(wanted)] > 0 {
                    while let Some(closed) = levels.pop() {
                        open_counts[bracket_index(closed.opener)] -= 1;
                        if closed.opener == wanted {
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
        // `args ["x"]` is a list after a keyword, `rows[0]` an index: the
        // printer spaces a `[` after a word as the token says.
        let spaced = match (token.text, out.last()) {
            ("[", Some(prev)) if prev.kind == Kind::Word => {
                let before = out.len().checked_sub(2).map(|at| out[at].text);
                // `to email ["leads"]`: a destination's recipients.
                let recipients = prev.text == "email" && before == Some("to");
                (STATEMENT_WORDS.contains(&prev.text) || recipients)
                    && !matches!(before, Some("." | "?."))
            }
            _ => token.spaced,
        };
        out.push(Token {
            newlines_before: breaks,
            spaced,
            ..token
        });
        index += 1;
    }
    out
}

/// How many line breaks go before the token at `index`: 0, 1, or 2 for a
/// blank line the author left before a statement or a comment of a block.
fn breaks(
    tokens: &[Token<'_>],
    index: usize,
    levels: &[Level],
    open_counts: &[usize; 3],
    prev: Option<&Token<'_>>,
) -> usize {
    let token = &tokens[index];
    let Some(prev) = prev else {
        return 0;
    };
    let level = levels.last().expect("the file's level is never closed");
    let blank = |wanted: usize| wanted.max(token.newlines_before.min(2));
    if prev.kind == Kind::LineComment {
        return if level.holds == Holds::Block {
            blank(1)
        } else {
            1
        };
    }
    if matches!(token.kind, Kind::LineComment | Kind::BlockComment) {
        return match (token.newlines_before, level.holds) {
            (0, _) => 0,
            (_, Holds::Block) => blank(1),
            _ => 1,
        };
    }
    let opened = |holds: Holds| match holds {
        Holds::Block | Holds::Record { expanded: true } | Holds::List { expanded: true } => 1,
        Holds::Record { expanded: false } | Holds::List { expanded: false } | Holds::Inline => 0,
    };
    let closes = matches!(token.text, "}" | "]" | ")")
        && open_counts[bracket_index(opener_of(token.text))] > 0;
    if closes {
        // An empty block or record closes where it opens: `{}`.
        return if matches!(prev.text, "{" | "[" | "(") {
            0
        } else {
            opened(level.holds)
        };
    }
    if matches!(prev.text, "{" | "[" | "(") {
        return opened(level.holds);
    }
    // `else if` continues its `if`, a block comment between them too
    // (`else /* why */ if`: the `if` was moved to a line of its own, where
    // it read as another statement).
    let after_else = tokens[..index]
        .iter()
        .rev()
        .find(|token| token.kind != Kind::BlockComment)
        .is_some_and(|token| token.text == "else");
    match level.holds {
        Holds::Block if statement_at(tokens, index, level).is_some() && !after_else => blank(1),
        Holds::Block => 0,
        Holds::Record { expanded: true } => {
            let field = token.kind == Kind::Word
                && tokens.get(index + 1).is_some_and(|next| next.text == ":")
                && !matches!(prev.text, ":" | "." | "?.");
            usize::from(field)
        }
        Holds::List { expanded: true } => usize::from(prev.text == ","),
        _ => 0,
    }
}

/// The options of a step from the token at `first`, to the next statement,
/// the end of the block, or the `{` of an `on_error fallback`.
fn options<'t, 'a>(tokens: &'t [Token<'a>], first: usize, level: &Level) -> &'t [Token<'a>] {
    let mut end = first;
    while let Some(token) = tokens.get(end) {
        let ends = matches!(token.text, "{" | "}")
            || matches!(token.kind, Kind::LineComment | Kind::BlockComment)
            || (end > first && statement_at(tokens, end, level).is_some());
        if ends {
            break;
        }
        end += 1;
    }
    &tokens[first..end]
}

/// The opening bracket of a bracket, opening or closing.
fn opener_of(bracket: &str) -> &'static str {
    match bracket {
        "{" | "}" => "{",
        "[" | "]" => "[",
        _ => "(",
    }
}

fn bracket_index(opener: &str) -> usize {
    match opener {
        "{" => 0,
        "[" => 1,
        _ => 2,
    }
}

/// Whether a `{` after `prev` in `level` opens a block of statements: the
/// body of a declaration, a condition, a loop, a parallel block or branch,
/// an `else` or an `on_error fallback`.
fn opens_block(level: &Level, prev: Option<&Token<'_>>) -> bool {
    if level.holds != Holds::Block {
        return false;
    }
    if prev.is_some_and(|prev| matches!(prev.text, "else" | "fallback")) {
        return true;
    }
    level
        .statement
        .is_some_and(|statement| BLOCK_STATEMENTS.contains(&statement))
        && !prev.is_some_and(|prev| matches!(prev.text, "=" | ":" | "," | "[" | "("))
}

/// The estimated width of a token written on one line: with a space, and
/// the `, ` a record gets between fields; a comma written or not counts the
/// same, so that the estimate, and the layout, do not depend on it.
fn token_width(token: &Token<'_>) -> usize {
    match token.text {
        "," => 0,
        ":" => 3,
        text => text.len() + 1,
    }
}

/// Whether tokens fit on one line in `room` columns (by `token_width`), with no
/// comment and no string that spans lines among them. It stops at the first
/// token past the room, so that deep nesting costs no more than a line's
/// worth of tokens per bracket.
fn fits(tokens: &[Token<'_>], room: usize) -> bool {
    let mut used = 0;
    for token in tokens {
        let multi_line = matches!(token.kind, Kind::LineComment | Kind::BlockComment)
            || (token.kind == Kind::Str && token.text.contains('\n'));
        used += token_width(token);
        if multi_line || used > room {
            return false;
        }
    }
    true
}

/// For each opening bracket, the index of the bracket that closes it; a
/// closer of another kind closes the brackets opened since, as the printer
/// treats it.
fn partners(tokens: &[Token<'_>]) -> Vec<Option<usize>> {
    let mut partner = vec![None; tokens.len()];
    let mut open: Vec<(usize, &str)> = Vec::new();
    let mut open_counts = [0usize; 3];
    for (index, token) in tokens.iter().enumerate() {
        match token.text {
            "{" | "[" | "(" => {
                open_counts[bracket_index(token.text)] += 1;
                open.push((index, token.text));
            }
            "}" | "]" | ")" => {
                let wanted = opener_of(token.text);
                if open_counts[bracket_index(wanted)] > 0 {
                    while let Some((at, text)) = open.pop() {
                        open_counts[bracket_index(text)] -= 1;
                        partner[at] = Some(index);
                        if text == wanted {
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    partner
}

use crate::syntax::lex::{Kind, Token, tokenize};

/// Whether `a` written directly before `b` still reads as those two tokens, so that
/// removing the space between them cannot merge them (`!` `=` would read as `!=`).
fn lexes_apart(a: &str, b: &str) -> bool {
    let joined = format!("{a}{b}");
    matches!(tokenize(&joined), (tokens, None) if matches!(tokens.as_slice(), [first, _] if first.text == a))
}

/// The text a token is written as: comments lose trailing whitespace on every line,
/// everything else is kept byte for byte.
fn emitted_text<'a>(token: &Token<'a>) -> Cow<'a, str> {
    const TRAILING: [char; 3] = [' ', '\t', '\r'];
    match token.kind {
        Kind::LineComment => Cow::Borrowed(token.text.trim_end_matches(TRAILING)),
        Kind::BlockComment if token.text.contains('\n') => Cow::Owned(
            token
                .text
                .split('\n')
                .map(|line| line.trim_end_matches(TRAILING))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => Cow::Borrowed(token.text),
    }
}

// ---------------------------------------------------------------- printer

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bracket {
    Brace,
    Square,
    Paren,
}

/// What a token is for the layout rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Comment,
    Other,
    Open(Bracket),
    Close(Bracket),
    Comma,
    Colon,
    /// `.`, `?.` and `..`, which bind tightly on both sides.
    Access,
    Not,
    /// The postfix `?` of an optional type.
    Question,
    BinOp,
    /// The `<` of `list<T>`.
    TypeOpen,
    /// The `>` that closes a `list<`.
    TypeClose,
    Word,
    Number,
    Str,
}

fn bracket_class(text: &str) -> Option<Class> {
    Some(match text {
        "{" => Class::Open(Bracket::Brace),
        "[" => Class::Open(Bracket::Square),
        "(" => Class::Open(Bracket::Paren),
        "}" => Class::Close(Bracket::Brace),
        "]" => Class::Close(Bracket::Square),
        ")" => Class::Close(Bracket::Paren),
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy)]
struct OpenBracket {
    bracket: Bracket,
    /// The output line the bracket was opened on.
    line: usize,
    /// The indentation, in levels, of lines inside this bracket.
    levels: usize,
    /// The indentation of the line the bracket was opened on, when that was a
    /// continuation line: a line that starts by closing the bracket sits there.
    continuation_indent: Option<usize>,
    /// Whether the last code line directly inside this bracket belongs to a step
    /// statement, so that a step option starting the next line continues it.
    in_step: bool,
}

/// The step options, which may start a continuation line of a step statement.
const STEP_OPTION_KEYWORDS: [&str; 5] = ["retry", "backoff", "timeout", "on_error", "idempotency"];

/// Indentation stops growing here. No real file nests this deep, and without a cap a
/// small file of nothing but opening brackets would format to a quadratically large
/// output.
const MAX_INDENT_LEVELS: usize = 64;

struct Printer<'t, 'a> {
    tokens: &'t [Token<'a>],
    out: String,
    /// The brackets open at the current token, innermost last.
    open: Vec<OpenBracket>,
    /// How many brackets of each kind are open, so that a stray closer is found to have
    /// no match without scanning the stack.
    open_counts: [usize; 3],
    /// For each `list<` not yet closed, innermost last, how many brackets were open at
    /// its `<`: a `>` closes it only at that same depth.
    angles: Vec<usize>,
    /// The number of the current output line.
    line: usize,
    /// Whether the current line is a continuation line of a step statement.
    continuation: bool,
    /// The indentation of the current line, in levels.
    indent: usize,
    /// `OpenBracket::in_step` for the top level, outside every bracket.
    top_in_step: bool,
    /// The index of the first token that is not a comment at or after some earlier
    /// line start, cached so that a long run of comment lines is scanned once.
    next_code: usize,
}

impl<'t, 'a> Printer<'t, 'a> {
    fn new(tokens: &'t [Token<'a>]) -> Self {
        Printer {
            tokens,
            out: String::new(),
            open: Vec::new(),
            open_counts: [0; 3],
            angles: Vec::new(),
            line: 0,
            continuation: false,
            indent: 0,
            top_in_step: false,
            next_code: 0,
        }
    }

    fn print(mut self) -> String {
        let mut prev: Option<(Token<'a>, Class)> = None;
        // Tokens before this index are closing brackets already closed by `start_line`.
        let mut closed_until = 0;
        for (index, &token) in self.tokens.iter().enumerate() {
            let class = self.classify(index);
            match prev {
                None => closed_until = self.start_line(index),
                Some((_, prev_class)) if token.newlines_before > 0 => {
                    let breaks = if matches!(prev_class, Class::Open(_))
                        || matches!(class, Class::Close(_))
                    {
                        1
                    } else {
                        token.newlines_before.min(2)
                    };
                    for _ in 0..breaks {
                        self.out.push('\n');
                    }
                    self.line += 1;
                    closed_until = self.start_line(index);
                }
                Some((prev_token, prev_class)) => {
                    if wants_space(&prev_token, prev_class, &token, class)
                        || !lexes_apart(prev_token.text, token.text)
                    {
                        self.out.push(' ');
                    }
                }
            }
            self.out.push_str(&emitted_text(&token));
            match class {
                Class::Open(bracket) => self.open_bracket(bracket),
                Class::Close(bracket) if index >= closed_until => {
                    self.close_bracket(bracket);
                }
                _ => {}
            }
            prev = Some((token, class));
        }
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        self.out
    }

    /// Classifies the token at `index` and keeps track of `list<...>` type brackets.
    fn classify(&mut self, index: usize) -> Class {
        let token = self.tokens[index];
        let class = match token.kind {
            Kind::LineComment | Kind::BlockComment => Class::Comment,
            Kind::Other => Class::Other,
            Kind::Word => Class::Word,
            Kind::Number => Class::Number,
            Kind::Str => Class::Str,
            Kind::Punct => match token.text {
                "," => Class::Comma,
                ":" => Class::Colon,
                "." | "?." | ".." => Class::Access,
                "!" => Class::Not,
                "?" => Class::Question,
                "<" if self.follows_list_keyword(index) => {
                    self.angles.push(self.open.len());
                    Class::TypeOpen
                }
                ">" if self.angles.last() == Some(&self.open.len()) => {
                    self.angles.pop();
                    Class::TypeClose
                }
                text => bracket_class(text).unwrap_or(Class::BinOp),
            },
        };
        // A token that cannot appear in a type ends every `list<` still open: that `<`
        // was a comparison after all (`x.list < 3`), and a later `>` must not pair up
        // with it.
        let in_type = matches!(
            class,
            Class::Comment
                | Class::Word
                | Class::Str
                | Class::Open(_)
                | Class::Close(_)
                | Class::Comma
                | Class::Colon
                | Class::Question
                | Class::TypeOpen
                | Class::TypeClose
        ) || token.text == "|";
        if !in_type {
            self.angles.clear();
        }
        class
    }

    /// Whether the token at `index` comes right after the type name `list`, rather than
    /// after a field that happens to be called `list` (`step.x.list < 3`).
    fn follows_list_keyword(&self, index: usize) -> bool {
        let before = |back: usize| index.checked_sub(back).map(|i| self.tokens[i]);
        before(1).is_some_and(|t| t.kind == Kind::Word && t.text == "list")
            && !before(2).is_some_and(|t| matches!(t.text, "." | "?."))
    }

    /// Starts the line whose first token is at `first`: closes the brackets the line
    /// starts with, so that `}` or `} else {` sits at the indentation of the line that
    /// opened the block, then writes the indentation. Returns the index of the first
    /// token whose bracket is not closed yet.
    fn start_line(&mut self, first: usize) -> usize {
        let mut end = first;
        // The outermost bracket the line's leading closers closed.
        let mut closed = None;
        while let Some(token) = self.tokens.get(end) {
            if end > first && token.newlines_before > 0 {
                break;
            }
            let Some(Class::Close(bracket)) = bracket_class(token.text) else {
                break;
            };
            closed = self.close_bracket(bracket).or(closed);
            end += 1;
        }
        let levels = self.open.last().map_or(0, |open| open.levels);
        self.continuation = false;
        let indent = if end > first {
            // A line that starts by closing brackets is part of no statement of its own
            // and leaves the step context of the bracket it returns to as it was.
            match closed.and_then(|open| open.continuation_indent) {
                Some(indent) => indent.max(levels),
                None => levels,
            }
        } else {
            self.continuation = self.continues_statement(first);
            levels + usize::from(self.continuation)
        };
        self.indent = indent;
        for _ in 0..indent.min(MAX_INDENT_LEVELS) {
            self.out.push_str("  ");
        }
        end
    }

    /// Whether the line starting at `first`, which does not start with a closing
    /// bracket, is a continuation line of a step statement or of a union (`| "b"`,
    /// after a comment or written by line). A code line also records
    /// whether it leaves the enclosing bracket inside a step statement.
    fn continues_statement(&mut self, first: usize) -> bool {
        if self.next_code < first {
            self.next_code = first;
        }
        while self
            .tokens
            .get(self.next_code)
            .is_some_and(|token| matches!(token.kind, Kind::LineComment | Kind::BlockComment))
        {
            self.next_code += 1;
        }
        let lead = self.next_code;
        let Some(token) = self.tokens.get(lead) else {
            return false;
        };
        let in_step = match self.open.last_mut() {
            Some(open) => &mut open.in_step,
            None => &mut self.top_in_step,
        };
        let is_option = token.kind == Kind::Word && STEP_OPTION_KEYWORDS.contains(&token.text);
        // A union's alternative on a line of its own continues its type.
        let alternative = token.text == "|";
        // A comment-only line goes with the code line after it and changes nothing.
        let comment_only = self.tokens[first + 1..=lead]
            .iter()
            .any(|token| token.newlines_before > 0);
        if comment_only || is_option || alternative {
            return alternative || (is_option && *in_step);
        }
        // `step name = ...`, not a path (`step.a`) or a field (`step: 1`).
        *in_step = token.kind == Kind::Word
            && token.text == "step"
            && self
                .tokens
                .get(lead + 1)
                .is_some_and(|next| next.kind == Kind::Word);
        false
    }

    fn open_bracket(&mut self, bracket: Bracket) {
        // Brackets opened on the same line share one level of indentation, so that
        // `{ tags: [` indents its content once, not twice. The content of a bracket
        // opened on a continuation line is indented from that line.
        let extra = usize::from(self.continuation);
        let levels = match self.open.last() {
            Some(outer) if outer.line == self.line => outer.levels,
            Some(outer) => outer.levels + 1 + extra,
            None => 1 + extra,
        };
        self.open.push(OpenBracket {
            bracket,
            line: self.line,
            levels,
            continuation_indent: self.continuation.then_some(self.indent),
            in_step: false,
        });
        self.open_counts[bracket as usize] += 1;
    }

    /// Closes the innermost open `bracket` and any unclosed brackets inside it, and
    /// returns it. A closer without a matching open bracket is ignored.
    fn close_bracket(&mut self, bracket: Bracket) -> Option<OpenBracket> {
        if self.open_counts[bracket as usize] == 0 {
            return None;
        }
        let mut closed = None;
        while let Some(open) = self.open.pop() {
            self.open_counts[open.bracket as usize] -= 1;
            closed = Some(open);
            if open.bracket == bracket {
                break;
            }
        }
        while self
            .angles
            .last()
            .is_some_and(|&depth| depth > self.open.len())
        {
            self.angles.pop();
        }
        closed
    }
}

/// Whether the layout rules want a space between two tokens on the same line. The
/// caller adds one anyway when the two would otherwise merge into other tokens.
fn wants_space(prev: &Token<'_>, prev_class: Class, next: &Token<'_>, next_class: Class) -> bool {
    use Class::*;
    match (prev_class, next_class) {
        (Comment, _) | (_, Comment) => true,
        // The formatter has no rule for characters the language does not use.
        (Other, _) | (_, Other) => next.spaced,
        (_, Comma | Colon) => false,
        (Open(Bracket::Brace), Close(Bracket::Brace)) => false,
        (Open(Bracket::Brace), _) | (_, Close(Bracket::Brace)) => true,
        (Open(_) | TypeOpen, _) | (_, Close(_) | TypeOpen | TypeClose) => false,
        (Comma | Colon, _) => true,
        // `2` `.` `5` written tight would read as the float `2.5`.
        (Number, Access) if next.text == "." && is_integer(prev.text) => true,
        (Access, _) | (_, Access) => false,
        (Not, _) => false,
        (BinOp, _) | (_, BinOp) => true,
        (_, Question) => false,
        // An index (`x[0]`, `x[0][1]`) is tight, but a list literal after a keyword
        // (`args ["a"]`) is not: `canonical_layout` says which by the token's `spaced`.
        (Word | Close(Bracket::Square), Open(Bracket::Square)) => next.spaced,
        _ => true,
    }
}

fn is_integer(text: &str) -> bool {
    text.strip_prefix('-')
        .unwrap_or(text)
        .bytes()
        .all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    /// The formatter on tokens alone, as `format_source` is once a file
    /// parses: the cases here are fragments, not whole files.
    fn format_tokens(source: &str) -> Result<String, FormatError> {
        tokens_of(source).map(|tokens| print(&tokens))
    }

    use super::*;
    use proptest::prelude::*;

    /// A file of classic Mac line ends (a lone `\r`) is laid out with `\n`:
    /// its `//` comment ends at its line, not at the end of the file.
    #[test]
    fn lone_carriage_returns_become_line_feeds() {
        let text = "// a comment\rworkflow w {\r  step a = nowhere {}\r}\r";
        let formatted = format_source(text).expect("it parses");
        assert_eq!(
            formatted,
            "// a comment\nworkflow w {\n  step a = nowhere {}\n}\n"
        );
    }

    /// The named cases, (name, input), whose outputs are the snapshot
    /// `format__tests__named_cases`.
    const CASES: &[(&str, &str)] = &[
        (
            "badly indented workflow",
            r#"import "recipes/support.flow"
/// A ticket attachment.
type Attachment = { url: string, name: string }
workflow support_triage {
input { ticket_id: string
  attachments: list<Attachment> }
    timeout 5m
  step classify = classify_ticket { subject: workflow_input.subject, body: "{{workflow_input.body}}" } retry 3 backoff 2s..30s timeout 60s
  if step.classify.urgency>=4&&!false {
       step escalate = handoff "tier2" { message: "{{workflow_input.ticket_id}}" } // page tier 2
  } else {
  }
  output { refunded: step.refund?.approved??false }
}
"#,
        ),
        (
            "comments on their own lines and at line ends",
            "workflow w {\n        // leading comment\n  step a = r { x: 1 }   // trailing comment  \n/* block */ step b = r { x: 2 }\n    /* multi   \n       line */\n  step c = r {\n    x: 3, /* inline */ y: 4\n  // last\n  }\n}\n",
        ),
        (
            "hyphenated tool names stay whole",
            "workflow w {\n  department   \"support\"\n step s = everything.get-sum{a:1,b:-2} retry 1\n step t = everything.step-2 {}\n}\n",
        ),
        (
            "destinations each on a line, an email's recipients spaced",
            "workflow w {\n  input { id: string }  deliver on completed,failed to webhook \"crm\" deliver   on completed to email[\"leads\" ,\"a@b.io\"] subject \"{{workflow_input.id}}\" body \"{{output.reply}}\"\n deliver on completed to kb \"notes\" title \"t\" content output.reply\n  output { reply: \"r\" }\n}\n",
        ),
        (
            "doc comments",
            "///   Spacing inside a doc comment is kept.\ntype Ticket = {\n/// The id.\n      id: string\n  /// How urgent.\n  priority: \"low\"|\"high\"\n}\n",
        ),
        (
            "triple strings keep their odd indentation",
            "recipe summarise {\nmodel \"fast\"\n      prompt \"\"\"\n    Summarise {{input.text}}.\n\n\n        Keep it short.   \n  \"\"\"\n  output { summary: string }\n}\n",
        ),
        (
            "blank lines collapse",
            "\n\nworkflow w {\n\n\n  step a = r {}\n\n\n\n  step b = r {\n\n    x: [\n\n      1,\n\n\n      2\n\n    ]\n\n  }\n\n}\n\n\n",
        ),
        (
            "operators",
            "workflow w {\n  if !( step.a.score>=0.5||step.a.label==\"spam\" )&&workflow_input.n<3 {\n    step b = r { ok: step.a?.ok??false , tags: [ \"x\",\"y\" ] , n : -3 }\n  }\n}\n",
        ),
        (
            "list types",
            "type T = { tags: list < string >, nested: list<list<\"a\"|\"b\">>, maybe: ( \"a\"|\"b\" ) ?, n: int ?, rows: list<{ a: int }> }\nworkflow w {\n  if step.a.list < 3 && step.a.n > 2 {\n  }\n}\n",
        ),
        (
            "ranges, paths and indexes",
            "workflow w {\n  step a = r {} retry 3 backoff 2s .. 30s timeout 60s\n  step b = r { v: step . a ?. rows[0][1] . x ?? false }\n  output { y: step.x?.y ?? false }\n}\nmcp browser {\n  command \"npx\" args [\"@playwright/mcp\", \"--headless\"]\n}\n",
        ),
        (
            "nested brackets opened on one line indent once",
            "workflow w {\n  step a = r { tags: [\n\"a\",\n\"b\"\n] }\n  step b = approval { approvers: [\"ops\"],\n  message: \"ok?\" }\n}\n",
        ),
        (
            "tabs and carriage returns",
            "workflow w {\r\n\tstep a = r {}\t\r\n\r\n\r\n\tstep b = r {}\r\n}",
        ),
        (
            "tokens that would merge keep a space",
            "x ! = y ? . z ? ? 2 .5 \"\" \"\"\"a\" a -3 - 3 @ x",
        ),
        (
            "step options on continuation lines",
            r#"workflow incident {
  step history = similar_incidents { service: workflow_input.service }
  timeout 30s on_error continue
  step dashboard = browser.browser_navigate { url: workflow_input.alert.dashboard_url }
retry 2 backoff 1s..5s timeout 30s on_error continue idempotency "{{workflow_input.incident_id}}-dashboard"
  step next = r {}
          retry 2
     backoff 1s..5s

    // Why this timeout.
  timeout 30s /* trailing */
  /* leading */ on_error continue
}
"#,
        ),
        (
            "options after a multi-line record",
            "workflow w {\n  for workflow_input.xs as xs {\n    step score = score_contact {\n      contact: loop_item\n      timeout: 3\n    }\n    retry 3\n    step tags = r { tags: [\n      \"a\"\n    ], n: 1 }\n    timeout 5s\n  }\n  retry 1\n}\n",
        ),
        (
            "workflow settings are not continuation lines",
            "workflow a {\n    timeout 5m\n  on_error continue\n}\nworkflow b {\n  input { x: string }\n    timeout 5m\n}\nworkflow c {\n  input {\n    x: string\n  }\n    timeout 5m\n  context kb \"docs\"\n    timeout 5m\n  step a = r {}\n}\n",
        ),
        (
            "a fallback block on a continuation line",
            r#"workflow w {
  on_error fallback {
  step page = handoff "oncall" { message: "{{error.message}}" }
  }
  parallel respond {
    branch comms {
      step status = status_update { service: workflow_input.service }
        retry 3 backoff 2s..10s timeout 45s
      on_error fallback {
      // By hand.
      step by_hand = handoff "comms" {
      message: "{{error.message}}"
      }
      retry 1
      }
      timeout 5s
    }
  }
  if step.x.ok {
    step y = r {}
  }
  timeout 5s
}
"#,
        ),
        (
            "step as a path or a field does not start a step",
            "workflow w {\n  step a = r { v: 1,\n    step: 2 }\n  retry 1\n  if true &&\n  step.a.v {\n  }\n  retry 1\n}\n",
        ),
        (
            "one statement per line, whatever the input's lines",
            "workflow w { input { xs: list<string> } step a = r { v: workflow_input.xs [0] } if step.a.ok { step b = r {} } else { step c = r {} } output { n: step.a.n } }\nmcp m { command \"npx\" args[\"x\"] }",
        ),
        (
            "a record too wide for a line gets a line per field",
            "workflow w {\n  step a = r { subject: workflow_input.subject, body: \"{{workflow_input.body}}\", plan: workflow_input.customer.plan } retry 3\n  step b = r {\n    a: 1,\n    b: 2,\n  }\n}\n",
        ),
        (
            "a block comment between else and if keeps them on one line",
            "workflow w {\n  if true {\n    step a = r {}\n  } // why\n  else /* because */ if false {\n    step b = r {}\n  }\n}\n",
        ),
        (
            "a union that starts with a bar has an alternative a line",
            "type Tier = | \"free\" | \"pro\"   // paid\n| \"enterprise\"\ntype Plain = \"a\"\n  | \"b\"\ntype T = {\n  tier: | \"a\" | \"b\"\n}\ntype Lead =\n  // Why.\n  | \"x\" | (\"y\" | \"z\")?\ntype L = | list<\"a\" | \"b\"> | list<\"c\">\n",
        ),
        (
            "a union's alternative after a comment is a continuation line",
            "type E = \"a\" // c\n| \"b\" /* d */ | \"c\"\nworkflow w {}\n",
        ),
        (
            "a mock's `fails timeout` stays on its line",
            "test \"t\" {\n  workflow w\n  mock step.c fails timeout twice then fails timeout once then { cat: \"a\" }\n  expect status completed\n}\n",
        ),
        ("empty file", " \n\n\t\n"),
    ];

    #[test]
    fn named_cases() {
        let mut rendered = String::new();
        for (name, input) in CASES {
            let output = format_tokens(input).unwrap_or_else(|e| format!("refused: {e}\n"));
            rendered.push_str(&format!("=== {name}\n{output}\n"));
        }
        insta::assert_snapshot!(rendered);
    }

    #[test]
    fn named_cases_are_idempotent() {
        for (name, input) in CASES {
            let once = format_tokens(input).unwrap();
            assert_eq!(format_tokens(&once), Ok(once.clone()), "case: {name}");
            assert_eq!(
                significant_tokens(&once),
                significant_tokens(input),
                "case: {name}"
            );
        }
    }

    /// Regression: a file that did not parse was laid out anyway, and a
    /// word of a `#` comment became a statement of its own, `=>` became
    /// `= >` and `{{` became `{ {`, each drawing other errors than the file had.
    #[test]
    fn a_file_that_does_not_parse_is_refused() {
        let broken = "workflow w {\n  step a = r { text: \"x\" } # the first step\n  step b => r { text: {{ step.a.s }} }\n}\n";
        let refused = format_source(broken).expect_err("refused");
        assert!(
            refused
                .message
                .contains("a file that does not parse is not formatted"),
            "{refused}"
        );
        assert_eq!(refused.offset, broken.find('#').expect("a `#`"));
    }

    /// Regression: a CRLF file came back with `\n` line endings, but for
    /// the `\r\n` inside its `"""` strings: mixed.
    #[test]
    fn a_crlf_file_keeps_its_line_endings() {
        let crlf = "workflow w {\r\n  output { a: \"\"\"x\r\ny\"\"\" }\r\n}\r\n";
        let formatted = format_source(crlf).expect("formats");
        assert_eq!(
            formatted.matches("\r\n").count(),
            formatted.matches('\n').count()
        );
        assert_eq!(format_source(&formatted).as_deref(), Ok(formatted.as_str()));
    }

    /// Regression: a byte order mark was laid out as a token, a line of
    /// its own.
    #[test]
    fn a_byte_order_mark_stays_where_it_is() {
        let marked = "\u{FEFF}workflow w {\n  output { a: 1 }\n}\n";
        assert_eq!(format_source(marked).as_deref(), Ok(marked));
    }

    #[test]
    fn untokenisable_sources_are_refused() {
        let unterminated = |offset: usize, what: &str| {
            Err(FormatError {
                offset,
                message: format!("unterminated {what}"),
            })
        };
        assert_eq!(format_tokens("x = \"oops }\n"), unterminated(4, "string"));
        assert_eq!(format_tokens("x = \"oops\\"), unterminated(4, "string"));
        assert_eq!(
            format_tokens("a /* never closed"),
            unterminated(2, "block comment")
        );
        // Without a closing `"""` the grammar reads `""` and then a plain string.
        assert_eq!(format_tokens("p \"\"\"abc\n"), unterminated(4, "string"));
        assert_eq!(
            format_tokens("p \"\"\"abc\"").as_deref(),
            Ok("p \"\" \"abc\"\n")
        );
    }

    #[test]
    fn indentation_is_capped() {
        let formatted = format_tokens(&"{\n".repeat(100)).unwrap();
        let widest = formatted.lines().map(str::len).max();
        assert_eq!(widest, Some(2 * MAX_INDENT_LEVELS + 1));
    }

    /// Brackets nested or left unbalanced by the ten thousand format in
    /// time linear in the input: the layout looks at most a line's worth of
    /// tokens ahead of a bracket, and never searches the brackets open.
    #[test]
    fn deep_and_unbalanced_brackets_format_in_linear_time() {
        let started = std::time::Instant::now();
        for source in [
            "[".repeat(50_000) + &"]".repeat(50_000),
            "{".repeat(50_000) + &"]".repeat(50_000),
            "{ a: [".repeat(25_000) + &")".repeat(50_000),
        ] {
            assert!(format_tokens(&source).is_ok());
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    /// The tokens of a source as the parser sees them: comments compare without the
    /// trailing whitespace the formatter removes, and without commas, which the
    /// layout writes between a record's fields on one line and drops on several
    /// (the grammar makes them optional there).
    fn significant_tokens(source: &str) -> Vec<(Kind, String)> {
        tokenize(source)
            .0
            .iter()
            .filter(|token| token.text != ",")
            .map(|token| (token.kind, emitted_text(token).into_owned()))
            .collect()
    }

    /// The files whose layout is checked by CI: the examples and the test
    /// fixtures, as `(path, text)`.
    fn sources() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut found = Vec::new();
        let mut folders = vec![root.join("examples"), root.join("tests/fixtures")];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "flow") {
                    let text = std::fs::read_to_string(&path).expect("readable");
                    found.push((path.display().to_string(), text));
                }
            }
        }
        found
    }

    /// The same tokens with other line breaks and spaces give the same file:
    /// every token on a line of its own, or all on one line, format as the
    /// file does, but for blank lines (the one part of the layout kept). A
    /// comment keeps its side: at the end of a line of code or on its own.
    #[test]
    fn the_layout_is_the_same_whatever_the_input_layout() {
        let without_blank_lines = |text: &str| {
            text.lines()
                .filter(|line| !line.trim().is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let respaced = |source: &str, apart: &str| {
            let mut out = String::new();
            let (tokens, _) = tokenize(source);
            for (index, token) in tokens.iter().enumerate() {
                let after_comment = index > 0 && tokens[index - 1].kind == Kind::LineComment;
                let own_line = matches!(token.kind, Kind::LineComment | Kind::BlockComment)
                    && token.newlines_before > 0;
                if index > 0 {
                    out.push_str(if after_comment || own_line {
                        "\n"
                    } else if matches!(token.kind, Kind::LineComment | Kind::BlockComment) {
                        " "
                    } else {
                        apart
                    });
                }
                out.push_str(token.text);
            }
            out
        };
        let sources = sources();
        assert!(sources.len() >= 6, "{} sources", sources.len());
        for (path, text) in sources {
            let formatted = without_blank_lines(&format_tokens(&text).unwrap());
            for apart in [" ", "\n", "\n  \t "] {
                let other = format_tokens(&respaced(&text, apart)).unwrap();
                assert_eq!(
                    without_blank_lines(&other),
                    formatted,
                    "{path} with tokens {apart:?} apart"
                );
            }
        }
    }

    /// Regression (found by `token_soup_formats_stably`): the width after a
    /// block comment counted its whole text, `\r` included, so a record
    /// after it was laid out one way, and the other once `\r\n` was `\n`.
    #[test]
    fn a_comment_across_lines_lays_out_the_same_with_either_line_end() {
        let source = "_1?.}_1*/*/ _1\t!\"\"\" _1\t\n\n\n 1.5  1.5x_1 _1   _1\t    on_error5m_11.5_1 _1\r\n */{x{{{{{?.";
        check_formats_stably(source).unwrap();
    }

    /// Regression (found by `token_soup_formats_stably`): a `,` after a
    /// stray `)` was kept the first time and dropped the second.
    #[test]
    fn a_comma_after_a_stray_paren_formats_the_same_twice() {
        check_formats_stably("{)list,: ").unwrap();
        check_formats_stably("{,,").unwrap();
    }

    fn check_formats_stably(source: &str) -> Result<(), TestCaseError> {
        if let Ok(once) = format_tokens(source) {
            prop_assert_eq!(format_tokens(&once), Ok(once.clone()));
            prop_assert_eq!(significant_tokens(&once), significant_tokens(source));
        }
        Ok(())
    }

    /// Pieces of .flow text, chosen so that random sequences of them hit the tricky
    /// spots: tokens that merge when written tight, strings and comments that open and
    /// close, brackets that do not match, `list<` against a comparison, and step options
    /// on lines of their own.
    const FRAGMENTS: &[&str] = &[
        " ", " ", "\n", "\n\n\n", "\t", "\r\n", "{", "}", "[", "]", "(", ")", "<", ">", "list",
        "step", "timeout", "on_error", "x", "_1", "é", ".", "..", "?", "?.", "??", "!", "=", "==",
        "<=", "&", "|", ",", ":", "-", "2", "0", "5m", "1.5", "\"", "\"\"", "\"\"\"", "\"a b\"",
        "\\", "/", "//", "///", "/*", "*/", "*", ";",
    ];

    proptest! {
        #[test]
        fn arbitrary_text_formats_stably(source in any::<String>()) {
            check_formats_stably(&source)?;
        }

        #[test]
        fn token_soup_formats_stably(
            parts in proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..60)
        ) {
            check_formats_stably(&parts.concat())?;
        }
    }
}
