//! Validation of JSON values against the JSON Schemas that the compiler writes
//! into plans.
//!
//! The runtime checks a workflow's input before a run starts and an LLM's
//! output before a step completes. Both checks exist to tell a person what to
//! fix, so validation does not stop at the first problem: it lists the
//! mismatches, each with the place in the value, what the plan expected there
//! and what was actually found. The answer is bounded whatever the schema and
//! the value: at most [`MAX_MISMATCHES`] are listed (the rest are counted),
//! and each part of one is at most [`MAX_PART_CHARS`] characters, because a
//! value of a few kilobytes against a wide schema (every branch of a union,
//! every allowed field named in each message) once made a 422 of 480 MB.
//!
//! Only the forms the compiler emits are understood (see
//! `flow_compiler::check::types::Ty::json_schema`): `{}`, the scalar `type`s, a
//! string `enum`, the one duration `pattern`, `array` with `items`, closed
//! `object`s with `properties` and `required`, and `anyOf` (in practice an
//! optional: a type or null). Any other keyword is ignored rather than
//! rejected, because a schema that is more permissive than intended is a far
//! smaller problem at run time than a run that refuses valid input.

use flow_plan::cut;
use serde_json::{Map, Value};
use std::fmt::{self, Write as _};

/// The duration pattern the compiler emits for `duration` values. It is the only
/// pattern checked, by hand, so the runtime needs no regular-expression engine.
pub(crate) const DURATION_PATTERN: &str = flow_plan::DURATION_PATTERN;

/// Mismatches listed by [`validate`]; the rest are only counted. A hundred is
/// more than anyone fixes from one message, and bounds a 422's size.
pub const MAX_MISMATCHES: usize = 100;

/// Characters of each part (path, expected, found) of one mismatch. Paths
/// hold field names from the value, and `expected` names from the schema.
pub const MAX_PART_CHARS: usize = 160;

/// Branches of a union, variants of an enum and allowed fields that one
/// `expected` names before it says how many there are in all.
const SHOWN: usize = 10;

/// How deep validation descends before it gives up. Values come from users and
/// from LLMs, and serde_json is built without its nesting limit in this
/// workspace, so without a bound a hostile value could exhaust the stack.
pub(crate) const MAX_DEPTH: usize = 256;

const DEPTH_WORDS: &str = "a value nested at most 256 levels deep";

/// One mismatch: where (a JSON Pointer-like path such as `/customer/plan` or
/// `/contacts/3/email`, "" for the root), what was expected (human words: "a
/// string", "one of \"free\", \"pro\"", "an integer", "no field `x` (allowed:
/// `a`, `b`)"), and what was found (a short description: "a number 3.5",
/// "null", "an object", "missing").
///
/// A required field that is absent is reported at the field's own path (e.g.
/// `/customer/email`) with what the field should hold as `expected` and
/// "missing" as `found`, so every mismatch points at the exact place to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Where the mismatch is, as a JSON Pointer (`~` and `/` in field names are
    /// escaped as `~0` and `~1`); empty for the value itself.
    pub path: String,
    /// What the schema wanted there, in words.
    pub expected: String,
    /// What the value holds there, in words.
    pub found: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The root has an empty pointer; printing ": expected ..." would look
        // like a formatting slip, so the root mismatch is printed without a path.
        if self.path.is_empty() {
            write!(f, "expected {}, found {}", self.expected, self.found)
        } else {
            write!(
                f,
                "{}: expected {}, found {}",
                self.path, self.expected, self.found
            )
        }
    }
}

/// The mismatches of a value: the first [`MAX_MISMATCHES`], in document
/// order, and how many more there are. Derefs to the listed ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mismatches {
    pub listed: Vec<Mismatch>,
    /// Mismatches found past the listed ones.
    pub omitted: usize,
}

impl std::ops::Deref for Mismatches {
    type Target = [Mismatch];

    fn deref(&self) -> &[Mismatch] {
        &self.listed
    }
}

impl<'a> IntoIterator for &'a Mismatches {
    type Item = &'a Mismatch;
    type IntoIter = std::slice::Iter<'a, Mismatch>;

    fn into_iter(self) -> Self::IntoIter {
        self.listed.iter()
    }
}

/// The listed mismatches joined by `; `, and how many more there are.
impl fmt::Display for Mismatches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, mismatch) in self.listed.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{mismatch}")?;
        }
        if self.omitted > 0 {
            write!(f, "; and {} more", self.omitted)?;
        }
        Ok(())
    }
}

thread_local! {
    /// `validate`'s path, kept from one call to the next on its thread: a
    /// new one cost an allocation at the walk's first field, twice a step
    /// (a recipe's input and its output), where nothing else of a valid
    /// value allocates.
    static PATH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// The mismatches of `value` against `schema`, in document order; empty when
/// it fits. At most [`MAX_MISMATCHES`] are listed and the rest counted.
///
/// Within an object, the fields present are visited in the value's own order
/// (their mismatches and any fields the schema does not allow), then the
/// required fields that are missing are listed in the schema's `required`
/// order. An integer is a JSON number that serde_json parsed as a whole number
/// (`3`); `3.0` and `3.5` are not integers, because a number written with a
/// fraction is a float in flow's type system even when the fraction is zero.
pub fn validate(schema: &Value, value: &Value) -> Mismatches {
    let mut sink = Sink {
        listed: Vec::new(),
        room: MAX_MISMATCHES,
        omitted: 0,
        first_only: false,
    };
    let mut path = PATH.take();
    path.clear();
    check(schema, value, &mut path, 0, &mut sink);
    PATH.set(path);
    Mismatches {
        listed: sink.listed,
        omitted: sink.omitted,
    }
}

/// Whether `value` fits `schema`, looking no further than the first mismatch.
fn fits(schema: &Value, value: &Value, path: &mut String, depth: usize) -> bool {
    let mut sink = Sink {
        listed: Vec::new(),
        room: 0,
        omitted: 0,
        first_only: true,
    };
    check(schema, value, path, depth, &mut sink);
    !sink.found_any()
}

/// Where mismatches go: the first `room` are kept, each cut to size, and the
/// rest counted; a mismatch is built only when it is kept.
struct Sink {
    listed: Vec<Mismatch>,
    room: usize,
    omitted: usize,
    /// The question is only whether the value fits: the first mismatch ends
    /// the walk.
    first_only: bool,
}

impl Sink {
    fn push(&mut self, mismatch: impl FnOnce() -> Mismatch) {
        if self.listed.len() < self.room {
            let Mismatch {
                path,
                expected,
                found,
            } = mismatch();
            self.listed.push(Mismatch {
                path: cut_path(&path),
                expected: cut(&expected, MAX_PART_CHARS),
                found: cut(&found, MAX_PART_CHARS),
            });
        } else {
            self.omitted += 1;
        }
    }

    fn found_any(&self) -> bool {
        !self.listed.is_empty() || self.omitted > 0
    }

    /// Whether the walk can stop: a fit question has its answer.
    fn done(&self) -> bool {
        self.first_only && self.found_any()
    }
}

/// The keywords of one schema node that `check` acts on, found in one pass
/// over its fields: looking each up in the map cost up to seven searches
/// per node, most of the validation of a step's output. A keyword of the
/// wrong JSON type is left out, as the lookups ignored it.
#[derive(Default)]
struct Keywords<'s> {
    any_of: Option<&'s [Value]>,
    ty: Option<&'s str>,
    variants: Option<&'s [Value]>,
    pattern: Option<&'s str>,
    items: Option<&'s Value>,
    properties: Option<&'s Map<String, Value>>,
    additional: Option<&'s Value>,
    required: Option<&'s [Value]>,
}

impl<'s> Keywords<'s> {
    fn of(schema: &'s Map<String, Value>) -> Keywords<'s> {
        let mut keywords = Keywords::default();
        for (name, value) in schema {
            match (name.as_str(), value) {
                ("anyOf", Value::Array(branches)) => keywords.any_of = Some(branches),
                ("type", Value::String(ty)) => keywords.ty = Some(ty),
                ("enum", Value::Array(variants)) => keywords.variants = Some(variants),
                ("pattern", Value::String(pattern)) => keywords.pattern = Some(pattern),
                ("items", items) => keywords.items = Some(items),
                ("properties", Value::Object(properties)) => {
                    keywords.properties = Some(properties);
                }
                ("additionalProperties", additional) => keywords.additional = Some(additional),
                ("required", Value::Array(required)) => keywords.required = Some(required),
                _ => {}
            }
        }
        keywords
    }
}

/// `value` with each whole number written as a float (`3.0`, `1e3`) made an
/// integer where `schema` asks for one. For a model's answer only: JSON
/// Schema counts `3.0` an integer, and models without structured output,
/// or proxies that pass numbers through floats, write it so; refused, such
/// an answer cost a repair request and then failed the step (an audit).
/// flow's own values keep the rule that a fraction makes a float.
pub fn whole_floats_to_integers(schema: &Value, value: &mut Value) {
    whole_floats(schema, value, 0);
}

fn whole_floats(schema: &Value, value: &mut Value, depth: usize) {
    let Value::Object(map) = schema else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    let keywords = Keywords::of(map);
    if let Some(branches) = keywords.any_of {
        // The one branch of the value's kind, if only one is (a number
        // fits `number` as it is).
        let of_kind: Vec<&Value> = branches
            .iter()
            .filter(|branch| {
                matches!(
                    (branch.get("type").and_then(Value::as_str), &*value),
                    (Some("integer" | "number"), Value::Number(_))
                        | (Some("object"), Value::Object(_))
                        | (Some("array"), Value::Array(_))
                )
            })
            .collect();
        if let [branch] = of_kind[..] {
            whole_floats(branch, value, depth + 1);
        }
    }
    match (keywords.ty, value) {
        (Some("integer"), Value::Number(number)) if number.is_f64() => {
            // Exact as an integer only up to 2^53.
            if let Some(float) = number.as_f64()
                && float.fract() == 0.0
                && float.abs() <= 9_007_199_254_740_992.0
            {
                *number = serde_json::Number::from(float as i64);
            }
        }
        (_, Value::Array(items)) => {
            if let Some(item_schema) = keywords.items {
                for item in items {
                    whole_floats(item_schema, item, depth + 1);
                }
            }
        }
        (_, Value::Object(fields)) => {
            if let Some(properties) = keywords.properties {
                for (name, field) in fields.iter_mut() {
                    if let Some(field_schema) = properties.get(name) {
                        whole_floats(field_schema, field, depth + 1);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Validates one node. `path` is extended and restored by the callers of each
/// nested check, so that no path string is allocated unless a mismatch is
/// recorded.
fn check(schema: &Value, value: &Value, path: &mut String, depth: usize, out: &mut Sink) {
    if out.done() {
        return;
    }
    if depth > MAX_DEPTH {
        out.push(|| Mismatch {
            path: path.clone(),
            expected: DEPTH_WORDS.to_string(),
            found: "deeper nesting".to_string(),
        });
        return;
    }
    let map = match schema {
        Value::Object(map) => map,
        // JSON Schema allows the booleans as schemas: `false` accepts nothing.
        Value::Bool(false) => {
            out.push(|| mismatch(path, "nothing", value));
            return;
        }
        // `true` and anything that is not a schema at all constrain nothing.
        _ => return,
    };

    let schema = Keywords::of(map);

    if let Some(branches) = schema.any_of
        && !branches.is_empty()
    {
        check_any_of(map, branches, value, path, depth, out);
    }

    if let Some(ty) = schema.ty
        && let Some(fits) = fits_type(ty, value)
        && !fits
    {
        // The language's `int` is 64 bits and signed, as its literals are:
        // a whole number past it passed and then could not be written back
        // as a literal (`flow test-from`, an audit).
        if ty == "integer" && value.is_u64() {
            out.push(|| mismatch(path, "an integer of at most 9223372036854775807", value));
            return;
        }
        out.push(|| mismatch(path, &describe(map, 0), value));
        // The value's shape is wrong, so checking its contents against the
        // expected shape would only add noise.
        return;
    }

    if let Some(variants) = schema.variants
        && !variants.contains(value)
    {
        out.push(|| mismatch(path, &describe_enum(variants), value));
        return;
    }

    if let (Some(pattern), Value::String(text)) = (schema.pattern, value)
        && pattern == DURATION_PATTERN
        && !is_duration(text)
    {
        out.push(|| mismatch(path, DURATION_WORDS, value));
        return;
    }

    match value {
        Value::Array(items) => {
            if let Some(item_schema) = schema.items {
                for (index, item) in items.iter().enumerate() {
                    if out.done() {
                        return;
                    }
                    let len = path.len();
                    // Written in place: a copy of each index's text cost
                    // every item of every array an allocation.
                    let _ = write!(path, "/{index}");
                    check(item_schema, item, path, depth + 1, out);
                    path.truncate(len);
                }
            }
        }
        Value::Object(fields) => check_object(&schema, fields, path, depth, out),
        _ => {}
    }
}

/// `anyOf`: the value fits when it fits one branch. When it fits none and the
/// schema is an optional (one real branch plus null), the mismatches of the
/// real branch are what the user needs to see, with "or null" added where the
/// whole value was rejected; for other unions one summary mismatch is clearer
/// than the mismatches of every branch, and each branch is only asked whether
/// the value fits it, so a union costs no mismatch per branch.
fn check_any_of(
    schema: &Map<String, Value>,
    branches: &[Value],
    value: &Value,
    path: &mut String,
    depth: usize,
    out: &mut Sink,
) {
    let has_null = branches.iter().any(is_null_schema);
    // Null fits an optional without looking at the other branch at all.
    if has_null && value.is_null() {
        return;
    }
    let mut real = branches.iter().filter(|branch| !is_null_schema(branch));
    match (real.next(), real.next()) {
        // Only null branches, and the value is not null.
        (None, _) => out.push(|| mismatch(path, "null", value)),
        (Some(only), None) => {
            let first = out.listed.len();
            check(only, value, path, depth + 1, out);
            if has_null {
                let here = cut_path(path);
                for m in &mut out.listed[first..] {
                    // Only a rejection of the whole value gains "or null"; the
                    // depth limit is no such rejection, and a nested optional
                    // has already said "or null".
                    if m.path == here
                        && m.expected != DEPTH_WORDS
                        && !m.expected.ends_with(" or null")
                    {
                        m.expected.push_str(" or null");
                    }
                }
            }
        }
        (Some(_), Some(_)) => {
            for branch in branches.iter().filter(|branch| !is_null_schema(branch)) {
                if fits(branch, value, path, depth + 1) {
                    return;
                }
            }
            out.push(|| mismatch(path, &describe(schema, 0), value));
        }
    }
}

/// The keywords of a closed record: every present field is checked against its
/// property schema (or reported when the schema does not allow it), then every
/// required field that is absent is reported at its own path.
fn check_object(
    schema: &Keywords<'_>,
    fields: &Map<String, Value>,
    path: &mut String,
    depth: usize,
    out: &mut Sink,
) {
    let empty = Map::new();
    let properties = schema.properties.unwrap_or(&empty);
    let additional = schema.additional;
    for (name, field) in fields {
        if out.done() {
            return;
        }
        let len = path.len();
        push_segment(path, name);
        if let Some(field_schema) = properties.get(name) {
            check(field_schema, field, path, depth + 1, out);
        } else {
            match additional {
                Some(Value::Bool(false)) => out.push(|| Mismatch {
                    path: path.clone(),
                    expected: describe_extra(name, properties),
                    found: describe_value(field),
                }),
                // An `additionalProperties` schema constrains the extra fields.
                Some(extra @ Value::Object(_)) => check(extra, field, path, depth + 1, out),
                _ => {}
            }
        }
        path.truncate(len);
    }
    if let Some(required) = schema.required {
        for name in required.iter().filter_map(Value::as_str) {
            if fields.contains_key(name) {
                continue;
            }
            if out.done() {
                return;
            }
            let len = path.len();
            push_segment(path, name);
            out.push(|| Mismatch {
                path: path.clone(),
                expected: match properties.get(name) {
                    Some(field_schema) => describe(field_schema.as_object().unwrap_or(&empty), 0),
                    None => "a value".to_string(),
                },
                found: "missing".to_string(),
            });
            path.truncate(len);
        }
    }
}

/// Appends `/name` to a pointer, escaping as RFC 6901 requires so that a field
/// called `a/b` cannot be confused with a nested field.
fn push_segment(path: &mut String, name: &str) {
    path.push('/');
    if !name.contains(['~', '/']) {
        path.push_str(name);
        return;
    }
    for c in name.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Whether `value` has JSON Schema type `ty`; `None` for a type name this module
/// does not know, which then constrains nothing.
fn fits_type(ty: &str, value: &Value) -> Option<bool> {
    Some(match ty {
        "string" => value.is_string(),
        // serde_json keeps a number written with a fraction or exponent as an
        // f64 even when its value is whole, and flow treats such a number as a
        // float; only numbers parsed as i64 are integers (an `int` is 64
        // bits and signed).
        "integer" => value.is_i64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => return None,
    })
}

/// Whether `text` matches `^[0-9]+(ms|s|m|h|d)$`.
pub(crate) fn is_duration(text: &str) -> bool {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    unit_at > 0 && matches!(&text[unit_at..], "ms" | "s" | "m" | "h" | "d")
}

/// Whether a schema is exactly the null type, i.e. the optional half of an
/// `anyOf`.
pub(crate) fn is_null_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

const DURATION_WORDS: &str = "a duration such as \"30s\" (digits, then ms, s, m, h or d)";

/// What a schema accepts, in words, for the `expected` half of a mismatch.
/// `depth` counts the unions around it: words for unions nested deeper than
/// a few levels say only "a value", so describing is bounded too.
fn describe(schema: &Map<String, Value>, depth: usize) -> String {
    if let Some(Value::Array(branches)) = schema.get("anyOf")
        && !branches.is_empty()
    {
        if depth >= 3 {
            return "a value".to_string();
        }
        let mut words: Vec<String> = branches
            .iter()
            .take(SHOWN)
            .map(|branch| describe_value_schema(branch, depth + 1))
            .collect();
        if branches.len() > SHOWN {
            words.push(format!("… ({} in all)", branches.len()));
        }
        return words.join(" or ");
    }
    if let Some(Value::Array(variants)) = schema.get("enum") {
        return describe_enum(variants);
    }
    let ty = schema.get("type").and_then(Value::as_str);
    match ty {
        Some("string")
            if schema.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN) =>
        {
            DURATION_WORDS.to_string()
        }
        Some("string") => "a string".to_string(),
        Some("integer") => "an integer".to_string(),
        Some("number") => "a number".to_string(),
        Some("boolean") => "a boolean".to_string(),
        Some("null") => "null".to_string(),
        Some("array") => "an array".to_string(),
        Some("object") => "an object".to_string(),
        _ if schema.contains_key("properties") => "an object".to_string(),
        _ if schema.contains_key("items") => "an array".to_string(),
        _ => "anything".to_string(),
    }
}

/// [`describe`] for a schema that may be a boolean rather than an object.
fn describe_value_schema(schema: &Value, depth: usize) -> String {
    match schema {
        Value::Object(schema) => describe(schema, depth),
        Value::Bool(false) => "nothing".to_string(),
        _ => "anything".to_string(),
    }
}

/// `one of "free", "pro"`; a long enum is cut short because the message is for
/// reading, and the plan holds the full list.
fn describe_enum(variants: &[Value]) -> String {
    let mut shown: Vec<String> = variants.iter().take(SHOWN).map(describe_variant).collect();
    if variants.len() > SHOWN {
        shown.push(format!("… ({} in all)", variants.len()));
    }
    match variants.len() {
        0 => "nothing (the enum is empty)".to_string(),
        1 => shown.remove(0),
        _ => format!("one of {}", shown.join(", ")),
    }
}

/// One variant as JSON, a long one cut short.
fn describe_variant(variant: &Value) -> String {
    match variant {
        Value::String(_) => describe_value(variant),
        other => cut(&other.to_string(), 40),
    }
}

/// "no field `x` (allowed: `a`, `b`)"; a long name is cut, and a record of
/// many fields says how many first, then names a few.
fn describe_extra(name: &str, properties: &Map<String, Value>) -> String {
    let name = cut(name, 40);
    if properties.is_empty() {
        return format!("no field `{name}` (the object allows no fields)");
    }
    // Fewer than SHOWN: field names are longer than variants, and the
    // message must stay whole within MAX_PART_CHARS.
    const FIELDS_SHOWN: usize = 5;
    let allowed: Vec<String> = properties
        .keys()
        .take(FIELDS_SHOWN)
        .map(|k| format!("`{}`", cut(k, 24)))
        .collect();
    if properties.len() > FIELDS_SHOWN {
        format!(
            "no field `{name}` ({} allowed, such as {}, …)",
            properties.len(),
            allowed.join(", ")
        )
    } else {
        format!("no field `{name}` (allowed: {})", allowed.join(", "))
    }
}

/// A path cut to [`MAX_PART_CHARS`]: its start and its end, which say where
/// in the value and which field.
fn cut_path(path: &str) -> String {
    let count = path.chars().count();
    if count <= MAX_PART_CHARS {
        return path.to_string();
    }
    let head: String = path.chars().take(MAX_PART_CHARS / 4).collect();
    let keep = MAX_PART_CHARS - MAX_PART_CHARS / 4 - 1;
    let tail: String = path.chars().skip(count - keep).collect();
    format!("{head}…{tail}")
}

/// A short description of a value for the `found` half of a mismatch. Strings
/// are quoted and cut short, and containers are summarised, because the whole
/// value may be large and is available to whoever needs it.
pub(crate) fn describe_value(value: &Value) -> String {
    const MAX_CHARS: usize = 40;
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("a number {n}"),
        Value::String(s) => {
            let count = s.chars().count();
            if count > MAX_CHARS {
                let head: String = s.chars().take(MAX_CHARS).collect();
                format!("{}… ({count} characters)", Value::String(head))
            } else {
                Value::String(s.clone()).to_string()
            }
        }
        Value::Array(items) => match items.len() {
            0 => "an empty array".to_string(),
            1 => "an array of 1 item".to_string(),
            n => format!("an array of {n} items"),
        },
        Value::Object(_) => "an object".to_string(),
    }
}

fn mismatch(path: &str, expected: &str, value: &Value) -> Mismatch {
    Mismatch {
        path: path.to_string(),
        expected: expected.to_string(),
        found: describe_value(value),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A closed record schema, as the compiler emits for a record type.
    pub(crate) fn record(properties: Value, required: &[&str]) -> Value {
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }

    /// An optional type's schema.
    pub(crate) fn optional(inner: Value) -> Value {
        json!({ "anyOf": [inner, { "type": "null" }] })
    }

    fn duration() -> Value {
        json!({ "type": "string", "pattern": DURATION_PATTERN })
    }

    /// The mismatches as `path: expected, found` lines, which keeps the
    /// expectations of the tests readable.
    fn lines(schema: &Value, value: &Value) -> Vec<String> {
        validate(schema, value)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn anything_fits_the_empty_schema() {
        for value in [
            json!(null),
            json!(1),
            json!("x"),
            json!([1, {"a": []}]),
            json!({}),
        ] {
            assert!(validate(&json!({}), &value).is_empty());
            assert!(validate(&json!(true), &value).is_empty());
        }
    }

    #[test]
    fn the_false_schema_rejects_everything() {
        assert_eq!(
            lines(&json!(false), &json!(1)),
            ["expected nothing, found a number 1"]
        );
    }

    #[test]
    fn scalar_types() {
        let cases = [
            (
                "string",
                json!("hi"),
                json!(3),
                "expected a string, found a number 3",
            ),
            (
                "integer",
                json!(3),
                json!("3"),
                "expected an integer, found \"3\"",
            ),
            (
                "number",
                json!(3.5),
                json!(true),
                "expected a number, found true",
            ),
            (
                "boolean",
                json!(false),
                json!(null),
                "expected a boolean, found null",
            ),
            (
                "null",
                json!(null),
                json!(0),
                "expected null, found a number 0",
            ),
            (
                "array",
                json!([]),
                json!({}),
                "expected an array, found an object",
            ),
            (
                "object",
                json!({}),
                json!([1, 2]),
                "expected an object, found an array of 2 items",
            ),
        ];
        for (ty, good, bad, message) in cases {
            let schema = json!({ "type": ty });
            assert!(validate(&schema, &good).is_empty(), "{ty} rejected {good}");
            assert_eq!(lines(&schema, &bad), [message], "{ty}");
        }
    }

    #[test]
    fn integers_are_numbers_parsed_as_whole_numbers() {
        let int = json!({ "type": "integer" });
        let number = json!({ "type": "number" });
        // Parsed from text, as user input and LLM output are.
        for text in [
            "3",
            "-3",
            "0",
            "9223372036854775807",
            "-9223372036854775808",
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert!(validate(&int, &value).is_empty(), "{text}");
            assert!(validate(&number, &value).is_empty(), "{text}");
        }
        // An `int` is 64 bits and signed, as the language's literals are.
        for text in ["9223372036854775808", "18446744073709551615"] {
            let value: Value = serde_json::from_str(text).unwrap();
            let found = validate(&int, &value);
            assert_eq!(found.len(), 1, "{text}");
            assert_eq!(
                found[0].expected,
                "an integer of at most 9223372036854775807"
            );
            assert!(validate(&number, &value).is_empty(), "{text}");
        }
        // A fraction or an exponent makes an f64 even when the value is whole:
        // such a number is a float to flow, so it is not an integer.
        for text in ["3.5", "3.0", "1e3", "-0.0"] {
            let value: Value = serde_json::from_str(text).unwrap();
            let found = validate(&int, &value);
            assert_eq!(found.len(), 1, "{text}");
            assert_eq!(found[0].expected, "an integer");
            assert!(validate(&number, &value).is_empty(), "{text}");
        }
        assert_eq!(
            lines(&int, &json!(3.5)),
            ["expected an integer, found a number 3.5"]
        );
        assert_eq!(
            lines(&int, &json!(3.0)),
            ["expected an integer, found a number 3.0"]
        );
    }

    /// Regression (an audit): a model's `3.0` for an `int` field was
    /// refused, a repair spent and the step failed `invalid_output`.
    #[test]
    fn a_models_whole_floats_are_integers_where_the_schema_asks() {
        let schema = json!({
            "type": "object",
            "properties": {
                "n": { "type": "integer" },
                "x": { "type": "number" },
                "maybe": { "anyOf": [{ "type": "integer" }, { "type": "null" }] },
                "list": { "type": "array", "items": { "type": "integer" } }
            }
        });
        let mut value = json!({ "n": 3.0, "x": 2.0, "maybe": 1e3, "list": [1.0, 2.5, -0.0] });
        super::whole_floats_to_integers(&schema, &mut value);
        assert_eq!(
            value,
            json!({ "n": 3, "x": 2.0, "maybe": 1000, "list": [1, 2.5, 0] })
        );
        assert_eq!(
            lines(&schema, &value),
            ["/list/1: expected an integer, found a number 2.5"]
        );
    }

    #[test]
    fn enums() {
        let schema = json!({ "type": "string", "enum": ["free", "pro"] });
        assert!(validate(&schema, &json!("pro")).is_empty());
        assert_eq!(
            lines(&schema, &json!("gold")),
            [r#"expected one of "free", "pro", found "gold""#]
        );
        // The wrong type is described by the variants, which is what to write.
        assert_eq!(
            lines(&schema, &json!(1)),
            [r#"expected one of "free", "pro", found a number 1"#]
        );
        let single = json!({ "type": "string", "enum": ["only"] });
        assert_eq!(
            lines(&single, &json!("x")),
            [r#"expected "only", found "x""#]
        );
    }

    #[test]
    fn durations() {
        for good in ["30s", "0ms", "15m", "2h", "7d", "0001s"] {
            assert!(validate(&duration(), &json!(good)).is_empty(), "{good}");
        }
        for bad in [
            "", "s", "30", "30 s", "30sec", "-1s", "1.5h", "30S", "١s", "30ms ",
        ] {
            let found = validate(&duration(), &json!(bad));
            assert_eq!(found.len(), 1, "{bad:?}");
            assert_eq!(found[0].expected, DURATION_WORDS);
        }
        assert_eq!(
            lines(&duration(), &json!(30)),
            [format!("expected {DURATION_WORDS}, found a number 30")]
        );
    }

    #[test]
    fn unknown_patterns_and_keywords_are_ignored() {
        let schema =
            json!({ "type": "string", "pattern": "^a$", "minLength": 9, "format": "email" });
        assert!(validate(&schema, &json!("b")).is_empty());
        let unknown_type = json!({ "type": "decimal" });
        assert!(validate(&unknown_type, &json!("1.0")).is_empty());
    }

    #[test]
    fn arrays_report_item_indexes() {
        let schema = json!({ "type": "array", "items": { "type": "integer" } });
        assert!(validate(&schema, &json!([])).is_empty());
        assert!(validate(&schema, &json!([1, 2])).is_empty());
        assert_eq!(
            lines(&schema, &json!([1, "2", 3, 4.5])),
            [
                "/1: expected an integer, found \"2\"",
                "/3: expected an integer, found a number 4.5"
            ]
        );
    }

    #[test]
    fn nested_paths() {
        let contact = record(json!({ "email": { "type": "string" } }), &["email"]);
        let schema = record(
            json!({
                "customer": record(json!({ "plan": { "type": "string", "enum": ["free", "pro"] } }), &["plan"]),
                "contacts": { "type": "array", "items": contact },
            }),
            &["customer", "contacts"],
        );
        let value = json!({
            "customer": { "plan": "gold" },
            "contacts": [{ "email": "a@x" }, { "email": "b@x" }, { "email": "c@x" }, { "email": 7 }],
        });
        let mut found = lines(&schema, &value);
        found.sort();
        assert_eq!(
            found,
            [
                "/contacts/3/email: expected a string, found a number 7",
                r#"/customer/plan: expected one of "free", "pro", found "gold""#,
            ]
        );
    }

    #[test]
    fn missing_and_extra_fields() {
        let schema = record(
            json!({ "a": { "type": "string" }, "b": { "type": "integer" }, "c": optional(json!({ "type": "boolean" })) }),
            &["a", "b"],
        );
        assert!(validate(&schema, &json!({ "a": "x", "b": 1 })).is_empty());
        assert!(validate(&schema, &json!({ "a": "x", "b": 1, "c": null })).is_empty());
        assert_eq!(
            lines(&schema, &json!({ "x": 1 })),
            [
                "/x: expected no field `x` (allowed: `a`, `b`, `c`), found a number 1",
                "/a: expected a string, found missing",
                "/b: expected an integer, found missing",
            ]
        );
        let closed_empty = record(json!({}), &[]);
        assert_eq!(
            lines(&closed_empty, &json!({ "y": [] })),
            ["/y: expected no field `y` (the object allows no fields), found an empty array"]
        );
        // Without `additionalProperties: false` extra fields are allowed.
        let open = json!({ "type": "object", "properties": { "a": { "type": "string" } } });
        assert!(validate(&open, &json!({ "z": 1 })).is_empty());
    }

    #[test]
    fn several_mismatches_at_once_in_document_order() {
        let schema = record(
            json!({
                "a": { "type": "string" },
                "b": { "type": "array", "items": { "type": "number" } },
                "c": { "type": "boolean" },
                "d": { "type": "null" },
            }),
            &["a", "b", "c", "d"],
        );
        let value = json!({ "a": 1, "b": [1, "x", 2, null], "c": "yes" });
        assert_eq!(
            lines(&schema, &value),
            [
                "/a: expected a string, found a number 1",
                "/b/1: expected a number, found \"x\"",
                "/b/3: expected a number, found null",
                "/c: expected a boolean, found \"yes\"",
                "/d: expected null, found missing",
            ]
        );
    }

    #[test]
    fn optionals() {
        let schema = optional(json!({ "type": "string" }));
        assert!(validate(&schema, &json!(null)).is_empty());
        assert!(validate(&schema, &json!("x")).is_empty());
        assert_eq!(
            lines(&schema, &json!(1)),
            ["expected a string or null, found a number 1"]
        );

        // Inside an optional record, the record's own mismatches are reported
        // unchanged: "or null" only makes sense for the whole value.
        let schema = optional(record(json!({ "n": { "type": "integer" } }), &["n"]));
        assert!(validate(&schema, &json!(null)).is_empty());
        assert_eq!(
            lines(&schema, &json!({ "n": "1" })),
            ["/n: expected an integer, found \"1\""]
        );
        assert_eq!(
            lines(&schema, &json!("1")),
            ["expected an object or null, found \"1\""]
        );

        let optional_enum = optional(json!({ "type": "string", "enum": ["a", "b"] }));
        assert_eq!(
            lines(&optional_enum, &json!("c")),
            [r#"expected one of "a", "b" or null, found "c""#]
        );
    }

    #[test]
    fn unions_without_null_get_one_summary() {
        let schema = json!({ "anyOf": [{ "type": "string" }, { "type": "integer" }] });
        assert!(validate(&schema, &json!(1)).is_empty());
        assert!(validate(&schema, &json!("1")).is_empty());
        assert_eq!(
            lines(&schema, &json!(1.5)),
            ["expected a string or an integer, found a number 1.5"]
        );
    }

    #[test]
    fn field_names_are_escaped_in_paths() {
        let schema = record(
            json!({ "a/b": { "type": "string" }, "c~d": { "type": "string" } }),
            &["a/b", "c~d"],
        );
        let found = validate(&schema, &json!({ "a/b": 1 }));
        let paths: Vec<&str> = found.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/a~1b", "/c~0d"]);
    }

    #[test]
    fn long_strings_are_cut_short() {
        let long = "x".repeat(100);
        let found = validate(&json!({ "type": "integer" }), &json!(long));
        assert_eq!(
            found[0].found,
            format!("\"{}\"… (100 characters)", "x".repeat(40))
        );
    }

    /// A list nested `levels` deep, ending in an integer, and its schema.
    fn nested(levels: usize) -> (Value, Value) {
        let mut schema = json!({ "type": "integer" });
        let mut value = json!(1);
        for _ in 0..levels {
            schema = json!({ "type": "array", "items": schema });
            value = json!([value]);
        }
        (schema, value)
    }

    #[test]
    fn depth_limit() {
        let (schema, value) = nested(MAX_DEPTH);
        assert!(validate(&schema, &value).is_empty());

        let (schema, value) = nested(MAX_DEPTH + 50);
        let found = validate(&schema, &value);
        assert_eq!(found.len(), 1);
        // The path is 257 levels long, so it is cut to its start and end.
        let path = "/0".repeat(MAX_DEPTH + 1);
        assert_eq!(found[0].path, cut_path(&path));
        assert_eq!(found[0].path.chars().count(), MAX_PART_CHARS);
        assert!(found[0].path.starts_with("/0/0") && found[0].path.ends_with("0/0"));
        assert_eq!(found[0].expected, "a value nested at most 256 levels deep");

        // A deep value under a shallow schema is only looked at as far as the
        // schema goes.
        let (_, value) = nested(MAX_DEPTH * 4);
        assert!(validate(&json!({}), &value).is_empty());
        assert_eq!(
            lines(
                &json!({ "type": "array", "items": { "type": "integer" } }),
                &value
            ),
            ["/0: expected an integer, found an array of 1 item"]
        );

        // A chain of unions nests the schema without nesting the value; the
        // limit holds there too.
        let mut schema = json!({ "type": "string" });
        for _ in 0..MAX_DEPTH + 10 {
            schema = optional(schema);
        }
        assert_eq!(
            lines(&schema, &json!(1)),
            ["expected a value nested at most 256 levels deep, found deeper nesting"]
        );
        assert!(validate(&schema, &json!(null)).is_empty());
    }

    /// Regression (issue 21): a 6 KB input against an `anyOf` of 20,000
    /// branches answered 480 MB, a mismatch per item naming every branch.
    /// Now each item is one short mismatch, and only 100 are listed.
    #[test]
    fn a_union_of_many_branches_answers_a_bounded_list() {
        let branches: Vec<Value> = (0..20_000)
            .map(|i| json!({ "type": "string", "enum": [format!("v{i}")] }))
            .collect();
        let schema = json!({ "type": "array", "items": { "anyOf": branches } });
        let value = json!(vec![1; 110]);
        let found = validate(&schema, &value);
        assert_eq!(found.len(), MAX_MISMATCHES);
        assert_eq!(found.omitted, 10);
        assert_eq!(
            found[0].to_string(),
            "/0: expected \"v0\" or \"v1\" or \"v2\" or \"v3\" or \"v4\" or \"v5\" or \"v6\" or \"v7\" or \"v8\" or \"v9\" or … (20000 in all), found a number 1"
        );
        assert!(found.to_string().ends_with("; and 10 more"));
        assert!(validate(&schema, &json!(["v19999"])).is_empty());
    }

    #[test]
    fn at_most_100_mismatches_are_listed_and_the_rest_counted() {
        let schema = json!({ "type": "array", "items": { "type": "integer" } });
        let found = validate(&schema, &json!(vec!["x"; 250]));
        assert_eq!(found.len(), MAX_MISMATCHES);
        assert_eq!(found.omitted, 150);
        assert_eq!(found[99].path, "/99");
        // Counted even where they are not listed: missing required fields.
        let names: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
        let properties: Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), json!({ "type": "string" })))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let found = validate(&record(Value::Object(properties), &names), &json!({}));
        assert_eq!((found.len(), found.omitted), (100, 200));
        assert_eq!(found[0].path, "/f000");
    }

    /// Each part of a mismatch is at most `MAX_PART_CHARS` characters,
    /// whatever the value's field names or the schema's width.
    #[test]
    fn every_part_of_a_mismatch_is_cut_short() {
        let wide: Map<String, Value> = (0..5_000)
            .map(|i| {
                (
                    format!("{}{i}", "field".repeat(20)),
                    json!({ "type": "string" }),
                )
            })
            .collect();
        let long_name = "k".repeat(1_000_000);
        let deep_name = "d".repeat(10_000);
        let schema = json!({
            "type": "object",
            "properties": {
                "nested": record(json!({ deep_name.clone(): { "type": "integer" } }), &[]),
                "wide": { "type": "object", "properties": wide, "required": [], "additionalProperties": false },
                "choice": { "type": "string", "enum": ["x".repeat(10_000), "y".repeat(10_000)] },
            },
            "required": [],
            "additionalProperties": false,
        });
        let value = json!({
            long_name.clone(): 1,
            "nested": { deep_name: "not a number" },
            "wide": { long_name: 1 },
            "choice": "z".repeat(10_000),
        });
        let found = validate(&schema, &value);
        assert_eq!(found.len(), 4, "{found:?}");
        for mismatch in &found {
            for part in [&mismatch.path, &mismatch.expected, &mismatch.found] {
                assert!(
                    part.chars().count() <= MAX_PART_CHARS + " or null".len(),
                    "{} characters: {part}",
                    part.chars().count()
                );
            }
        }
        assert!(
            found
                .iter()
                .any(|m| m.expected.contains("(5000 allowed, such as `fieldfield")),
            "{found:?}"
        );
    }

    #[test]
    fn display() {
        let m = Mismatch {
            path: "/customer/plan".into(),
            expected: r#"one of "free", "pro""#.into(),
            found: r#""gold""#.into(),
        };
        assert_eq!(
            m.to_string(),
            r#"/customer/plan: expected one of "free", "pro", found "gold""#
        );
        let root = Mismatch {
            path: String::new(),
            ..m
        };
        assert_eq!(
            root.to_string(),
            r#"expected one of "free", "pro", found "gold""#
        );
    }
}
