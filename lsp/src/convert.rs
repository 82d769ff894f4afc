//! Positions: LSP lines and characters (UTF-16 code units by default, UTF-8
//! bytes when the client accepts them) to the compiler's byte offsets and back.

use flow_compiler::Span;
use tower_lsp_server::ls_types::{Position, Range};

/// How the client counts characters within a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Utf8,
    Utf16,
}

/// The start of every line of a text, for conversions in O(log lines).
#[derive(Debug, Clone)]
pub struct Lines {
    starts: Vec<u32>,
    /// Whether each line is ASCII, where a character is a byte in either
    /// encoding: counting the UTF-16 units of a long line's prefix for
    /// each of its symbols (an `else if` chain on one line of 180 KB) took
    /// the language server seconds.
    ascii: Vec<bool>,
}

impl Lines {
    /// Lines end at `\n`, `\r\n` and a lone `\r`, the three line endings
    /// the protocol counts: an editor shows a file of old Mac line endings
    /// as lines, and its positions count them.
    pub fn new(text: &str) -> Lines {
        let bytes = text.as_bytes();
        let mut starts = vec![0];
        starts.extend(
            bytes
                .iter()
                .enumerate()
                .filter(|&(i, &byte)| {
                    byte == b'\n' || (byte == b'\r' && bytes.get(i + 1) != Some(&b'\n'))
                })
                .map(|(i, _)| i as u32 + 1),
        );
        let ascii = starts
            .iter()
            .zip(
                starts
                    .iter()
                    .skip(1)
                    .map(|next| *next as usize)
                    .chain([bytes.len()]),
            )
            .map(|(start, end)| bytes[*start as usize..end].is_ascii())
            .collect();
        Lines { starts, ascii }
    }

    /// The byte offset of `position` in `text`, clamped to the text: a client
    /// may send a position past the end of a line or of the file.
    pub fn offset(&self, text: &str, position: Position, encoding: Encoding) -> u32 {
        let Some(&start) = self.starts.get(position.line as usize) else {
            return text.len() as u32;
        };
        let end = self
            .starts
            .get(position.line as usize + 1)
            .map_or(text.len(), |next| *next as usize - 1);
        let line = &text[start as usize..end.max(start as usize)];
        // The line's end is before its `\r\n`: a position past it is
        // clamped there, as the protocol says, not between `\r` and `\n`.
        let line = line.strip_suffix('\r').unwrap_or(line);
        if self.ascii[position.line as usize] {
            return start + position.character.min(line.len() as u32);
        }
        let mut units = 0u32;
        for (index, ch) in line.char_indices() {
            if units >= position.character {
                return start + index as u32;
            }
            units += match encoding {
                Encoding::Utf8 => ch.len_utf8() as u32,
                Encoding::Utf16 => ch.len_utf16() as u32,
            };
        }
        start + line.len() as u32
    }

    pub fn position(&self, text: &str, offset: u32, encoding: Encoding) -> Position {
        let offset = offset.min(text.len() as u32);
        let line = self.starts.partition_point(|start| *start <= offset) - 1;
        let start = self.starts[line] as usize;
        let mut end = offset as usize;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let prefix = &text[start..end.max(start)];
        let character = match encoding {
            Encoding::Utf16 if !self.ascii[line] => prefix.encode_utf16().count(),
            Encoding::Utf8 | Encoding::Utf16 => prefix.len(),
        };
        Position::new(line as u32, character as u32)
    }

    pub fn range(&self, text: &str, span: Span, encoding: Encoding) -> Range {
        Range::new(
            self.position(text, span.start, encoding),
            self.position(text, span.end, encoding),
        )
    }

    pub fn span(&self, text: &str, range: Range, encoding: Encoding) -> Span {
        let start = self.offset(text, range.start, encoding);
        let end = self.offset(text, range.end, encoding).max(start);
        Span { start, end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_both_encodings() {
        let text = "a\nbé😀c\n";
        let lines = Lines::new(text);
        let c = text.find('c').unwrap() as u32;
        assert_eq!(
            lines.position(text, c, Encoding::Utf16),
            Position::new(1, 4)
        );
        assert_eq!(lines.position(text, c, Encoding::Utf8), Position::new(1, 7));
        assert_eq!(lines.offset(text, Position::new(1, 4), Encoding::Utf16), c);
        assert_eq!(lines.offset(text, Position::new(1, 7), Encoding::Utf8), c);
        // Past the end of a line or the file is clamped.
        assert_eq!(lines.offset(text, Position::new(0, 99), Encoding::Utf16), 1);
        assert_eq!(
            lines.offset(text, Position::new(9, 0), Encoding::Utf16),
            text.len() as u32
        );
    }

    /// Regression: a position past the end of a CRLF line was clamped
    /// between its `\r` and `\n`, so that an edit there split the line
    /// ending and the server's copy of the text left the client's.
    #[test]
    fn past_the_end_of_a_crlf_line_is_before_its_line_ending() {
        let text = "type T = string\r\nx\r\n";
        let lines = Lines::new(text);
        assert_eq!(
            lines.offset(text, Position::new(0, 99), Encoding::Utf16),
            15
        );
        assert_eq!(lines.offset(text, Position::new(1, 1), Encoding::Utf16), 18);
    }

    /// Regression: a lone `\r` (old Mac line endings) was no line break, so
    /// that every diagnostic of such a file landed on its first line.
    #[test]
    fn a_lone_carriage_return_ends_a_line() {
        let text = "type T = string\rx\r\nq\rz";
        let lines = Lines::new(text);
        let at = |needle: char| text.find(needle).unwrap() as u32;
        for (needle, line) in [('x', 1), ('q', 2), ('z', 3)] {
            let position = Position::new(line, 0);
            assert_eq!(lines.position(text, at(needle), Encoding::Utf16), position);
            assert_eq!(lines.offset(text, position, Encoding::Utf16), at(needle));
        }
        // Past the end of a line is before its `\r`.
        assert_eq!(
            lines.offset(text, Position::new(0, 99), Encoding::Utf16),
            15
        );
    }
}
