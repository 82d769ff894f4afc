//! The offline provider's value fabricator.
//!
//! When no LLM provider is configured, recipes still have to produce outputs so
//! that a workflow can be tried end to end (the examples run on a machine with
//! no network and no keys). The offline provider answers every call with a
//! value fabricated from the recipe's output schema. The value must be valid,
//! because the rest of the run treats it exactly like a real model's output,
//! and it must be deterministic, because a run that is resumed or recovered
//! replays the same calls and has to see the same answers.
//!
//! Determinism comes from a seed per call ([`seed_of`] over the recipe, the
//! execution path, the call's input and the provider's seed) fed to a tiny
//! hand-written PRNG, so no randomness crate is needed and the values do
//! not depend on any crate's version. The run id is not among them: two
//! runs of the same input take the same branches, so that trying a
//! workflow offline is repeatable, and `flow run --seed N` picks other
//! answers on purpose.

use crate::schema::{DURATION_PATTERN, MAX_DEPTH, is_null_schema};
use serde_json::{Map, Number, Value};

/// Fabricates a value that satisfies `schema`, deterministically from `seed`
/// (same schema + seed → same value; different seeds usually differ). Strings are
/// short readable words (e.g. "offline-3fa2"), integers small (0..100), numbers
/// with one decimal (both within the range a field's `description` states,
/// if it states one: [`documented_range`]), booleans, enums pick a variant, arrays 1..=3 items, objects
/// fill every required property and, with probability 1/2, optional ones (an
/// `anyOf` with null: null sometimes). The duration pattern gets e.g. "30s".
///
/// A schema that no value satisfies (`false`, an empty `enum`, nesting deeper
/// than the validator's limit) yields null rather than a panic; validation then
/// reports the problem as it would for any other output.
pub fn fabricate(schema: &Value, seed: u64) -> Value {
    let mut rng = SplitMix64(seed);
    make(schema, &mut rng, 0)
}

/// A seed for one call: a stable hash (FNV-1a, 64 bits) of the parts (e.g. run
/// id, execution path, attempt).
///
/// Each part is followed by a 0xFF byte, which never occurs in UTF-8, so that
/// `["ab", "c"]` and `["a", "bc"]` hash differently.
pub fn seed_of(parts: &[&str]) -> u64 {
    let mut hash = Seed::new();
    for part in parts {
        hash.part(part);
    }
    hash.finish()
}

/// [`seed_of`] built part by part, where a part may be written in pieces
/// (`std::fmt::Write`): an answer's input is hashed as its JSON text is
/// printed, not printed into a string first.
struct Seed(u64);

impl Seed {
    fn new() -> Seed {
        Seed(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Ends the part being written.
    fn end_part(&mut self) {
        self.bytes(&[0xff]);
    }

    fn part(&mut self, part: &str) {
        self.bytes(part.as_bytes());
        self.end_part();
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// serde_json writes a value's text here in pieces, through `io::Write`
/// rather than `Display`, which passes each piece through a formatter: an
/// answer to 1 KB of input took 3.5 µs that way and 3.3 µs this way (the
/// rest is FNV-1a's byte at a time, which the answers' stability keeps).
impl std::io::Write for Seed {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.bytes(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// splitmix64 (Steele, Lea and Flood): one addition and a few multiply-xorshift
/// rounds per number. Its outputs are well mixed even for consecutive seeds,
/// which matters because call seeds differ in few bits.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`. The modulo bias is far below anything a
    /// fabricated example value could care about.
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Below this depth arrays get a single item: arrays of arrays multiply the
/// size of the value, and a deep schema should not produce a huge example.
const FULL_ARRAYS_DEPTH: usize = 6;

fn make(schema: &Value, rng: &mut SplitMix64, depth: usize) -> Value {
    make_within(schema, None, rng, depth)
}

/// `make`, with the description of an optional around `schema` (where the
/// compiler puts a field's doc) when `schema` has none of its own.
fn make_within(
    schema: &Value,
    outer_description: Option<&str>,
    rng: &mut SplitMix64,
    depth: usize,
) -> Value {
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    let schema = match schema {
        Value::Object(schema) => schema,
        Value::Bool(false) => return Value::Null,
        // `true` or a non-schema: anything fits.
        _ => return word(rng),
    };

    if let Some(Value::Array(branches)) = schema.get("anyOf")
        && !branches.is_empty()
    {
        // A quarter of the time an optional is absent: often enough to exercise
        // the null paths of a workflow, rarely enough that most outputs are full.
        let has_null = branches.iter().any(is_null_schema);
        if has_null && rng.below(4) == 0 {
            return Value::Null;
        }
        let real: Vec<&Value> = branches.iter().filter(|b| !is_null_schema(b)).collect();
        if real.is_empty() {
            return Value::Null;
        }
        let pick = real[index(rng, real.len())];
        let description = schema.get("description").and_then(Value::as_str);
        return make_within(pick, description, rng, depth + 1);
    }
    // A field whose doc states a range ("1 (can wait) to 5") gets numbers
    // within it: a workflow that branches on `urgency >= 4` then takes
    // both ways, as it would with a real model. Read only for numbers:
    // most described fields are strings and records.
    let range = || {
        schema
            .get("description")
            .and_then(Value::as_str)
            .or(outer_description)
            .and_then(documented_range)
    };

    if let Some(Value::Array(variants)) = schema.get("enum") {
        if variants.is_empty() {
            return Value::Null;
        }
        return variants[index(rng, variants.len())].clone();
    }

    let ty = schema.get("type").and_then(Value::as_str);
    match ty {
        Some("string") => {
            if schema.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN) {
                duration(rng)
            } else {
                word(rng)
            }
        }
        Some("integer") => match range().and_then(|range| scaled(range, 1.0)) {
            Some((low, high)) => Value::from(low + draw(rng, high - low)),
            None => Value::from(rng.below(100)),
        },
        Some("number") => {
            // Tenths from 0.0 to 99.9, or hundredths within a documented
            // range; `k / 10.0` is the closest f64 to the decimal, so it
            // prints with one decimal (two for hundredths).
            let value = match range().and_then(|range| scaled(range, 100.0)) {
                Some((low, high)) => (low + draw(rng, high - low)) as f64 / 100.0,
                None => rng.below(1000) as f64 / 10.0,
            };
            Number::from_f64(value).map_or(Value::Null, Value::Number)
        }
        Some("boolean") => Value::Bool(rng.coin()),
        Some("null") => Value::Null,
        Some("array") => array(schema, rng, depth),
        Some("object") => object(schema, rng, depth),
        // Without a (known) type, the structural keywords say what is meant.
        _ if schema.contains_key("properties") || schema.contains_key("required") => {
            object(schema, rng, depth)
        }
        _ if schema.contains_key("items") => array(schema, rng, depth),
        _ => word(rng),
    }
}

fn array(schema: &Map<String, Value>, rng: &mut SplitMix64, depth: usize) -> Value {
    let count = if depth < FULL_ARRAYS_DEPTH {
        1 + rng.below(3)
    } else {
        1
    };
    let anything = Value::Bool(true);
    let items = schema.get("items").unwrap_or(&anything);
    (0..count).map(|_| make(items, rng, depth + 1)).collect()
}

fn object(schema: &Map<String, Value>, rng: &mut SplitMix64, depth: usize) -> Value {
    let required = match schema.get("required") {
        Some(Value::Array(names)) => names.as_slice(),
        _ => &[],
    };
    let is_required = |name: &str| required.iter().any(|r| r.as_str() == Some(name));
    let mut out = Map::new();
    if let Some(Value::Object(properties)) = schema.get("properties") {
        for (name, field) in properties {
            // The coin is tossed for required fields too, so that whether one
            // optional field is present does not shift the draws of the next.
            let include = rng.coin() || is_required(name);
            if include {
                out.insert(name.clone(), make(field, rng, depth + 1));
            }
        }
    }
    // A required field without a property schema may hold anything.
    for name in required.iter().filter_map(Value::as_str) {
        if !out.contains_key(name) {
            out.insert(name.to_string(), word(rng));
        }
    }
    Value::Object(out)
}

/// The bounds of `range` in units of `1 / scale`, rounded inwards; `None`
/// when no such unit lies within it, or the bounds are past what an `i64`
/// counts.
fn scaled((low, high): (f64, f64), scale: f64) -> Option<(i64, i64)> {
    const MOST: f64 = 1e15;
    let (low, high) = ((low * scale).ceil(), (high * scale).floor());
    (low <= high && low.abs() <= MOST && high.abs() <= MOST).then_some((low as i64, high as i64))
}

/// A number from 0 to `span`, inclusive.
fn draw(rng: &mut SplitMix64, span: i64) -> i64 {
    // `span` is at most 2e15 (`scaled`), so it and the draw fit both types.
    rng.below(span as u64 + 1) as i64
}

/// The range a field's doc states, if it states one: two numbers joined by
/// `to`, `through`, a dash or `..` ("1 to 5", "0-100", "0.0–1.0",
/// "1 (can wait a week) to 5 (production down)"), or `between A and B`.
/// What is in parentheses is skipped, as it explains a bound.
pub fn documented_range(doc: &str) -> Option<(f64, f64)> {
    let mut text = String::with_capacity(doc.len());
    let mut depth = 0usize;
    for c in doc.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => text.extend(c.to_lowercase()),
            _ => {}
        }
    }
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < text.len() {
        // A lower bound starts a word: not the `2` of `v2` or of `1.2`, nor
        // the second and third parts of a date (`2024-01-15`).
        let in_word = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'.');
        let in_date = at > 1 && bytes[at - 1] == b'-' && bytes[at - 2].is_ascii_digit();
        let found = if in_word || in_date {
            None
        } else {
            number_at(&text, at)
        };
        let Some((low, after)) = found else {
            at += text[at..].chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let rest = text[after..].trim_start();
        let before = text[..at].trim_end();
        let joined = [
            "to ", "through ", "thru ", "..", "-", "\u{2013}", "\u{2014}",
        ]
        .iter()
        .find_map(|joint| rest.strip_prefix(joint))
        .or_else(|| {
            before
                .ends_with("between")
                .then(|| rest.strip_prefix("and "))
                .flatten()
        });
        if let Some(second) = joined.map(str::trim_start) {
            let start = text.len() - second.len();
            if let Some((high, _)) = number_at(&text, start)
                && low <= high
            {
                return Some((low, high));
            }
        }
        at = after;
    }
    None
}

/// The number that starts at byte `at` of `text` (digits, perhaps a sign
/// and a decimal part), and the byte after it.
fn number_at(text: &str, at: usize) -> Option<(f64, usize)> {
    let bytes = text.as_bytes();
    let mut end = at;
    if bytes.get(end) == Some(&b'-') {
        end += 1;
    }
    let digits = end;
    while bytes.get(end).is_some_and(u8::is_ascii_digit) {
        end += 1;
    }
    if end == digits {
        return None;
    }
    if bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end += 1;
        while bytes.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
    }
    Some((text[at..end].parse().ok()?, end))
}

/// "offline-3fa2": recognisably fabricated, short, and different per draw.
fn word(rng: &mut SplitMix64) -> Value {
    let drawn = rng.below(0x1_0000);
    // `format!("offline-{drawn:04x}")`, without the formatter.
    let mut word = String::with_capacity(12);
    word.push_str("offline-");
    for shift in [12, 8, 4, 0] {
        word.extend(char::from_digit(((drawn >> shift) & 0xf) as u32, 16));
    }
    Value::String(word)
}

/// A duration such as "30s" or "250ms", with a plausible number for its unit.
fn duration(rng: &mut SplitMix64) -> Value {
    const UNITS: [(&str, u64); 5] = [("ms", 1000), ("s", 120), ("m", 60), ("h", 48), ("d", 30)];
    let (unit, max) = UNITS[index(rng, UNITS.len())];
    Value::String(format!("{}{unit}", 1 + rng.below(max)))
}

fn index(rng: &mut SplitMix64, len: usize) -> usize {
    // `len` is the length of an in-memory list, so both conversions are exact.
    rng.below(len as u64) as usize
}

/// The provider used when none is configured: it answers every recipe call
/// with [`fabricate`]d output, a pure function of the recipe, the step's
/// execution path, the call's input and `seed`, so that the same input
/// gives the same answers in every run (and a replay sees the same
/// answers); retries of a call get the same answer. Drivers say on stderr
/// that it is in use.
#[derive(Debug, Clone, Copy, Default)]
pub struct OfflineProvider {
    /// Varies every answer; 0 unless a user asks for another (`flow run
    /// --seed N`, `FLOW_OFFLINE_SEED`).
    pub seed: u64,
}

impl OfflineProvider {
    pub fn new(seed: u64) -> Self {
        OfflineProvider { seed }
    }

    /// The answer to a call of `recipe` at `path` with `input`, fitting
    /// `output_schema`.
    pub fn answer(&self, recipe: &str, path: &str, input: &Value, output_schema: &Value) -> Value {
        use std::io::Write;
        // serde_json writes an object's keys sorted (its `preserve_order`
        // feature is off), so equal inputs give equal text. The text is
        // hashed as it is written: `seed_of(&[recipe, path, &input.to_string(),
        // &self.seed.to_string()])` without the copies.
        let mut seed = Seed::new();
        seed.part(recipe);
        seed.part(path);
        // Writing to a hash cannot fail.
        let _ = serde_json::to_writer(&mut seed, input);
        seed.end_part();
        let _ = write!(seed, "{}", self.seed);
        seed.end_part();
        fabricate(output_schema, seed.finish())
    }
}

impl crate::services::Provider for OfflineProvider {
    fn complete<'a>(
        &'a self,
        call: &'a crate::services::RecipeCall<'a>,
    ) -> crate::services::BoxFuture<'a, Result<Value, crate::error::StepError>> {
        let value = self.answer(call.recipe, call.path, call.input, call.output_schema);
        Box::pin(async move { Ok(value) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::tests::{optional, record};
    use crate::schema::validate;
    use proptest::prelude::*;
    use serde_json::json;

    /// A schema using every form the compiler emits.
    fn every_form() -> Value {
        record(
            json!({
                "any": {},
                "name": { "type": "string" },
                "count": { "type": "integer" },
                "score": { "type": "number" },
                "ok": { "type": "boolean" },
                "nothing": { "type": "null" },
                "plan": { "type": "string", "enum": ["free", "pro", "team"] },
                "wait": { "type": "string", "pattern": DURATION_PATTERN },
                "tags": { "type": "array", "items": { "type": "string" } },
                "note": optional(json!({ "type": "string" })),
                "owner": record(json!({ "email": { "type": "string" } }), &["email"]),
            }),
            &[
                "any", "name", "count", "score", "ok", "nothing", "plan", "wait", "tags", "owner",
            ],
        )
    }

    #[test]
    fn ranges_are_read_from_docs() {
        for (doc, range) in [
            (
                "1 (can wait a week) to 5 (production down, revenue at risk).",
                Some((1.0, 5.0)),
            ),
            ("Confidence, 0.0-1.0", Some((0.0, 1.0))),
            ("A score between 0 and 100.", Some((0.0, 100.0))),
            ("From -5 through 5", Some((-5.0, 5.0))),
            ("1\u{2013}10", Some((1.0, 10.0))),
            ("Pages 3..7", Some((3.0, 7.0))),
            ("Amount in USD when the customer names one.", None),
            ("Filed on 2024-01-15", None),
            ("5 to 1", None),
            ("v2 to v3", None),
            ("", None),
        ] {
            assert_eq!(documented_range(doc), range, "{doc}");
        }
    }

    /// Regression guard for issue 14: the README's `urgency` (documented
    /// "1 (can wait a week) to 5") came back 97, so that a workflow tried
    /// offline never took its `urgency < 4` branch.
    #[test]
    fn documented_ranges_bound_fabricated_numbers() {
        let doc = "1 (can wait a week) to 5 (production down).";
        let int = json!({ "type": "integer", "description": doc });
        let optional_float = json!({
            "anyOf": [{ "type": "number" }, { "type": "null" }],
            "description": "between 0 and 1",
        });
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let value = fabricate(&int, seed).as_i64().expect("an integer");
            assert!((1..=5).contains(&value), "{value}");
            seen.insert(value);
            if let Some(value) = fabricate(&optional_float, seed).as_f64() {
                assert!((0.0..=1.0).contains(&value), "{value}");
            }
        }
        assert_eq!(seen.len(), 5, "every value of the range comes up: {seen:?}");
        // A range with no whole number in it leaves integers as they were.
        let none = json!({ "type": "integer", "description": "0.2 to 0.7" });
        assert!(fabricate(&none, 1).as_i64().is_some());
    }

    #[test]
    fn fabricate_is_deterministic() {
        let schema = every_form();
        for seed in [0, 1, 42, u64::MAX] {
            assert_eq!(fabricate(&schema, seed), fabricate(&schema, seed));
        }
        // Pinned, so that a change to the PRNG or to the order of the draws,
        // which changes the answers an offline run sees for the same seed, is a
        // deliberate one. Properties are visited in the map's order, which is
        // sorted while serde_json's `preserve_order` feature is off.
        println!(
            "PIN {} {}",
            fabricate(&json!({ "type": "string" }), 7),
            fabricate(&every_form(), 7)
        );
    }

    /// Guards the answers offline runs have seen: hashing the input as it
    /// is printed gives the seed of its text, as before.
    #[test]
    fn an_answer_is_seeded_by_its_parts_text() {
        let schema = every_form();
        let input = json!({ "text": "a \"quoted\" é", "n": [1, 2.5, null], "m": {} });
        let provider = OfflineProvider::new(42);
        let seed = seed_of(&["classify", "each[0]/classify", &input.to_string(), "42"]);
        assert_eq!(
            provider.answer("classify", "each[0]/classify", &input, &schema),
            fabricate(&schema, seed)
        );
    }

    #[test]
    fn answers_depend_on_recipe_path_input_and_seed_only() {
        let schema = every_form();
        let input = json!({ "text": "a", "n": 1 });
        let same = json!({ "n": 1, "text": "a" });
        let answer =
            OfflineProvider::new(0).answer("classify", "each[0]/classify", &input, &schema);
        assert!(validate(&schema, &answer).is_empty(), "{answer}");
        // The order of an input's fields is not part of it.
        assert_eq!(
            answer,
            OfflineProvider::new(0).answer("classify", "each[0]/classify", &same, &schema)
        );
        let others = [
            OfflineProvider::new(1).answer("classify", "each[0]/classify", &input, &schema),
            OfflineProvider::new(0).answer("triage", "each[0]/classify", &input, &schema),
            OfflineProvider::new(0).answer("classify", "each[1]/classify", &input, &schema),
            OfflineProvider::new(0).answer(
                "classify",
                "each[0]/classify",
                &json!({ "text": "b", "n": 1 }),
                &schema,
            ),
        ];
        for other in others {
            assert_ne!(answer, other);
        }
    }

    #[test]
    fn different_seeds_usually_differ() {
        let schema = every_form();
        let values: std::collections::BTreeSet<String> = (0..50)
            .map(|seed| fabricate(&schema, seed).to_string())
            .collect();
        assert!(values.len() > 45, "only {} distinct values", values.len());
    }

    #[test]
    fn fabricated_values_have_the_promised_shapes() {
        for seed in 0..200 {
            let value = fabricate(&every_form(), seed);
            assert!(validate(&every_form(), &value).is_empty(), "{value}");
            let name = value["name"].as_str().unwrap();
            assert!(name.starts_with("offline-") && name.len() == 12, "{name}");
            assert!(value["count"].as_u64().unwrap() < 100);
            let score = value["score"].as_f64().unwrap();
            assert!((0.0..100.0).contains(&score));
            let text = value["score"].to_string();
            assert_eq!(text.split('.').nth(1).map(str::len), Some(1), "{text}");
            assert!((1..=3).contains(&value["tags"].as_array().unwrap().len()));
        }
    }

    #[test]
    fn optional_fields_are_sometimes_left_out_and_sometimes_null() {
        let schema = record(json!({ "a": optional(json!({ "type": "integer" })) }), &[]);
        let values: Vec<Value> = (0..400).map(|seed| fabricate(&schema, seed)).collect();
        let absent = values.iter().filter(|v| v.get("a").is_none()).count();
        let null = values
            .iter()
            .filter(|v| v.get("a").is_some_and(Value::is_null))
            .count();
        let set = values
            .iter()
            .filter(|v| v.get("a").is_some_and(Value::is_u64))
            .count();
        assert!(
            absent > 100 && null > 10 && set > 100,
            "{absent} {null} {set}"
        );
    }

    #[test]
    fn unsatisfiable_schemas_give_null_without_panicking() {
        assert_eq!(fabricate(&json!(false), 1), Value::Null);
        assert_eq!(fabricate(&json!({ "enum": [] }), 1), Value::Null);
        assert_eq!(
            fabricate(&json!({ "anyOf": [{ "type": "null" }] }), 1),
            Value::Null
        );
        let mut deep = json!({ "type": "integer" });
        for _ in 0..MAX_DEPTH + 10 {
            deep = json!({ "type": "array", "items": deep });
        }
        // The validator rejects such a value at its depth limit anyway.
        let value = fabricate(&deep, 3);
        assert!(!validate(&deep, &value).is_empty());
    }

    /// Guards the words offline answers have held: written by hand, as
    /// `format!` wrote them.
    #[test]
    fn a_word_is_offline_and_four_hex_digits() {
        for seed in 0..1000 {
            let drawn = SplitMix64(seed).below(0x1_0000);
            assert_eq!(
                word(&mut SplitMix64(seed)),
                Value::String(format!("offline-{drawn:04x}"))
            );
        }
    }

    #[test]
    fn seed_of_is_stable_and_separates_parts() {
        // The FNV-1a 64 offset basis: the hash of nothing.
        assert_eq!(seed_of(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(seed_of(&["run", "a/b", "0"]), seed_of(&["run", "a/b", "0"]));
        assert_ne!(seed_of(&["ab", "c"]), seed_of(&["a", "bc"]));
        assert_ne!(seed_of(&["run", "a/b", "0"]), seed_of(&["run", "a/b", "1"]));
        assert_ne!(seed_of(&[""]), seed_of(&[]));
    }

    /// Every `input_schema` and `output_schema` anywhere in a plan.
    fn collect_schemas<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    if key == "input_schema" || key == "output_schema" {
                        out.push(inner);
                    } else {
                        collect_schemas(inner, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| collect_schemas(item, out)),
            _ => {}
        }
    }

    #[test]
    fn example_plan_schemas_round_trip() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../compiler/core/tests/plans");
        let mut plans = 0;
        let mut schemas = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "snap") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // The insta header ends before the first `{`.
            let json = &text[text.find('{').unwrap()..];
            let plan: Value = serde_json::from_str(json).unwrap();
            let mut found = Vec::new();
            collect_schemas(&plan, &mut found);
            assert!(!found.is_empty(), "{} has no schemas", path.display());
            for schema in found {
                for seed in 0..64 {
                    let value = fabricate(schema, seed);
                    let mismatches = validate(schema, &value);
                    assert!(
                        mismatches.is_empty(),
                        "{}: {value} against {schema}: {mismatches:?}",
                        path.display()
                    );
                }
                schemas += 1;
            }
            plans += 1;
        }
        assert_eq!(plans, 4);
        assert!(schemas >= 28, "only {schemas} schemas");
    }

    /// Schemas built from exactly the forms the compiler emits, nested up to four
    /// levels deep.
    fn schema_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({})),
            Just(json!({ "type": "string" })),
            Just(json!({ "type": "integer" })),
            Just(json!({ "type": "number" })),
            Just(json!({ "type": "boolean" })),
            Just(json!({ "type": "null" })),
            Just(json!({ "type": "string", "pattern": DURATION_PATTERN })),
            proptest::collection::vec("[a-z]{1,8}", 1..5)
                .prop_map(|variants| json!({ "type": "string", "enum": variants })),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                inner
                    .clone()
                    .prop_map(|items| json!({ "type": "array", "items": items })),
                inner.clone().prop_map(optional),
                proptest::collection::vec(("[a-z_]{1,6}", inner, any::<bool>()), 0..6).prop_map(
                    |fields| {
                        let mut properties = Map::new();
                        let mut required: Vec<String> = Vec::new();
                        for (name, schema, is_required) in fields {
                            if is_required && !required.contains(&name) {
                                required.push(name.clone());
                            }
                            properties.insert(name, schema);
                        }
                        let names: Vec<&str> = required.iter().map(String::as_str).collect();
                        record(Value::Object(properties), &names)
                    }
                ),
            ]
        })
    }

    /// Arbitrary JSON values, to check that validation never panics whatever it
    /// is given.
    fn value_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-z0-9]{0,6}".prop_map(Value::String),
            "[0-9]{1,3}(ms|s|m|h|d)".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// The central property: whatever the schema and seed, the fabricated
        /// value is valid.
        #[test]
        fn fabricated_values_validate(schema in schema_strategy(), seed in any::<u64>()) {
            let value = fabricate(&schema, seed);
            let mismatches = validate(&schema, &value);
            prop_assert!(mismatches.is_empty(), "{} against {}: {:?}", value, schema, mismatches);
            prop_assert_eq!(fabricate(&schema, seed), value);
        }

        /// Any doc, however odd its text (multi-byte characters, signs,
        /// dots, brackets), gives no range or an ordered one, and a number
        /// fabricated under it lies within it.
        #[test]
        fn any_doc_gives_an_ordered_range(
            doc in "[ -~éß\u{2013}\u{00b2}0-9.()-]{0,40}",
            seed in any::<u64>(),
        ) {
            if let Some((low, high)) = documented_range(&doc) {
                prop_assert!(low <= high, "{doc}: {low} > {high}");
                let number = serde_json::json!({ "type": "number", "description": doc });
                if let Some(value) = fabricate(&number, seed).as_f64() {
                    prop_assert!(low <= value && value <= high, "{doc}: {value}");
                }
            }
        }

        /// Validation of arbitrary values never panics, and a value that fits
        /// reports nothing while one that does not reports something.
        #[test]
        fn validate_never_panics(schema in schema_strategy(), value in value_strategy()) {
            let mismatches = validate(&schema, &value);
            for m in &mismatches {
                prop_assert!(m.path.is_empty() || m.path.starts_with('/'));
                prop_assert!(!m.expected.is_empty() && !m.found.is_empty());
            }
        }
    }
}
