//! The lexical scan of a whole file: words, numbers, strings, comments and
//! operators, with their offsets. The formatter prints these tokens, and
//! semantic highlighting colours them; neither needs the parse tree, so
//! both work on a file with syntax errors.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An identifier or keyword.
    Word,
    /// An int, float or duration, possibly negative: `3`, `-3`, `1.5`, `5m`.
    Number,
    /// A `"..."` or `"""..."""` string, quotes included.
    Str,
    /// A `//` comment or a `///` doc comment, up to the end of the line.
    LineComment,
    /// A `/* ... */` comment, which may span lines.
    BlockComment,
    /// One of the language's operators or brackets.
    Punct,
    /// Any other single character; the language has no use for it.
    Other,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Token<'a> {
    pub(crate) kind: Kind,
    pub(crate) text: &'a str,
    /// The byte offset of the token in the source.
    pub(crate) start: usize,
    /// How many line breaks the whitespace before the token holds.
    pub(crate) newlines_before: usize,
    /// Whether any whitespace separates the token from the previous one.
    pub(crate) spaced: bool,
}

/// A string or block comment that the source never closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unterminated {
    /// Where it opens.
    pub(crate) offset: usize,
    /// `string` or `block comment`.
    pub(crate) what: &'static str,
}

/// The multi-character operators; they are matched before the single characters.
const TWO_CHAR_PUNCT: [&str; 9] = ["?.", "??", "==", "!=", "<=", ">=", "&&", "||", ".."];
const ONE_CHAR_PUNCT: &[u8] = b"{}[](),:=<>|!?.";

/// Splits a whole file into tokens, following the lexical rules of `syntax/flow.pest`
/// closely enough that every token the grammar reads atomically is one token here.
/// Text that no string or comment closes is still a token, so that highlighting
/// covers a file being typed: an unterminated string runs to the end of its line,
/// a block comment to the end of the file; the first of them is returned too.
pub(crate) fn tokenize(source: &str) -> (Vec<Token<'_>>, Option<Unterminated>) {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut unterminated = None;
    let mut pos = 0;
    let mut newlines_before = 0;
    let mut spaced = false;
    // Once a search for a closing `"""` has failed, every later search would fail too;
    // remembering that keeps a file full of `""` from being scanned quadratically.
    let mut no_closing_triple_quote = false;
    while let Some(&byte) = bytes.get(pos) {
        // The grammar's WHITESPACE: a lone `\r` is not a line break for it either.
        if matches!(byte, b' ' | b'\t' | b'\r' | b'\n') {
            newlines_before += usize::from(byte == b'\n');
            spaced = true;
            pos += 1;
            continue;
        }
        let rest = &source[pos..];
        let mut open = |what: &'static str, len: usize| {
            unterminated.get_or_insert(Unterminated { offset: pos, what });
            len
        };
        let (kind, len) = if rest.starts_with("//") {
            // A CRLF line's comment ends before its `\r`, which is the
            // line ending's, not the comment's.
            let end = rest.find('\n').unwrap_or(rest.len());
            (Kind::LineComment, rest[..end].trim_end_matches('\r').len())
        } else if let Some(body) = rest.strip_prefix("/*") {
            let len = match body.find("*/") {
                Some(end) => end + 4,
                None => open("block comment", rest.len()),
            };
            (Kind::BlockComment, len)
        } else if byte == b'"' {
            let len = match string_len(rest, &mut no_closing_triple_quote) {
                Some(len) => len,
                None => open("string", rest.find('\n').unwrap_or(rest.len())),
            };
            (Kind::Str, len)
        } else if byte.is_ascii_digit()
            || (byte == b'-' && bytes.get(pos + 1).is_some_and(u8::is_ascii_digit))
        {
            (Kind::Number, number_len(rest))
        } else if byte.is_ascii_alphabetic() || byte == b'_' {
            (Kind::Word, word_len(rest))
        } else if TWO_CHAR_PUNCT.iter().any(|punct| rest.starts_with(punct)) {
            (Kind::Punct, 2)
        } else if ONE_CHAR_PUNCT.contains(&byte) {
            (Kind::Punct, 1)
        } else {
            (Kind::Other, rest.chars().next().map_or(1, char::len_utf8))
        };
        tokens.push(Token {
            kind,
            text: &rest[..len],
            start: pos,
            newlines_before,
            spaced,
        });
        pos += len;
        newlines_before = 0;
        spaced = false;
    }
    (tokens, unterminated)
}

/// The length of the string literal at the start of `rest` (which starts with `"`), or
/// None when it is unterminated.
fn string_len(rest: &str, no_closing_triple_quote: &mut bool) -> Option<usize> {
    if !*no_closing_triple_quote && let Some(body) = rest.strip_prefix("\"\"\"") {
        match body.find("\"\"\"") {
            Some(end) => return Some(end + 6),
            // The grammar then reads `""` as an empty plain string, and so do we.
            None => *no_closing_triple_quote = true,
        }
    }
    let bytes = rest.as_bytes();
    let mut i = 1;
    loop {
        match bytes.get(i)? {
            b'"' => return Some(i + 1),
            b'\n' => return None,
            // An escape covers the next character, which may not be a line break.
            // Stepping over just its first byte is fine: the bytes of a multi-byte
            // character are never `"`, `\` or a line break.
            b'\\' => match bytes.get(i + 1) {
                None | Some(b'\n') => return None,
                Some(_) => i += 2,
            },
            _ => i += 1,
        }
    }
}

/// The length of the number at the start of `rest`. Trailing letters belong to it, so
/// that a duration (`5m`) or a malformed one (`5x`) is one token, as in the grammar.
fn number_len(rest: &str) -> usize {
    let bytes = rest.as_bytes();
    let digits_from = |i: usize| i + bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut len = digits_from(usize::from(bytes.first() == Some(&b'-')));
    if bytes.get(len) == Some(&b'.') && bytes.get(len + 1).is_some_and(u8::is_ascii_digit) {
        len = digits_from(len + 1);
    }
    len + word_len(&rest[len..])
}

fn word_len(rest: &str) -> usize {
    let bytes = rest.as_bytes();
    let is_name = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    let mut len = bytes.iter().take_while(|b| is_name(b)).count();
    // An MCP tool's name may have hyphens between name characters
    // (`get-sum`); a hyphen is nothing else after a word.
    while len > 0 && bytes.get(len) == Some(&b'-') && bytes.get(len + 1).is_some_and(is_name) {
        len += 1 + bytes[len + 1..].iter().take_while(|b| is_name(b)).count();
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a comment of a CRLF line held the line's `\r`, and the
    /// editor's token for it was one column longer than the line.
    #[test]
    fn a_line_comment_ends_before_a_crlf_line_ending() {
        let (tokens, unterminated) = tokenize("// hello\r\nx\n// end");
        assert!(unterminated.is_none());
        let comments: Vec<&str> = tokens
            .iter()
            .filter(|token| token.kind == Kind::LineComment)
            .map(|token| token.text)
            .collect();
        assert_eq!(comments, ["// hello", "// end"]);
    }
}
