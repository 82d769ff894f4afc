//! What surrounds the cursor in the text itself: inside a comment, a string or
//! a `{{ ... }}` reference, which brackets are open, and the path being typed.
//!
//! This is read from the text rather than the syntax tree because the text at
//! the cursor is usually unfinished: `{{step.` has no closing braces yet and
//! the parser has skipped it. A single forward scan from the start of the file
//! is exact about strings and comments, and costs well under a millisecond on
//! a large file.

/// Where the cursor is, lexically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lexical {
    Code,
    Comment,
    /// In a string, outside any reference.
    String {
        triple: bool,
    },
    /// Inside an unclosed `{{` of a string.
    Template {
        triple: bool,
    },
}

/// The state of the text at the cursor.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    pub(crate) lexical: Lexical,
    /// The brackets open at the cursor outside strings: (byte offset, bracket).
    pub(crate) open: Vec<(usize, u8)>,
    /// Where the string or comment the cursor is in opened (its `"`,
    /// `"""` or `/*`); 0 in code.
    pub(crate) opened: usize,
    /// Where the last `"..."` string that a line break ended without its
    /// closing quote opened, if one did.
    pub(crate) cut_string: Option<usize>,
}

/// Scans `text` up to `offset` (clamped to a character boundary).
pub(crate) fn scan(text: &str, offset: usize) -> Cursor {
    let bytes = text.as_bytes();
    let end = offset.min(bytes.len());
    let mut open = Vec::new();
    let mut lexical = Lexical::Code;
    let mut opened = 0;
    let mut cut_string = None;
    let mut i = 0;
    while i < end {
        let b = bytes[i];
        match lexical {
            Lexical::Code => match b {
                b'/' if bytes.get(i + 1) == Some(&b'/') => {
                    match memchr_newline(bytes, i) {
                        Some(newline) if newline < end => i = newline,
                        _ => {
                            lexical = Lexical::Comment;
                            opened = i;
                            i = end;
                        }
                    }
                    continue;
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    match text[i + 2..].find("*/") {
                        Some(close) if i + 2 + close + 2 <= end => i = i + 2 + close + 2,
                        _ => {
                            lexical = Lexical::Comment;
                            opened = i;
                            i = end;
                        }
                    }
                    continue;
                }
                b'"' => {
                    let triple = bytes[i..].starts_with(b"\"\"\"");
                    lexical = Lexical::String { triple };
                    opened = i;
                    i += if triple { 3 } else { 1 };
                    continue;
                }
                b'{' | b'[' | b'(' => open.push((i, b)),
                b'}' | b']' | b')' => {
                    open.pop();
                }
                _ => {}
            },
            Lexical::String { triple } | Lexical::Template { triple } => {
                let in_ref = matches!(lexical, Lexical::Template { .. });
                // A `\` escapes the next character, but not a line break:
                // the grammar ends a plain string there, so a `\` at the
                // end of a line does not carry the string on.
                if b == b'\\' && !triple && bytes.get(i + 1) != Some(&b'\n') {
                    i += 2;
                    continue;
                }
                if triple && bytes[i..].starts_with(b"\"\"\"") {
                    lexical = Lexical::Code;
                    opened = 0;
                    i += 3;
                    continue;
                }
                if !triple && (b == b'"' || b == b'\n') {
                    // A line break ends an unterminated plain string, as for the parser.
                    if b == b'\n' {
                        cut_string = Some(opened);
                    }
                    lexical = Lexical::Code;
                    opened = 0;
                } else if !in_ref && bytes[i..].starts_with(b"{{") {
                    lexical = Lexical::Template { triple };
                    i += 2;
                    continue;
                } else if in_ref && bytes[i..].starts_with(b"}}") {
                    lexical = Lexical::String { triple };
                    i += 2;
                    continue;
                }
            }
            Lexical::Comment => unreachable!("a comment runs to the cursor"),
        }
        i += 1;
    }
    // Scanned past the end of the text: the end of a file that does not
    // end its last line cuts a plain string there, as a line break would.
    if offset > bytes.len()
        && matches!(
            lexical,
            Lexical::String { triple: false } | Lexical::Template { triple: false }
        )
    {
        cut_string = Some(opened);
    }
    Cursor {
        lexical,
        open,
        opened,
        cut_string,
    }
}

fn memchr_newline(bytes: &[u8], from: usize) -> Option<usize> {
    bytes[from..]
        .iter()
        .position(|b| *b == b'\n')
        .map(|p| from + p)
}

/// A word character of names and paths.
pub(crate) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// How many bytes of name characters `text` starts with: the word there.
pub(crate) fn name_len(text: &str) -> usize {
    text.bytes().take_while(|b| is_name_byte(*b)).count()
}

/// How many bytes of name characters `text` ends with: the word typed
/// just before where it ends.
pub(crate) fn name_len_before(text: &str) -> usize {
    text.bytes().rev().take_while(|b| is_name_byte(*b)).count()
}

/// A letter or digit outside ASCII, or an accent written apart from its
/// letter (U+0300 – U+036F, as a decomposed `é` has it): what a name in
/// another language holds, and flow's names do not.
pub(crate) fn is_foreign_letter(c: char) -> bool {
    !c.is_ascii() && (c.is_alphanumeric() || matches!(c, '\u{0300}'..='\u{036F}'))
}

/// The reference path typed just before `offset`: `step.classify?.sum`
/// gives its start offset and text. Index segments are kept as written.
pub(crate) fn path_before(text: &str, offset: usize) -> (usize, &str) {
    let bytes = text.as_bytes();
    let mut start = offset.min(bytes.len());
    while start > 0 {
        let b = bytes[start - 1];
        if is_name_byte(b) || matches!(b, b'.' | b'?' | b'[' | b']') {
            start -= 1;
        } else {
            break;
        }
    }
    // A path starts with a letter or `_`; skip anything before (`1.5`, `?.`).
    while start < offset && !(bytes[start].is_ascii_alphabetic() || bytes[start] == b'_') {
        start += 1;
    }
    (start, &text[start..offset.min(bytes.len())])
}

/// The previous non-blank byte before `offset`, skipping `//` comments is not
/// needed: completion positions follow code on the same or an earlier line.
pub(crate) fn previous_byte(text: &str, offset: usize) -> Option<(usize, u8)> {
    let bytes = text.as_bytes();
    let mut i = offset.min(bytes.len());
    while i > 0 {
        i -= 1;
        if !bytes[i].is_ascii_whitespace() {
            return Some((i, bytes[i]));
        }
    }
    None
}

/// The words (names and keywords) just before `offset`, nearest last, at most
/// `count`, stopping at anything that is not a word or blank.
pub(crate) fn words_before(text: &str, offset: usize, count: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut words = Vec::new();
    let mut i = offset.min(bytes.len());
    while words.len() < count {
        while i > 0 && bytes[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        let end = i;
        while i > 0 && is_name_byte(bytes[i - 1]) {
            i -= 1;
        }
        if i == end {
            break;
        }
        words.push(&text[i..end]);
    }
    words.reverse();
    words
}

/// A name used in place of the half-typed text at the cursor when the text is
/// repaired for a re-check. It can never be a user's step id.
pub(crate) const PLACEHOLDER: &str = "__flow_cursor__";

/// A copy of `text` made parseable around `offset`: a placeholder name in
/// place of the path typed before the cursor, then whatever closes the
/// reference, string and brackets that the cursor's line left open. Returns
/// the copy and where the placeholder starts (the start of the typed path).
/// Offsets before that are unchanged, so an analysis of the copy answers for
/// the original there.
///
/// The typed path is left out so that every keystroke within one path gives
/// the same copy: `{{step.`, `{{step.s1` and `{{step.s1.su` are all repaired
/// to `{{__flow_cursor__}}`, and a caller can keep the copy's analysis while
/// the author types. What the path names is read from the original text.
pub(crate) fn repair(text: &str, offset: usize) -> (String, usize) {
    let offset = floor_boundary(text, offset);
    let (anchor, _) = path_before(text, offset);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let line_start = text[..anchor].rfind('\n').map_or(0, |i| i + 1);
    let rest = &text[offset..line_end];
    // Scanned to the path's start: a `[` typed in the path is left out too.
    let cursor = scan(text, anchor);
    let mut patched = String::with_capacity(text.len() + 32);
    patched.push_str(&text[..anchor]);
    patched.push_str(PLACEHOLDER);
    let mut tail = rest.to_string();
    // The part of the line's rest that is code, where brackets count.
    let mut code_from = Some(0);
    match cursor.lexical {
        Lexical::Template { triple } => {
            let close = rest.find("}}");
            if left_open(cursor.lexical, rest) {
                // Drop the rest of a broken reference: it cannot be repaired in place.
                tail = String::from("}}");
                if !triple {
                    tail.push('"');
                }
                code_from = None;
            } else if triple {
                code_from = None;
            } else {
                let after = close.unwrap_or(0) + 2;
                match rest[after..].find('"') {
                    Some(quote) => code_from = Some(after + quote + 1),
                    None => {
                        tail.push('"');
                        code_from = None;
                    }
                }
            }
        }
        Lexical::String { triple: false } => match rest.find('"') {
            Some(quote) => code_from = Some(quote + 1),
            None => {
                tail.push('"');
                code_from = None;
            }
        },
        Lexical::String { triple: true } | Lexical::Comment => code_from = None,
        Lexical::Code => {}
    }
    // A `"""` string that nothing closes runs to the end of the file, and
    // the step the cursor is in with it: closed on the cursor's line, as
    // the author is about to (regression, an audit: no completion in a
    // message being written top-down). Scanned from the start, a file
    // ends inside such a string whichever of its strings is the one left
    // open: a later string's quotes then pair the other way round. The
    // brackets open around it that the rest of the file does not close
    // (the step's or recipe's `{`, not typed yet) are closed with it.
    let raw_left_open = matches!(
        cursor.lexical,
        Lexical::String { triple: true } | Lexical::Template { triple: true }
    ) && matches!(
        scan(text, text.len()).lexical,
        Lexical::String { triple: true } | Lexical::Template { triple: true }
    );
    let opened_here: Vec<u8> = if raw_left_open {
        tail.push_str("\"\"\"");
        let unclosed = cursor
            .open
            .len()
            .saturating_sub(rest_closers(&text[line_end..]));
        cursor.open[cursor.open.len() - unclosed..]
            .iter()
            .map(|(_, b)| *b)
            .collect()
    } else {
        // What the cursor's line opened, of which the rest of the line
        // closes some (below).
        cursor
            .open
            .iter()
            .filter(|(at, _)| *at >= line_start)
            .map(|(_, b)| *b)
            .collect()
    };
    let mut closes = code_from.map_or(0, |from| rest_closers(&rest[from..]));
    for bracket in opened_here.iter().rev() {
        if closes > 0 {
            closes -= 1;
            continue;
        }
        tail.push(closing(*bracket));
    }
    patched.push_str(&tail);
    patched.push_str(&text[line_end..]);
    (patched, anchor)
}

/// Whether the reference or plain string open at the cursor stays open to
/// the end of the cursor's line, `rest` being the line after the cursor.
/// The parser then certainly reports it: a reference and a plain string end
/// on the line they start.
pub(crate) fn left_open(lexical: Lexical, rest: &str) -> bool {
    match lexical {
        Lexical::Template { triple: true } => !rest.contains("}}"),
        // Closed only by a `}}` before the string's closing quote.
        Lexical::Template { triple: false } => rest
            .find("}}")
            .is_none_or(|close| rest.find('"').is_some_and(|quote| quote < close)),
        Lexical::String { triple: false } => !rest.contains('"'),
        Lexical::String { triple: true } | Lexical::Comment | Lexical::Code => false,
    }
}

/// The bracket that closes `bracket` (`{`, `[` or `(`).
pub(crate) fn closing(bracket: u8) -> char {
    match bracket {
        b'{' => '}',
        b'[' => ']',
        _ => ')',
    }
}

/// How many closing brackets `rest` has beyond those it opens, outside strings.
fn rest_closers(rest: &str) -> usize {
    let mut depth: isize = 0;
    let mut closers = 0;
    let mut in_string = false;
    for b in rest.bytes() {
        match b {
            b'"' => in_string = !in_string,
            b'{' | b'[' | b'(' if !in_string => depth += 1,
            b'}' | b']' | b')' if !in_string => {
                if depth > 0 {
                    depth -= 1;
                } else {
                    closers += 1;
                }
            }
            _ => {}
        }
    }
    closers
}

pub(crate) fn floor_boundary(text: &str, offset: usize) -> usize {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_states() {
        let text = "a { b: \"x {{ step.";
        assert_eq!(
            scan(text, text.len()).lexical,
            Lexical::Template { triple: false }
        );
        assert_eq!(scan(text, 8).lexical, Lexical::String { triple: false });
        assert_eq!(scan(text, 3).lexical, Lexical::Code);
        assert_eq!(scan(text, 3).open, vec![(2, b'{')]);
        assert_eq!(scan("// {{", 5).lexical, Lexical::Comment);
        assert_eq!(
            scan("\"\"\"\n{{a}} {{", 12).lexical,
            Lexical::Template { triple: true }
        );
    }

    #[test]
    fn repairs_close_what_the_line_opened() {
        let text = "w {\n  s = r { t: \"{{step.\n}\n";
        let offset = text.find("step.").unwrap() + 5;
        assert_eq!(
            repair(text, offset),
            (
                "w {\n  s = r { t: \"{{__flow_cursor__}}\"}\n}\n".to_string(),
                offset - 5
            )
        );
        let text = "x: \"{{step.}}\" }";
        assert_eq!(
            repair(text, 11),
            ("x: \"{{__flow_cursor__}}\" }".to_string(), 6)
        );
    }

    /// A `"""` string nothing closes is closed on the cursor's line; one
    /// closed later is left to its own quotes.
    #[test]
    fn repairs_close_a_raw_string_left_open() {
        let before = "w {\n  s = h \"d\" {\n    message: \"\"\"\n      Ticket {{step.";
        let text = format!("{before}\n  }}\n}}\n");
        assert_eq!(
            repair(&text, before.len()),
            (
                "w {\n  s = h \"d\" {\n    message: \"\"\"\n      Ticket {{__flow_cursor__}}\"\"\"\n  }\n}\n"
                    .to_string(),
                before.len() - 5
            )
        );
        // The step's `}` not typed yet either: closed with the string.
        let text = format!("{before}\n}}\n");
        assert!(
            repair(&text, before.len())
                .0
                .ends_with("{{__flow_cursor__}}\"\"\"}\n}\n"),
        );
        let closed = format!("{before}\n  \"\"\" }}\n}}\n");
        assert_eq!(
            repair(&closed, before.len()).0,
            closed.replace("step.", "__flow_cursor__}}")
        );
    }

    #[test]
    fn keystrokes_in_one_path_give_one_repaired_copy() {
        let copies: Vec<_> = ["", "s", "s1", "s1.", "s1.su"]
            .iter()
            .map(|typed| {
                let before = format!("w {{\n  s = r {{ t: \"{{{{step.{typed}");
                repair(&format!("{before}\n}}\n"), before.len())
            })
            .collect();
        assert!(
            copies.windows(2).all(|pair| pair[0] == pair[1]),
            "{copies:?}"
        );
        // A `[` typed in the path is not closed in the copy: it is not there.
        assert_eq!(
            repair("x: [loop_item.tags[", 19),
            ("x: [__flow_cursor__]".to_string(), 4)
        );
    }

    #[test]
    fn paths_before_the_cursor() {
        assert_eq!(path_before("{{ step.a?.b", 12), (3, "step.a?.b"));
        assert_eq!(path_before("x: 1.5", 6), (6, ""));
        assert_eq!(words_before("step x = ", 7, 2), vec!["step", "x"]);
    }
}
