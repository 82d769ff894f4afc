//! The template parser: decodes a string literal's raw text into literal parts
//! and `{{ path }}` references, keeping exact source offsets for every name.
//!
//! It is separate from the pest grammar on purpose: strings are one token to the
//! grammar, and their inside has its own small language. Decoding happens once,
//! here, so the runtime renders a pre-split template in one pass and text that an
//! LLM returns is never parsed as a template.

use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId, Span};
use crate::syntax::ast::{Name, Path, Segment, StringLit, Template, TemplatePart};

/// Parses a string literal whose raw source text (quotes included) starts at
/// byte `offset` of the file.
pub(crate) fn parse_string(
    raw: &str,
    offset: usize,
    file: FileId,
    problems: &mut Vec<Diagnostic>,
) -> StringLit {
    let span = Span::new(offset, offset + raw.len());
    let mut builder = Builder {
        parts: Vec::new(),
        text: String::new(),
        file,
        problems,
    };
    if let Some(body) = raw
        .strip_prefix("\"\"\"")
        .and_then(|r| r.strip_suffix("\"\"\""))
    {
        builder.triple(body, offset + 3);
    } else {
        let body = raw
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or("");
        builder.line(body, offset + 1, true);
    }
    builder.flush();
    StringLit {
        template: Template {
            parts: super::exact(builder.parts),
        },
        span,
    }
}

struct Builder<'p> {
    parts: Vec<TemplatePart>,
    text: String,
    file: FileId,
    problems: &'p mut Vec<Diagnostic>,
}

impl Builder<'_> {
    fn flush(&mut self) {
        if !self.text.is_empty() {
            // A copy, not the buffer itself: short text fits in the part,
            // and the buffer is kept for the next part.
            self.parts
                .push(TemplatePart::Text(self.text.as_str().into()));
            self.text.clear();
        }
    }

    /// A `"""` string: raw text whose first line (when blank), last line (when
    /// blank) and common indentation are removed, like Kotlin's `trimIndent`.
    fn triple(&mut self, body: &str, offset: usize) {
        let mut lines: Vec<(usize, &str)> = Vec::new();
        let mut start = 0;
        for line in body.split('\n') {
            lines.push((start, line));
            start += line.len() + 1;
        }
        // Indentation is spaces and tabs only, so that cutting it always lands
        // on a character boundary, whatever other whitespace a line holds.
        let leading = |line: &str| line.len() - line.trim_start_matches([' ', '\t']).len();
        let blank = |line: &str| line.trim_matches([' ', '\t', '\r']).is_empty();
        if lines.len() > 1 && blank(lines[0].1) {
            lines.remove(0);
        }
        if lines.len() > 1 && lines.last().is_some_and(|(_, l)| blank(l)) {
            lines.pop();
        }
        let indent = lines
            .iter()
            .filter(|(_, line)| !blank(line))
            .map(|(_, line)| leading(line))
            .min()
            .unwrap_or(0);
        for (index, (line_start, line)) in lines.iter().enumerate() {
            if index > 0 {
                self.text.push('\n');
            }
            let cut = indent.min(leading(line));
            let line = line[cut..].trim_end_matches('\r');
            self.line(line, offset + line_start + cut, false);
        }
    }

    /// One line of template text starting at file offset `offset`.
    fn line(&mut self, line: &str, offset: usize, escapes: bool) {
        let mut chars = line.char_indices().peekable();
        while let Some((index, c)) = chars.next() {
            if escapes && c == '\\' {
                let Some((_, escaped)) = chars.next() else {
                    break;
                };
                match escaped {
                    'n' => self.text.push('\n'),
                    't' => self.text.push('\t'),
                    'r' => self.text.push('\r'),
                    '"' | '\\' | '{' | '}' => self.text.push(escaped),
                    // `\u{1F600}`: any character by its code point, so that
                    // every string (a control character of a model's answer
                    // that `flow test-from` writes) has a literal.
                    'u' => {
                        let digits: String = line[index + 2..]
                            .strip_prefix('{')
                            .and_then(|rest| rest.split_once('}'))
                            .map(|(digits, _)| digits.to_string())
                            .unwrap_or_default();
                        // `from_str_radix` takes a sign too (`+41`).
                        let decoded = ((1..=6).contains(&digits.len())
                            && digits.bytes().all(|b| b.is_ascii_hexdigit()))
                        .then(|| u32::from_str_radix(&digits, 16).ok())
                        .flatten()
                        .and_then(char::from_u32);
                        match decoded {
                            Some(c) => {
                                self.text.push(c);
                                // `{`, the digits and `}`.
                                for _ in 0..digits.len() + 2 {
                                    chars.next();
                                }
                            }
                            None => {
                                let at = offset + index;
                                // `\u`, and its braces where they close soon
                                // after: they go with it, not into the text.
                                let written = match line[index + 2..].find('}') {
                                    Some(end) if line[index + 2..].starts_with('{') && end <= 8 => {
                                        end + 3
                                    }
                                    _ => 2,
                                };
                                // By byte, as `written` counts: a character of
                                // several bytes in the braces is one char.
                                while chars
                                    .peek()
                                    .is_some_and(|(next, _)| *next < index + written)
                                {
                                    chars.next();
                                }
                                self.problems.push(
                                    Diagnostic::new(
                                        Code::Template,
                                        self.file,
                                        Span::new(at, at + written),
                                        format!("`{}` is not a character", &line[index..index + written]),
                                    )
                                    .label("not a character")
                                    .hint("a character by its code point is `\\u{` and 1 to 6 hexadecimal digits `}`, such as `\\u{1F600}`, outside U+D800 to U+DFFF"),
                                );
                            }
                        }
                    }
                    other => {
                        let at = offset + index;
                        self.problems.push(
                            Diagnostic::new(
                                Code::Template,
                                self.file,
                                Span::new(at, at + 1 + other.len_utf8()),
                                format!("unknown escape `\\{other}`"),
                            )
                            .label("not an escape")
                            .hint("the escapes are \\n \\t \\r \\\" \\\\ \\{ \\} and \\u{...}"),
                        );
                    }
                }
            } else if c == '{' && line[index..].starts_with("{{") {
                chars.next();
                let inner_start = index + 2;
                match line[inner_start..].find("}}") {
                    Some(length) => {
                        let inner = &line[inner_start..inner_start + length];
                        self.reference(inner, offset + inner_start, offset + index);
                        // Skip the reference and its closing braces.
                        let resume = inner_start + length + 2;
                        while chars.peek().is_some_and(|(i, _)| *i < resume) {
                            chars.next();
                        }
                    }
                    None => {
                        let at = offset + index;
                        self.problems.push(
                            Diagnostic::new(
                                Code::Template,
                                self.file,
                                Span::new(at, offset + line.len()),
                                "`{{` is not closed by `}}`",
                            )
                            .label("this reference is not closed")
                            .hint(if escapes {
                                "close it with `}}`, or write a literal `{{` as `\\{{`"
                            } else {
                                // A raw string has no escapes.
                                "close it with `}}`; a literal `{{` goes in a plain string, as `\\{{`"
                            }),
                        );
                        // Kept as text: a string left with nothing read
                        // as empty, and an idempotency key or a name was
                        // then also "empty" (an audit).
                        self.text.push_str(&line[index..]);
                        return;
                    }
                }
            } else {
                if c == '{' {
                    self.single_braces(line, index, offset, escapes);
                }
                self.text.push(c);
            }
        }
    }

    /// Warns of `{path}` or `${path}` at `index` of `line`, the interpolation
    /// of other languages, which flow keeps as text. `{path}` alone is only
    /// suspected when its path starts with a reference root, since prompts
    /// often show placeholders such as `{title}` on purpose.
    fn single_braces(&mut self, line: &str, index: usize, offset: usize, escapes: bool) {
        // A reference is short: looking further would make a long line of
        // braces quadratic.
        const LONGEST: usize = 200;
        let Some(length) = line.as_bytes()[index + 1..]
            .iter()
            .take(LONGEST)
            .position(|b| *b == b'}')
        else {
            return;
        };
        let inner = line[index + 1..index + 1 + length].trim();
        let dollar = line[..index].ends_with('$');
        let Ok(path) = parse_path(inner, 0) else {
            return;
        };
        // A workflow's roots, and `input` of a recipe's prompt; after `$`,
        // any name but a shell's variable (`${HOME}`). A `\` before the
        // brace says it is meant, even where it escapes nothing (`"""`).
        let root = path.root.text.as_str();
        let is_root = root == "input" || crate::syntax::ROOTS.contains(&root);
        let shell = root.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
        // Nor after an escaped brace: `\{{path}}` is the documented way to
        // write `{{path}}` as text (regression: warned, with the advice to
        // write what was written).
        let before = &line[..index];
        if before.ends_with('\\') || before.ends_with("\\{") || !(is_root || dollar && !shell) {
            return;
        }
        let start = offset + index - usize::from(dollar);
        let end = offset + index + 1 + length + 1;
        let written = &line[index - usize::from(dollar)..index + 1 + length + 1];
        let mut diagnostic = Diagnostic::new(
            Code::LiteralBraces,
            self.file,
            Span::new(start, end),
            format!("`{written}` stays literal text"),
        )
        .label("not a reference")
        .hint(format!(
            "write `{{{{{inner}}}}}` to insert the value: references go between double braces"
        ))
        .fix(format!("{{{{{inner}}}}}"));
        if escapes {
            diagnostic = diagnostic.hint(format!(
                "to keep the braces as text, escape the first: `{}\\{{{inner}}}`",
                if dollar { "$" } else { "" }
            ));
        }
        self.problems.push(diagnostic);
    }

    /// The inside of `{{ ... }}` at file offset `offset`; `open` is where `{{` is.
    fn reference(&mut self, inner: &str, offset: usize, open: usize) {
        let trimmed_start = inner.len() - inner.trim_start().len();
        let text = inner.trim();
        let start = offset + trimmed_start;
        match parse_path(text, start) {
            Ok(path) => {
                self.flush();
                self.parts.push(TemplatePart::Ref(path));
            }
            Err((at, message)) => {
                let span = if text.is_empty() {
                    Span::new(open, offset + inner.len() + 2)
                } else {
                    // The whole character: `é` is two bytes.
                    let width = text
                        .get(at.saturating_sub(start)..)
                        .and_then(|rest| rest.chars().next())
                        .map_or(1, char::len_utf8);
                    Span::new(at, (at + width).min(start + text.len()).max(at))
                };
                self.problems.push(
                    Diagnostic::new(Code::Template, self.file, span, message)
                        .label("in this reference")
                        .hint("a reference is a path such as `workflow_input.field`, `step.id.field[0]` or `loop_item.field`"),
                );
            }
        }
    }
}

/// Parses a reference path (`step.a?.b[0]`) starting at file offset `offset`.
/// On failure gives the offset of the offending character and a message.
pub(crate) fn parse_path(text: &str, offset: usize) -> Result<Path, (usize, String)> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    let name_at = |pos: usize| -> Option<usize> {
        let first = *bytes.get(pos)?;
        if !(first.is_ascii_alphabetic() || first == b'_') {
            return None;
        }
        let mut end = pos + 1;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        Some(end)
    };
    if text.is_empty() {
        return Err((offset, "empty reference `{{}}`".to_string()));
    }
    let Some(end) = name_at(0) else {
        return Err((offset, "a reference starts with a name".to_string()));
    };
    let root = Name {
        text: text[..end].into(),
        span: Span::new(offset, offset + end),
    };
    pos = end.max(pos);
    let mut segments = Vec::new();
    while pos < bytes.len() {
        let (optional, after) = if text[pos..].starts_with("?.") {
            (true, pos + 2)
        } else if bytes[pos] == b'.' {
            (false, pos + 1)
        } else if bytes[pos] == b'[' {
            let close = text[pos..]
                .find(']')
                .map(|i| pos + i)
                .ok_or((offset + pos, "`[` is not closed by `]`".to_string()))?;
            let digits = &text[pos + 1..close];
            let index = digits
                .parse::<i64>()
                .ok()
                .filter(|index| *index >= 0)
                .ok_or((
                    offset + pos + 1,
                    "an index is a whole number, 0 or more".to_string(),
                ))?;
            segments.push(Segment::Index {
                index,
                span: Span::new(offset + pos, offset + close + 1),
            });
            pos = close + 1;
            continue;
        } else {
            // Jinja's and Liquid's filters (`{{x | upper}}`): the value
            // is inserted as it is.
            let rest = text[pos..].trim_start();
            if let Some(filter) = rest.strip_prefix('|')
                && !filter.starts_with('|')
            {
                let at = offset + text.len() - rest.len();
                let name = filter.trim();
                return Err((
                    at,
                    format!(
                        "a reference has no filters (`| {name}`): its value is inserted as it is"
                    ),
                ));
            }
            // Arithmetic or a comparison (`{{n * 2}}`): a template inserts
            // a value and computes nothing.
            if let Some(op) = [
                "*", "+", "-", "/", "%", "==", "!=", ">", "<", "&&", "||", "??",
            ]
            .into_iter()
            .find(|op| rest.starts_with(op))
            {
                let at = offset + text.len() - rest.len();
                return Err((
                    at,
                    format!(
                        "a reference inserts a value and computes nothing (`{op}`): what is computed belongs in a recipe or a step's input"
                    ),
                ));
            }
            let c = text[pos..].chars().next().unwrap_or(' ');
            if crate::syntax::cursor::is_foreign_letter(c) {
                return Err((
                    offset + pos,
                    format!("`{c}` is not an ASCII letter, as the letters of a name are"),
                ));
            }
            if c.is_whitespace() {
                return Err((
                    offset + pos,
                    "a reference is one path and nothing after it: a space ends it here"
                        .to_string(),
                ));
            }
            return Err((offset + pos, format!("unexpected `{c}` in a reference")));
        };
        let end = name_at(after).ok_or((offset + after, "expected a field name".to_string()))?;
        segments.push(Segment::Field {
            name: Name {
                text: text[after..end].into(),
                span: Span::new(offset + after, offset + end),
            },
            optional,
        });
        pos = end;
    }
    Ok(Path {
        root,
        segments: super::exact(segments),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::ast::path_text;

    fn parse(raw: &str) -> (Vec<String>, Vec<String>) {
        let mut problems = Vec::new();
        let lit = parse_string(raw, 0, FileId(0), &mut problems);
        let parts = lit
            .template
            .parts
            .iter()
            .map(|part| match part {
                TemplatePart::Text(text) => format!("text:{text}"),
                TemplatePart::Ref(path) => {
                    format!("ref:{}@{}", path_text(path), path.span().start)
                }
            })
            .collect();
        (parts, problems.into_iter().map(|p| p.message).collect())
    }

    #[test]
    fn splits_text_and_references_with_offsets() {
        let (parts, problems) = parse(r#""Ticket {{ workflow_input.id }}: {{step.c?.tags[0]}}""#);
        assert_eq!(
            parts,
            [
                "text:Ticket ",
                "ref:workflow_input.id@11",
                "text:: ",
                "ref:step.c?.tags[0]@35"
            ]
        );
        assert!(problems.is_empty());
    }

    #[test]
    fn decodes_escapes_and_escaped_braces() {
        let (parts, problems) = parse(r#""a\"b\n\{\{x}}""#);
        assert_eq!(parts, ["text:a\"b\n{{x}}"]);
        assert!(problems.is_empty());
    }

    /// `\u{...}` writes any character, so that `flow test-from` can write
    /// a model's answer holding a control character (an audit: it wrote
    /// the character raw, and the test did not parse).
    #[test]
    fn a_character_is_written_by_its_code_point() {
        let (parts, problems) = parse(r#""a\u{0}b\u{1F600}\u{41}{{x}}""#);
        assert_eq!(parts, ["text:a\0b\u{1F600}A", "ref:x@25"]);
        assert!(problems.is_empty(), "{problems:?}");
        for (written, text) in [
            (r#""\u{D800}x""#, "text:x"),
            (r#""\u{1234567}x""#, "text:x"),
            (r#""\u{zz}x""#, "text:x"),
            (r#""\u41x""#, "text:41x"),
            (r#""\u{+41}x""#, "text:x"),
            (r#""\u{é}x""#, "text:x"),
        ] {
            let (parts, problems) = parse(written);
            assert_eq!(parts, [text], "{written}");
            assert_eq!(problems.len(), 1, "{written}: {problems:?}");
            assert!(problems[0].ends_with("is not a character"), "{problems:?}");
        }
    }

    #[test]
    fn reports_unclosed_empty_and_malformed_references() {
        assert_eq!(
            parse(r#""{{workflow_input.x}""#).1,
            ["`{{` is not closed by `}}`"]
        );
        assert_eq!(parse(r#""{{ }}""#).1, ["empty reference `{{}}`"]);
        assert_eq!(
            parse(r#""{{step.a b}}""#).1,
            ["a reference is one path and nothing after it: a space ends it here"]
        );
        // An audit: `??` read as "unexpected a space", and `||` as a
        // filter named `|step.b`.
        for (written, op) in [
            (r#""{{step.a?.t ?? 'x'}}""#, "??"),
            (r#""{{step.a?.t||step.b?.t}}""#, "||"),
        ] {
            assert_eq!(
                parse(written).1,
                [format!(
                    "a reference inserts a value and computes nothing (`{op}`): what is computed belongs in a recipe or a step's input"
                )],
                "{written}"
            );
        }
        assert_eq!(
            parse(r#""{{step.a.n * 2}}""#).1,
            [
                "a reference inserts a value and computes nothing (`*`): what is computed belongs in a recipe or a step's input"
            ]
        );
        assert_eq!(
            parse(r#""{{step.a[x]}}""#).1,
            ["an index is a whole number, 0 or more"]
        );
        assert_eq!(parse(r#""\q""#).1, ["unknown escape `\\q`"]);
    }

    #[test]
    fn triple_strings_lose_common_indentation_and_keep_offsets() {
        let raw = "\"\"\"\n    Hello {{input.name}}\n      indented\n    \"\"\"";
        let (parts, problems) = parse(raw);
        assert_eq!(
            parts,
            ["text:Hello ", "ref:input.name@16", "text:\n  indented"]
        );
        assert!(problems.is_empty());
    }

    /// Regression: a line of non-ASCII whitespace counted as blank but was cut
    /// at the indentation's byte count, inside a character.
    #[test]
    fn dedent_never_cuts_inside_a_character() {
        let raw = "\"\"\"\n    hello\n\u{3000}\u{3000}\n    \"\"\"";
        let (parts, problems) = parse(raw);
        assert_eq!(parts, ["text:    hello\n\u{3000}\u{3000}"]);
        assert!(problems.is_empty());
    }

    #[test]
    fn a_lone_brace_is_text() {
        assert_eq!(parse(r#""{ json: 1 }""#).0, ["text:{ json: 1 }"]);
    }
}
