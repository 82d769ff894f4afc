//! The JSON Schemas of a plan, read back as the types they were lowered from.
//!
//! Lowering writes a schema for each type with `Ty::json_schema` (in
//! `flow-compiler`'s `check/types.rs`), in a few shapes only, which
//! [`Plan::validate`](crate::Plan::validate) enforces: `{}` for `json`, a
//! `type` (with `enum` for an enum, `pattern` for a duration, `items` for a
//! list, `properties`, `required` and `additionalProperties: false` for a
//! record), and `anyOf: [T, {"type": "null"}]` for an optional. The runtime
//! sees only plans, so what it must know of types it reads here: whether a
//! value recorded under one version's schema is one that another version's
//! readers accept ([`assignable`], the rule of `Ty::assignable_to`, which a
//! test in `check/types.rs` holds the two to), what a reference along a
//! path finds ([`project`]), and how to name a type in a message
//! ([`show`]).

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::PathSegment;

/// `{}`: any value, unchecked (`json`).
fn is_any(schema: &Value) -> bool {
    schema.as_object().is_some_and(|map| map.is_empty())
}

/// The `T` of an optional's `anyOf: [T, null]`.
fn optional_inner(schema: &Value) -> Option<&Value> {
    match schema.get("anyOf")?.as_array()?.as_slice() {
        [inner, null] if is_null(null) => Some(inner),
        _ => None,
    }
}

/// `{"type": "null"}`: the type of `null`, and of what is absent.
pub fn is_null(schema: &Value) -> bool {
    type_of(schema) == Some("null")
}

fn type_of(schema: &Value) -> Option<&str> {
    schema.get("type")?.as_str()
}

/// Whether the schema accepts `null`: an optional, `null` itself or `json`.
fn accepts_null(schema: &Value) -> bool {
    is_any(schema) || is_null(schema) || optional_inner(schema).is_some()
}

/// The optional of a schema, unless it accepts `null` already (as
/// `Ty::optional` leaves an optional, `null` and `json` as they are).
pub fn optional(schema: Cow<'_, Value>) -> Cow<'_, Value> {
    if accepts_null(&schema) {
        schema
    } else {
        Cow::Owned(json!({ "anyOf": [schema.into_owned(), { "type": "null" }] }))
    }
}

/// The variants of an enum's schema.
fn variants(schema: &Value) -> Option<&Vec<Value>> {
    schema.get("enum")?.as_array()
}

/// Whether every value of schema `from` may be used where schema `to` is
/// expected: `Ty::assignable_to` on the types the schemas were lowered
/// from. `json` fits anywhere and takes anything (its check is deferred to
/// run time); `int` fits `float`; an enum fits `string` and any enum with
/// all its variants; a value fits its optional and `null` every optional;
/// lists by their items; a record fits a record that declares each of its
/// fields, with an assignable type, and needs nothing else (its other
/// fields optional).
pub fn assignable(from: &Value, to: &Value) -> bool {
    if is_any(from) || is_any(to) || from == to {
        return true;
    }
    match (optional_inner(from), optional_inner(to)) {
        (Some(from), Some(to)) => return assignable(from, to),
        (Some(_), None) => return false,
        (None, Some(to)) => return is_null(from) || assignable(from, to),
        (None, None) => {}
    }
    // Schemas that differ in their `description`s only (a field's doc) are
    // of one type, so each shape is compared here, not only by `==`.
    match (type_of(from), type_of(to)) {
        (Some("integer"), Some("integer" | "number")) => true,
        (Some(from), Some(to)) if from == to && matches!(from, "number" | "boolean" | "null") => {
            true
        }
        (Some("string"), Some("string")) => match (variants(from), variants(to)) {
            // An enum fits a plain string, not a duration's pattern.
            (Some(_), None) => to.get("pattern").is_none(),
            (Some(from), Some(to)) => from.iter().all(|variant| to.contains(variant)),
            // A string fits a string, a duration a duration.
            (None, None) => from.get("pattern") == to.get("pattern"),
            (None, Some(_)) => false,
        },
        (Some("array"), Some("array")) => match (from.get("items"), to.get("items")) {
            (Some(from), Some(to)) => assignable(from, to),
            _ => false,
        },
        (Some("object"), Some("object")) => record_assignable(from, to),
        _ => false,
    }
}

fn record_assignable(from: &Value, to: &Value) -> bool {
    let (Some(from_fields), Some(to_fields)) = (properties(from), properties(to)) else {
        return false;
    };
    let required = |name: &str| {
        to.get("required")
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|n| n == name))
    };
    from_fields.keys().all(|name| to_fields.contains_key(name))
        && to_fields
            .iter()
            .all(|(name, to_ty)| match from_fields.get(name) {
                Some(from_ty) => assignable(from_ty, to_ty),
                None => !required(name),
            })
}

fn properties(schema: &Value) -> Option<&serde_json::Map<String, Value>> {
    schema.get("properties")?.as_object()
}

/// What a reference along `path` into a value of `schema` finds, as a
/// schema: a record's field (absent, so `null`, when the record does not
/// declare it), a list's item, anything below `json`; optional when a
/// step of the way may be `null`. `None` when the path cannot go on in
/// such a value (a field of a string, an index of a record), which at run
/// time is an error.
pub fn project<'a>(schema: &'a Value, path: &[PathSegment]) -> Option<Cow<'a, Value>> {
    let mut at = schema;
    let mut nullable = false;
    for (index, segment) in path.iter().enumerate() {
        if is_any(at) {
            return Some(Cow::Borrowed(at));
        }
        if let Some(inner) = optional_inner(at) {
            nullable = true;
            at = inner;
        }
        at = match (segment, type_of(at)) {
            (PathSegment::Field(name), Some("object")) => {
                match at.get("properties").and_then(|p| p.get(name)) {
                    Some(field) => field,
                    // What a record does not declare it never holds.
                    None if index + 1 == path.len() => return Some(Cow::Owned(null())),
                    None => return None,
                }
            }
            (PathSegment::Index(_), Some("array")) => {
                // An index past the end finds nothing.
                nullable = true;
                at.get("items")?
            }
            _ => return None,
        };
    }
    let found = Cow::Borrowed(at);
    Some(if nullable { optional(found) } else { found })
}

fn null() -> Value {
    json!({ "type": "null" })
}

/// The type a schema was lowered from, written as in a source file
/// (`{ tags: list<string>, kind: ("x")? }`), for messages. What is not one
/// of the lowered shapes shows as `json`.
pub fn show(schema: &Value) -> String {
    let mut out = String::new();
    write(schema, &mut out, 0);
    crate::cut(&out, 200)
}

fn write(schema: &Value, out: &mut String, depth: usize) {
    // Messages are cut at 200 characters; deeper types say no more.
    if depth > 16 || out.len() > 400 {
        out.push('…');
        return;
    }
    if let Some(inner) = optional_inner(schema) {
        let parenthesised = variants(inner).is_some();
        out.push_str(if parenthesised { "(" } else { "" });
        write(inner, out, depth + 1);
        out.push_str(if parenthesised { ")?" } else { "?" });
        return;
    }
    match type_of(schema) {
        Some("string") if variants(schema).is_some() => {
            let shown: Vec<String> = variants(schema)
                .into_iter()
                .flatten()
                .map(Value::to_string)
                .collect();
            out.push_str(&shown.join(" | "));
        }
        Some("string") if schema.get("pattern").is_some() => out.push_str("duration"),
        Some("string") => out.push_str("string"),
        Some("integer") => out.push_str("int"),
        Some("number") => out.push_str("float"),
        Some("boolean") => out.push_str("bool"),
        Some("null") => out.push_str("null"),
        Some("array") => {
            out.push_str("list<");
            write(schema.get("items").unwrap_or(&Value::Null), out, depth + 1);
            out.push('>');
        }
        Some("object") => {
            out.push_str("{ ");
            let fields = schema.get("properties").and_then(Value::as_object);
            for (index, (name, field)) in fields.into_iter().flatten().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                out.push_str(name);
                out.push_str(": ");
                write(field, out, depth + 1);
            }
            out.push_str(" }");
        }
        _ => out.push_str("json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fields: &[(&str, Value, bool)]) -> Value {
        let properties: serde_json::Map<String, Value> = fields
            .iter()
            .map(|(name, schema, _)| (name.to_string(), schema.clone()))
            .collect();
        let required: Vec<&str> = fields
            .iter()
            .filter(|(_, _, required)| *required)
            .map(|(name, _, _)| *name)
            .collect();
        json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
    }

    fn field(name: &str) -> PathSegment {
        PathSegment::Field(name.to_string())
    }

    #[test]
    fn projection_follows_fields_items_and_optionals() {
        let string = json!({ "type": "string" });
        let inner = record(&[("x", string.clone(), true)]);
        let schema = record(&[
            ("a", optional(Cow::Borrowed(&inner)).into_owned(), false),
            ("list", json!({ "type": "array", "items": string }), true),
        ]);
        let found = project(&schema, &[field("a"), field("x")]).unwrap();
        assert_eq!(show(&found), "string?");
        let item = project(&schema, &[field("list"), PathSegment::Index(3)]).unwrap();
        assert_eq!(show(&item), "string?");
        assert!(is_null(&project(&schema, &[field("missing")]).unwrap()));
        assert_eq!(project(&schema, &[field("list"), field("x")]), None);
        assert_eq!(
            project(&json!({}), &[field("a"), field("b")])
                .unwrap()
                .as_ref(),
            &json!({})
        );
    }

    #[test]
    fn show_writes_types_as_sources_do() {
        let schema = record(&[
            (
                "tags",
                json!({ "type": "array", "items": { "type": "integer" } }),
                true,
            ),
            (
                "kind",
                json!({ "anyOf": [{ "type": "string", "enum": ["x"] }, { "type": "null" }] }),
                false,
            ),
        ]);
        assert_eq!(show(&schema), r#"{ kind: ("x")?, tags: list<int> }"#);
    }
}
