//! JSON from outside (a run's input, over the API or `flow run --input`)
//! read as `serde_json::Value` is, but with a key given twice in one object
//! refused rather than the last one kept. RFC 8259 leaves such an object's
//! meaning to each reader, so a proxy in front of flowd, a script's checks
//! and flowd could each see another input; flowd's own request fields are
//! refused twice by serde already.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// `text` as a JSON value whose objects give each key once.
pub fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = value(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// For `#[serde(deserialize_with = "flow_plan::unique_keys::value")]`.
pub fn value<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    deserializer.deserialize_any(UniqueKeys)
}

struct UniqueKeys;

impl<'de> de::DeserializeSeed<'de> for UniqueKeys {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        // As serde_json's own `Value`: JSON text has no NaN or infinity.
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_string()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut list = Vec::with_capacity(items.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = items.next_element_seed(UniqueKeys)? {
            list.push(item);
        }
        Ok(Value::Array(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "the key `{}` is given twice in one object",
                    crate::inert(&crate::cut(&key, 60))
                )));
            }
            let value = entries.next_value_seed(UniqueKeys)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        for text in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"ticket": {"id": "T-1", "id": "T-2"}}"#,
            r#"[{"x": null}, {"y": [1, {"z": 0, "z": 0}]}]"#,
        ] {
            let error = from_str(text).expect_err(text).to_string();
            assert!(
                error.contains("is given twice in one object"),
                "{text}: {error}"
            );
            assert!(error.contains("line 1"), "{text}: {error}");
        }
    }

    #[test]
    fn everything_else_reads_as_serde_json_reads_it() {
        for text in [
            r#"{"a": 1, "b": {"a": 1}, "c": [{"a": 1}, {"a": 2}]}"#,
            r#"[1, -2, 3.5, 18446744073709551615, -9223372036854775808, 1e300]"#,
            r#""text \u00e9 \ud83d\ude00""#,
            "null",
            " true ",
            "{}",
        ] {
            assert_eq!(
                from_str(text).expect(text),
                serde_json::from_str::<Value>(text).unwrap(),
                "{text}"
            );
        }
        assert!(from_str("{} {}").is_err(), "trailing text is refused");
    }
}
