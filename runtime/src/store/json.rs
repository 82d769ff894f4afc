//! JSON text as serde_json writes it, for the records a store writes once
//! per step (`record::encode`).
//!
//! serde_json looks up every byte of a string in a table to find what to
//! escape; a step's input and output are mostly prose with nothing to
//! escape, and that scan was a tenth of B1's instructions. Here eight bytes
//! are tested at a time.
//!
//! Invariant: the text is byte for byte what `serde_json::to_string` writes
//! for the same value (keys in the map's order, numbers as its `Display`,
//! the same escapes), so that records read the same whichever wrote them.

use std::fmt::Write as _;

use serde_json::Value;

/// About how many bytes `write_value` writes for `value`, counted without
/// writing them (strings without their escapes, numbers as 8): what a
/// record adds to its account's stored bytes, for a quota that must not
/// cost an encoding per step.
pub fn json_len(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(text) => text.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|item| json_len(item) + 1).sum::<usize>(),
        Value::Object(fields) => {
            2 + fields
                .iter()
                .map(|(name, value)| name.len() + 4 + json_len(value))
                .sum::<usize>()
        }
    }
}

/// Appends `value`'s JSON to `out`.
pub(crate) fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(n), _) => write_u64(out, n),
            (None, Some(n)) => out.push_str(itoa::Buffer::new().format(n)),
            // serde_json's `Display` of a float is its serialization (zmij,
            // for the finite floats a `Number` only holds).
            (None, None) => {
                let _ = write!(out, "{number}");
            }
        },
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(fields) => {
            out.push('{');
            for (i, (name, field)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, name);
                out.push(':');
                write_value(out, field);
            }
            out.push('}');
        }
    }
}

/// Appends `n` in decimal.
pub(crate) fn write_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `text` as a JSON string, quoted and escaped.
pub(crate) fn write_str(out: &mut String, text: &str) {
    out.push('"');
    let bytes = text.as_bytes();
    // `text[run..i]` waits to be copied; `run` and `i` only ever stop at an
    // ASCII byte or the end, so they are character boundaries.
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes[i..].first_chunk::<8>()
            && !needs_escape(u64::from_le_bytes(*word))
        {
            i += 8;
            continue;
        }
        let byte = bytes[i];
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_str(&text[run..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            out.push_str(escape);
        }
        i += 1;
        run = i;
    }
    out.push_str(&text[run..]);
    out.push('"');
}

/// Whether any of the eight bytes in `word` is a control character, a
/// quote or a backslash. It may say yes for a word with none (a borrow
/// from a byte that is one), never no for a word with one.
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte under `n` (n <= 0x80) borrows into its high bit when `n` is
    // subtracted; `!word` leaves out the bytes whose high bit was set.
    let below = |n: u8, word: u64| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS;
    let control = below(0x20, word);
    let quote = below(1, word ^ (ONES * u64::from(b'"')));
    let backslash = below(1, word ^ (ONES * u64::from(b'\\')));
    control | quote | backslash != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn written(value: &Value) -> String {
        let mut out = String::new();
        write_value(&mut out, value);
        out
    }

    /// The invariant: serde_json's text, for every character class at
    /// every offset within and across the eight-byte words.
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let specials = [
            "\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{0}", "\u{1f}", "\u{7f}", "é", "€",
            "😀", "/", "<",
        ];
        for special in specials {
            for before in 0..18 {
                for after in [0, 1, 7, 8, 9] {
                    let text = format!("{}{special}{}", "a".repeat(before), "b".repeat(after));
                    let value = Value::String(text);
                    assert_eq!(
                        written(&value),
                        serde_json::to_string(&value).unwrap(),
                        "{value:?}"
                    );
                }
            }
        }
        let every_byte: String = (0u8..0x80).map(char::from).collect::<String>().repeat(3);
        let value = Value::String(every_byte);
        assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        let value = json!({
            "z": [null, true, false, 0, -1, u64::MAX, i64::MIN, 1.5, -0.0, 0.1, 1e300, 2.5e-8],
            "a": { "nested": [[], {}, ""], "key \"quoted\"\n": "x" },
            "": "empty key",
        });
        assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
    }
}
