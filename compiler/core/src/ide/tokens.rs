//! Semantic tokens: every token of a file, so that an editor without a
//! grammar for flow highlights all of it. Names are highlighted by what they
//! resolve to (a step id, a field, a recipe, a type), inside strings as well
//! as bare, with the `{{` `}}` of templates marked so that a template reads
//! as code within the text around it; the rest (keywords, strings, comments,
//! numbers, durations, operators) comes from the lexical scan the formatter
//! uses, so that a file with syntax errors is highlighted too.

use crate::Checked;
use crate::diagnostic::{FileId, Span};
use crate::ide::visit;
use crate::syntax::ast::{Item, Segment, StepCall};
use crate::syntax::lex::{Kind, tokenize};

/// The words of the grammar that are not names: statements, members,
/// settings, options and literals. `grammar_words_are_highlighted` (below)
/// holds the list to `flow.pest`, but for the slip productions' words of
/// other languages, which flow does not have.
const GRAMMAR_WORDS: &[&str] = &[
    "approval",
    "approve",
    "args",
    "as",
    "attempts",
    "backoff",
    "body",
    "branch",
    "by",
    "command",
    "comment",
    "concurrency",
    "content",
    "context",
    "continue",
    "decide",
    "deliver",
    "department",
    "durability",
    "else",
    "email",
    "env",
    "expect",
    "expire",
    "fail",
    "fails",
    "fallback",
    "false",
    "for",
    "handoff",
    "idempotency",
    "if",
    "import",
    "input",
    "kb",
    "kb_write",
    "max",
    "mcp",
    "mock",
    "model",
    "not",
    "null",
    "on",
    "on_error",
    "once",
    "output",
    "parallel",
    "prompt",
    "ran",
    "recipe",
    "reject",
    "retry",
    "status",
    "step",
    "subject",
    "test",
    "then",
    "timeout",
    "times",
    "title",
    "to",
    "true",
    "twice",
    "type",
    "url",
    "wait",
    "webhook",
    "with",
    "workflow",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TokenKind {
    Keyword,
    /// The text of a string, around its template references.
    String,
    Comment,
    /// A `///` comment, which documents what follows it.
    DocComment,
    Number,
    /// A number with its unit: `30s`, `5m`, and malformed ones (`2w`).
    Duration,
    /// `==`, `&&`, `??`, `?.`, `..`, `|` and the other operators.
    Operator,
    /// `{{` and `}}` around a template reference.
    TemplateDelimiter,
    /// `workflow_input`, `step`, `loop_item`, ...
    Root,
    /// A step id, where it is defined or referenced.
    Step,
    Field,
    Recipe,
    Type,
    McpServer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SemanticToken {
    pub span: Span,
    pub kind: TokenKind,
    /// Where the name is defined rather than used.
    pub definition: bool,
}

/// The tokens of file `file`, sorted and without overlaps: the names the
/// tree resolves, and around them every other token of the text.
pub fn semantic_tokens(checked: &Checked, file: FileId) -> Vec<SemanticToken> {
    let named = named_tokens(checked, file);
    let Some(loaded) = checked.files.get(file.0 as usize) else {
        return named;
    };
    let lexical = lexical_tokens(&loaded.text);
    // Both lists are sorted; a lexical token that meets a named one gives
    // way to it (a step id is a word too).
    let mut merged = Vec::with_capacity(named.len() + lexical.len());
    let mut names = named.iter().peekable();
    for token in lexical {
        while let Some(name) = names.next_if(|name| name.span.end <= token.span.start) {
            merged.push(*name);
        }
        let overlaps = names
            .peek()
            .is_some_and(|name| name.span.start < token.span.end);
        if !overlaps {
            merged.push(token);
        }
    }
    merged.extend(names);
    merged
}

/// The tokens of the text alone, sorted and without overlaps.
fn lexical_tokens(text: &str) -> Vec<SemanticToken> {
    let (lexemes, _) = tokenize(text);
    let mut tokens = Vec::with_capacity(lexemes.len());
    let mut push = |start: usize, end: usize, kind: TokenKind| {
        if start < end {
            tokens.push(SemanticToken {
                span: Span::new(start, end),
                kind,
                definition: false,
            });
        }
    };
    for (index, lexeme) in lexemes.iter().enumerate() {
        let (start, end) = (lexeme.start, lexeme.start + lexeme.text.len());
        let kind = match lexeme.kind {
            Kind::Word => {
                let next = lexemes.get(index + 1).map(|next| next.text);
                let word = lexeme.text;
                if next == Some(":") {
                    // A field declared or given: `{ name: string }`,
                    // `{ subject: ... }`, whatever its name.
                    TokenKind::Field
                } else if crate::check::names_builtin_type(word) {
                    TokenKind::Type
                } else if GRAMMAR_WORDS.contains(&word) {
                    TokenKind::Keyword
                } else {
                    continue;
                }
            }
            Kind::Number if lexeme.text.ends_with(|c: char| c.is_ascii_alphabetic()) => {
                TokenKind::Duration
            }
            Kind::Number => TokenKind::Number,
            Kind::LineComment if lexeme.text.starts_with("///") => TokenKind::DocComment,
            Kind::LineComment | Kind::BlockComment => TokenKind::Comment,
            Kind::Punct
                if !matches!(
                    lexeme.text,
                    "{" | "}" | "[" | "]" | "(" | ")" | "," | ":" | "."
                ) =>
            {
                TokenKind::Operator
            }
            Kind::Str => {
                string_tokens(lexeme.text, start, &mut push);
                continue;
            }
            Kind::Punct | Kind::Other => continue,
        };
        push(start, end, kind);
    }
    tokens
}

/// The text of a string literal at `start` and the delimiters of its
/// template references; what is between the delimiters is left to the
/// names the tree resolves.
fn string_tokens(literal: &str, start: usize, push: &mut impl FnMut(usize, usize, TokenKind)) {
    let bytes = literal.as_bytes();
    let mut text_from = 0;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            // An escaped character is text, even a `{`.
            b'\\' => at += 2,
            b'{' if bytes.get(at + 1) == Some(&b'{') => {
                let Some(close) = literal[at + 2..].find("}}").map(|i| at + 2 + i) else {
                    break;
                };
                push(start + text_from, start + at, TokenKind::String);
                push(start + at, start + at + 2, TokenKind::TemplateDelimiter);
                push(
                    start + close,
                    start + close + 2,
                    TokenKind::TemplateDelimiter,
                );
                at = close + 2;
                text_from = at;
            }
            _ => at += 1,
        }
    }
    push(start + text_from, start + literal.len(), TokenKind::String);
}

/// The names of file `file` as the tree resolves them, sorted and without
/// overlaps.
fn named_tokens(checked: &Checked, file: FileId) -> Vec<SemanticToken> {
    let Some(loaded) = checked.files.get(file.0 as usize) else {
        return Vec::new();
    };
    let text = loaded.text.as_bytes();
    let mut tokens = Vec::new();
    let mut push = |span: Span, kind: TokenKind, definition: bool| {
        if !span.is_empty() {
            tokens.push(SemanticToken {
                span,
                kind,
                definition,
            });
        }
    };
    // Loops and parallel blocks have ids like steps; the analysis lists
    // them with the steps (of the root file only, which it checked).
    if file == FileId(0) {
        for workflow in &checked.analysis.workflows {
            for step in &workflow.steps {
                push(step.id_span, TokenKind::Step, true);
            }
        }
    }
    for item in &loaded.tree.items {
        match item {
            Item::Recipe(recipe) => push(recipe.name.span, TokenKind::Recipe, true),
            Item::Type(decl) => push(decl.name.span, TokenKind::Type, true),
            Item::Mcp(server) => push(server.name.span, TokenKind::McpServer, true),
            _ => {}
        }
        visit::type_names(item, &mut |name| push(name.span, TokenKind::Type, false));
        visit::steps(item, &mut |step| {
            push(step.id.span, TokenKind::Step, true);
            match &step.call {
                StepCall::Recipe { recipe, .. } => push(recipe.span, TokenKind::Recipe, false),
                StepCall::Browser { server, tool, .. } => {
                    push(server.span, TokenKind::McpServer, false);
                    push(tool.span, TokenKind::Field, false);
                }
                _ => {}
            }
        });
        visit::paths(item, &mut |path| {
            // A template reference is preceded by `{{` and blanks in the text.
            let mut before = path.span().start as usize;
            while before > 0 && text[before - 1].is_ascii_whitespace() {
                before -= 1;
            }
            if before >= 2 && &text[before - 2..before] == b"{{" {
                push(
                    Span::new(before - 2, before),
                    TokenKind::TemplateDelimiter,
                    false,
                );
                let mut after = path.span().end as usize;
                while after < text.len() && text[after].is_ascii_whitespace() {
                    after += 1;
                }
                if text[after..].starts_with(b"}}") {
                    push(
                        Span::new(after, after + 2),
                        TokenKind::TemplateDelimiter,
                        false,
                    );
                }
            }
            push(path.root.span, TokenKind::Root, false);
            for (index, segment) in path.segments.iter().enumerate() {
                if let Segment::Field { name, .. } = segment {
                    let kind = if index == 0 && matches!(path.root.text.as_str(), "step" | "loop") {
                        TokenKind::Step
                    } else {
                        TokenKind::Field
                    };
                    push(name.span, kind, false);
                }
            }
        });
    }
    tokens.sort();
    // Keep the first of overlapping tokens: editors refuse overlaps.
    let mut end = 0;
    tokens.retain(|token| {
        let keep = token.span.start >= end;
        if keep {
            end = token.span.end;
        }
        keep
    });
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every literal word of the grammar is highlighted as a keyword (or a
    /// type), but for the words of other languages that the slip
    /// productions read only to report them.
    #[test]
    fn grammar_words_are_highlighted() {
        let pest = include_str!("../syntax/flow.pest");
        let mut missing = Vec::new();
        for line in pest.lines() {
            let rule = line.split('=').next().unwrap_or_default().trim();
            if rule.ends_with("_slip") || rule == "in_word" || line.trim_start().starts_with("//") {
                continue;
            }
            for word in line.split('"').skip(1).step_by(2) {
                let is_word =
                    word.len() > 1 && word.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                if is_word && !GRAMMAR_WORDS.contains(&word) && word != "list" {
                    missing.push(word.to_string());
                }
            }
        }
        assert!(missing.is_empty(), "not highlighted: {missing:?}");
    }
}
