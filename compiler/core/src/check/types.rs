//! The checker's types: what a value can be, assignability, and display.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde_json::{Value, json};

/// Above this many pairs, comparing two enums' variants or two records'
/// fields goes through a set rather than nested scans.
const SCAN_MOST: usize = 1_024;

/// A record with more fields than this is read through an index of them
/// (`Checker::field_of`, the lowerer's wide input), not a scan.
pub(crate) const INDEXED_FIELDS: usize = 32;

/// The position of each item of a list by its name (the first of a name
/// repeated): a scan of a short list, an index of one wider than
/// [`INDEXED_FIELDS`] (a wide recipe's inputs or a workflow's, which a scan
/// for each argument or reference made quadratic).
pub(crate) struct Positions<'a, T> {
    items: &'a [T],
    name: fn(&T) -> &str,
    index: Option<HashMap<&'a str, usize>>,
}

impl<'a, T> Positions<'a, T> {
    pub(crate) fn new(items: &'a [T], name: fn(&T) -> &str) -> Self {
        let index = (items.len() > INDEXED_FIELDS).then(|| {
            let mut index = HashMap::with_capacity(items.len());
            for (at, item) in items.iter().enumerate() {
                index.entry(name(item)).or_insert(at);
            }
            index
        });
        Positions { items, name, index }
    }

    pub(crate) fn of(&self, name: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(name).copied(),
            None => self.items.iter().position(|item| (self.name)(item) == name),
        }
    }
}

/// The fields of wide records (more than [`INDEXED_FIELDS`]), each found
/// through an index made once per record: scanning one for each reference
/// made a workflow of 50,000 input fields, each read once, take 7 s to
/// check, and a prompt reading each of 30,000 inputs as long.
#[derive(Debug, Default)]
pub(crate) struct WideRecords {
    /// Each record by its address, kept with its index so that the address
    /// is not another record's while the index is.
    indexed: HashMap<usize, IndexedRecord>,
}

/// A record's fields, and the position of each by name.
type IndexedRecord = (Arc<[(String, Ty)]>, HashMap<String, usize>);

impl WideRecords {
    /// The type of the field `name` of a record of `fields`.
    pub(crate) fn field_of(&mut self, fields: &Arc<[(String, Ty)]>, name: &str) -> Option<Ty> {
        if fields.len() <= INDEXED_FIELDS {
            return fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, ty)| ty.clone());
        }
        let key = Arc::as_ptr(fields) as *const () as usize;
        let (_, index) = self.indexed.entry(key).or_insert_with(|| {
            let mut index = HashMap::with_capacity(fields.len());
            for (at, (field, _)) in fields.iter().enumerate() {
                index.entry(field.clone()).or_insert(at);
            }
            (Arc::clone(fields), index)
        });
        index.get(name).map(|&at| fields[at].1.clone())
    }
}

/// A resolved type. Aliases are gone; records keep their field order.
///
/// Compound types share their parts through `Arc`: a recipe's output type is
/// copied into every step that calls it and every reference that reads it, and
/// a copy must not allocate. (`Eq` makes comparing two `Arc`s of one part
/// a pointer comparison: a type's parts can be shared exponentially often.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// The type of an expression that already has an error: it fits anywhere,
    /// so one mistake gives one diagnostic.
    Any,
    /// Unchecked JSON: any field or index of it is `json` again.
    Json,
    String,
    Int,
    Float,
    Bool,
    Duration,
    Null,
    /// A union of string literals, in declaration order.
    Enum(Arc<[String]>),
    List(Arc<Ty>),
    Record(Arc<[(String, Ty)]>),
    Optional(Arc<Ty>),
}

impl Ty {
    pub fn optional(self) -> Ty {
        match self {
            Ty::Optional(_) | Ty::Any | Ty::Null => self,
            other => Ty::Optional(Arc::new(other)),
        }
    }

    /// A literal of this type for a quick fix to fill in and the author to
    /// replace: an empty string or list, zero, `false`, an enum's first
    /// variant, a record of its required fields. `None` for `any`, which is
    /// the type of a mistake, not of a value.
    pub fn placeholder(&self) -> Option<String> {
        Some(match self {
            Ty::Any => return None,
            Ty::Json | Ty::Null | Ty::Optional(_) => "null".to_string(),
            Ty::String => "\"\"".to_string(),
            Ty::Int => "0".to_string(),
            Ty::Float => "0.0".to_string(),
            Ty::Bool => "false".to_string(),
            Ty::Duration => "1s".to_string(),
            Ty::Enum(variants) => format!("\"{}\"", variants.first()?),
            Ty::List(_) => "[]".to_string(),
            Ty::Record(fields) => {
                let mut parts = Vec::new();
                for (name, ty) in fields.iter().filter(|(_, ty)| !ty.is_optional()) {
                    parts.push(format!("{name}: {}", ty.placeholder()?));
                }
                if parts.is_empty() {
                    "{}".to_string()
                } else {
                    format!("{{ {} }}", parts.join(", "))
                }
            }
        })
    }

    pub fn is_optional(&self) -> bool {
        matches!(self, Ty::Optional(_) | Ty::Null)
    }

    /// The type without its optional marker.
    pub fn required(&self) -> &Ty {
        match self {
            Ty::Optional(inner) => inner,
            other => other,
        }
    }

    pub fn record(fields: Vec<(String, Ty)>) -> Ty {
        Ty::Record(fields.into())
    }

    pub fn list(item: Ty) -> Ty {
        Ty::List(Arc::new(item))
    }

    pub fn enumeration(variants: Vec<String>) -> Ty {
        Ty::Enum(variants.into())
    }

    pub fn is_unchecked(&self) -> bool {
        matches!(self, Ty::Any | Ty::Json)
    }

    pub fn field(&self, name: &str) -> Option<&Ty> {
        match self {
            Ty::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, t)| t),
            _ => None,
        }
    }

    /// Whether a value of type `self` may be used where `target` is expected.
    pub fn assignable_to(&self, target: &Ty) -> bool {
        match (self, target) {
            (Ty::Any | Ty::Json, _) | (_, Ty::Any | Ty::Json) => true,
            (a, b) if a == b => true,
            (Ty::Int, Ty::Float) => true,
            (Ty::Enum(_), Ty::String) => true,
            (Ty::Enum(from), Ty::Enum(to)) => {
                // Two scans are fine for the labels people write; a set for
                // generated enums of thousands, where scans are quadratic.
                if from.len().saturating_mul(to.len()) <= SCAN_MOST {
                    from.iter().all(|v| to.contains(v))
                } else {
                    let to: HashSet<&String> = to.iter().collect();
                    from.iter().all(|v| to.contains(v))
                }
            }
            (Ty::Null, Ty::Optional(_)) => true,
            (Ty::Optional(from), Ty::Optional(to)) => from.assignable_to(to),
            (from, Ty::Optional(to)) => from.assignable_to(to),
            (Ty::List(from), Ty::List(to)) => from.assignable_to(to),
            (Ty::Record(from), Ty::Record(to)) => {
                let fits = |from_ty: Option<&Ty>, ty: &Ty| match from_ty {
                    Some(from_ty) => from_ty.assignable_to(ty),
                    None => ty.is_optional(),
                };
                if from.len().saturating_mul(to.len()) <= SCAN_MOST {
                    from.iter()
                        .all(|(name, _)| to.iter().any(|(n, _)| n == name))
                        && to.iter().all(|(name, ty)| {
                            fits(from.iter().find(|(n, _)| n == name).map(|(_, t)| t), ty)
                        })
                } else {
                    let from_fields: HashMap<&str, &Ty> =
                        from.iter().map(|(n, t)| (n.as_str(), t)).collect();
                    let to_names: HashSet<&str> = to.iter().map(|(n, _)| n.as_str()).collect();
                    from.iter()
                        .all(|(name, _)| to_names.contains(name.as_str()))
                        && to
                            .iter()
                            .all(|(name, ty)| fits(from_fields.get(name.as_str()).copied(), ty))
                }
            }
            _ => false,
        }
    }

    pub fn is_numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Float | Ty::Any | Ty::Json)
    }

    /// How deep this type's JSON Schema nests and how many values it holds,
    /// counted as `Plan::validate` counts them, without building it; which
    /// bound it is past once past
    /// [`MAX_SCHEMA_DEPTH`](flow_plan::limits::MAX_SCHEMA_DEPTH) levels or
    /// [`MAX_SCHEMA_NODES`](flow_plan::limits::MAX_SCHEMA_NODES) values.
    /// A type shares the parts its aliases name, so its schema can be
    /// exponentially larger than the type (`type B = { x: A, y: A }`, and
    /// so on for forty aliases): each shared part is walked once, and
    /// counted wherever it appears.
    pub fn schema_size(&self) -> Result<SchemaSize, SchemaPast> {
        self.schema_size_within(&mut SchemaSizes::default())
    }

    /// [`Ty::schema_size`] with what `sizes` knows of the parts measured
    /// before: a check measures each type it declares, and a part named by
    /// thousands of them (20,000 aliases each `{ x: Big }`, of a 30,000-field
    /// `Big`) was walked once for each.
    pub(crate) fn schema_size_within(
        &self,
        sizes: &mut SchemaSizes,
    ) -> Result<SchemaSize, SchemaPast> {
        use flow_plan::limits::{MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
        fn size(ty: &Ty, level: usize, sizes: &mut SchemaSizes) -> Result<SchemaSize, SchemaPast> {
            if level >= MAX_SCHEMA_DEPTH {
                return Err(SchemaPast::Depth);
            }
            // A shared part is known by where it is, and by what holds it
            // (a list and an optional of one part differ).
            let key = match ty {
                Ty::List(part) => (Arc::as_ptr(part) as *const () as usize, 0),
                Ty::Optional(part) => (Arc::as_ptr(part) as *const () as usize, 1),
                Ty::Record(fields) => (Arc::as_ptr(fields) as *const () as usize, 2),
                Ty::Enum(variants) => return Ok(SchemaSize::leaf(1 + variants.len())),
                _ => return Ok(SchemaSize::leaf(1)),
            };
            if let Some((_, known)) = sizes.measured.get(&key) {
                return match level + known.depth < MAX_SCHEMA_DEPTH {
                    true => Ok(*known),
                    false => Err(SchemaPast::Depth),
                };
            }
            // Each part: its schema, and the values beside it (an optional's
            // `{"type": "null"}`, a required field's name in `required`, as
            // `json_schema` writes them).
            let parts: Vec<(&Ty, usize)> = match ty {
                Ty::List(item) => vec![(&**item, 0)],
                Ty::Optional(inner) => vec![(&**inner, 1)],
                Ty::Record(fields) => fields
                    .iter()
                    .map(|(_, field)| (field, usize::from(!field.is_optional())))
                    .collect(),
                _ => unreachable!("only compound types have parts"),
            };
            let mut total = SchemaSize::leaf(1);
            for (part, beside) in parts {
                let part = size(part, level + 1, sizes)?;
                total.depth = total.depth.max(part.depth + 1);
                total.nodes = total.nodes.saturating_add(part.nodes + beside);
                if total.nodes > MAX_SCHEMA_NODES {
                    return Err(SchemaPast::Values);
                }
            }
            // Kept with the part, so that its address is not another's while
            // it is known by it.
            sizes.measured.insert(key, (ty.clone(), total));
            Ok(total)
        }
        // A part's count is held to the bound as it is added to its
        // container's; a type of one part (an enum) is held to it here.
        match size(self, 0, sizes)? {
            size if size.nodes > MAX_SCHEMA_NODES => Err(SchemaPast::Values),
            size => Ok(size),
        }
    }

    /// The JSON Schema (draft 2020-12) that a value of this type satisfies.
    pub fn json_schema(&self) -> Value {
        match self {
            Ty::Any | Ty::Json => json!({}),
            Ty::String => json!({ "type": "string" }),
            Ty::Int => json!({ "type": "integer" }),
            Ty::Float => json!({ "type": "number" }),
            Ty::Bool => json!({ "type": "boolean" }),
            Ty::Duration => json!({ "type": "string", "pattern": flow_plan::DURATION_PATTERN }),
            Ty::Null => json!({ "type": "null" }),
            Ty::Enum(variants) => json!({ "type": "string", "enum": &variants[..] }),
            Ty::List(item) => json!({ "type": "array", "items": item.json_schema() }),
            Ty::Record(fields) => {
                let properties: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|(name, ty)| (name.clone(), ty.json_schema()))
                    .collect();
                let required: Vec<&str> = fields
                    .iter()
                    .filter(|(_, ty)| !ty.is_optional())
                    .map(|(name, _)| name.as_str())
                    .collect();
                json!({
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                })
            }
            Ty::Optional(inner) => json!({ "anyOf": [inner.json_schema(), { "type": "null" }] }),
        }
    }
}

/// The bytes of types' JSON Schemas as [`Ty::json_schema`] writes them
/// (compact, names unescaped: escapes only add), without writing them.
/// Shared parts are measured once across the types measured by one
/// `SchemaBytes`, which must not outlive them (parts are known by their
/// address). A plan's schemas are written out in full wherever a type
/// appears, so a source of a megabyte made a plan of gigabytes.
#[derive(Debug, Default)]
pub(crate) struct SchemaBytes {
    measured: HashMap<(usize, u8), u64>,
}

impl SchemaBytes {
    /// The bytes of `ty`'s schema.
    pub(crate) fn of(&mut self, ty: &Ty) -> u64 {
        let key = match ty {
            Ty::List(part) => (Arc::as_ptr(part) as *const () as usize, 0),
            Ty::Optional(part) => (Arc::as_ptr(part) as *const () as usize, 1),
            Ty::Record(fields) => (Arc::as_ptr(fields) as *const () as usize, 2),
            Ty::Enum(variants) => {
                // `{"enum":[` and `],"type":"string"}`, each variant quoted,
                // commas between.
                let listed: u64 = variants.iter().map(|v| v.len() as u64 + 3).sum();
                return 26 + listed.max(1);
            }
            Ty::Any | Ty::Json => return 2,
            Ty::Duration => return 30 + flow_plan::DURATION_PATTERN.len() as u64,
            // `{"type":"…"}`.
            Ty::String => return 17,
            Ty::Int => return 18,
            Ty::Float => return 17,
            Ty::Bool => return 18,
            Ty::Null => return 15,
        };
        if let Some(&known) = self.measured.get(&key) {
            return known;
        }
        let bytes = match ty {
            // `{"items":…,"type":"array"}`.
            Ty::List(item) => 25u64.saturating_add(self.of(item)),
            // `{"anyOf":[…,{"type":"null"}]}`.
            Ty::Optional(inner) => 28u64.saturating_add(self.of(inner)),
            Ty::Record(fields) => self.record(fields),
            _ => unreachable!("only compound types are measured here"),
        };
        self.measured.insert(key, bytes);
        bytes
    }

    /// The bytes of the schema of a record of `fields`, which is not
    /// remembered: a record made for the call (a recipe's inputs) has an
    /// address that another may take once it is dropped.
    pub(crate) fn record(&mut self, fields: &[(String, Ty)]) -> u64 {
        // `{"additionalProperties":false,"properties":{…},"required":[…],"type":"object"}`:
        // each property `"name":…`, each required name `"name"`, commas
        // between (one fewer than counted, for each list that is not empty).
        let mut bytes: u64 = 76;
        for (name, ty) in fields {
            let name = name.len() as u64;
            bytes = bytes.saturating_add(name + 4).saturating_add(self.of(ty));
            if !ty.is_optional() {
                bytes = bytes.saturating_add(name + 3);
            }
        }
        let required = fields.iter().filter(|(_, ty)| !ty.is_optional()).count();
        bytes - u64::from(!fields.is_empty()) - u64::from(required > 0)
    }
}

/// The sizes of the parts of types measured by [`Ty::schema_size_within`],
/// each kept with its part (parts are known by their address).
#[derive(Debug, Default)]
pub(crate) struct SchemaSizes {
    measured: HashMap<(usize, u8), (Ty, SchemaSize)>,
}

/// What [`Ty::schema_size`] counts of a type's JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaSize {
    /// Levels below the top: a list's items, a record's fields, an optional.
    pub depth: usize,
    /// Values: schemas, enum variants and required names.
    pub nodes: usize,
}

/// Which bound of plans a type's JSON Schema would be past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaPast {
    /// It nests [`MAX_SCHEMA_DEPTH`](flow_plan::limits::MAX_SCHEMA_DEPTH) levels deep or deeper.
    Depth,
    /// It holds more than [`MAX_SCHEMA_NODES`](flow_plan::limits::MAX_SCHEMA_NODES) values.
    Values,
}

impl SchemaSize {
    fn leaf(nodes: usize) -> Self {
        SchemaSize { depth: 0, nodes }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ty(f, self, None)
    }
}

/// A type as its author wrote it: a record or an enum that a `type` alias
/// names is shown by that name (`Contact`, `list<Contact>`), the rest as
/// [`Ty`]'s display. See `Env::show`.
pub struct Named<'t> {
    pub ty: &'t Ty,
    /// The aliases in scope, by name.
    pub aliases: &'t HashMap<String, Ty>,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ty(f, self.ty, Some(self.aliases))
    }
}

/// The alias that names `ty`, a record or an enum, if one does (the first
/// by name, when several do).
pub(crate) fn alias_of<'a>(aliases: &'a HashMap<String, Ty>, ty: &Ty) -> Option<&'a str> {
    if !matches!(ty, Ty::Record(_) | Ty::Enum(_)) {
        return None;
    }
    aliases
        .iter()
        .filter(|(_, aliased)| *aliased == ty)
        .map(|(name, _)| name.as_str())
        .min()
}

/// Writes `ty`, with the alias names of its parts when `aliases` is given.
fn write_ty(
    f: &mut fmt::Formatter<'_>,
    ty: &Ty,
    aliases: Option<&HashMap<String, Ty>>,
) -> fmt::Result {
    if let Some(name) = aliases.and_then(|aliases| alias_of(aliases, ty)) {
        return f.write_str(name);
    }
    let name_of = aliases;
    match ty {
        Ty::Any => write!(f, "any"),
        Ty::Json => write!(f, "json"),
        Ty::String => write!(f, "string"),
        Ty::Int => write!(f, "int"),
        Ty::Float => write!(f, "float"),
        Ty::Bool => write!(f, "bool"),
        Ty::Duration => write!(f, "duration"),
        Ty::Null => write!(f, "null"),
        Ty::Enum(variants) => {
            let shown: Vec<String> = variants.iter().map(|v| format!("{v:?}")).collect();
            write!(f, "{}", shown.join(" | "))
        }
        Ty::List(item) => {
            write!(f, "list<")?;
            write_ty(f, item, name_of)?;
            write!(f, ">")
        }
        Ty::Record(fields) => {
            write!(f, "{{ ")?;
            for (index, (name, ty)) in fields.iter().enumerate() {
                if index > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{name}: ")?;
                write_ty(f, ty, name_of)?;
            }
            write!(f, " }}")
        }
        Ty::Optional(inner)
            if matches!(**inner, Ty::Enum(_))
                && name_of
                    .and_then(|aliases| alias_of(aliases, inner))
                    .is_none() =>
        {
            write!(f, "(")?;
            write_ty(f, inner, name_of)?;
            write!(f, ")?")
        }
        Ty::Optional(inner) => {
            write_ty(f, inner, name_of)?;
            write!(f, "?")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The types with no parts, `json` among them.
    fn leaves() -> Vec<Ty> {
        vec![
            Ty::Json,
            Ty::String,
            Ty::Int,
            Ty::Float,
            Ty::Bool,
            Ty::Duration,
            Ty::Null,
        ]
    }

    fn en(variants: &[&str]) -> Ty {
        Ty::enumeration(variants.iter().map(|v| v.to_string()).collect())
    }

    fn record(fields: &[(&str, Ty)]) -> Ty {
        Ty::Record(
            fields
                .iter()
                .map(|(n, t)| (n.to_string(), t.clone()))
                .collect(),
        )
    }

    /// `SchemaBytes` measures what `json_schema` writes, byte for byte,
    /// for every kind of type (names that need no escape).
    #[test]
    fn schema_bytes_are_the_written_schemas() {
        let inner = record(&[("a", Ty::Int), ("b", Ty::String.optional())]);
        let types = [
            vec![Ty::Any],
            leaves(),
            vec![
                en(&[]),
                en(&["low"]),
                en(&["low", "high", "x"]),
                Ty::list(Ty::Int),
                Ty::Int.optional(),
                record(&[]),
                record(&[("only", Ty::Bool.optional())]),
                inner.clone(),
                record(&[
                    ("x", inner.clone()),
                    ("y", Ty::list(inner.clone()).optional()),
                    ("when", Ty::Duration),
                    ("level", en(&["a", "b"])),
                ]),
            ],
        ]
        .concat();
        let mut bytes = SchemaBytes::default();
        for ty in &types {
            let written = serde_json::to_vec(&ty.json_schema()).unwrap().len() as u64;
            assert_eq!(bytes.of(ty), written, "{ty}");
            if let Ty::Record(fields) = ty {
                assert_eq!(bytes.record(fields), written, "{ty}");
            }
        }
    }

    #[test]
    fn assignability_rules() {
        let en = Ty::enumeration(vec!["a".into(), "b".into()]);
        assert!(Ty::Int.assignable_to(&Ty::Float));
        assert!(!Ty::Float.assignable_to(&Ty::Int));
        assert!(en.assignable_to(&Ty::String));
        assert!(!Ty::String.assignable_to(&en));
        assert!(Ty::Null.assignable_to(&Ty::Int.optional()));
        assert!(Ty::Int.assignable_to(&Ty::Int.optional()));
        assert!(!Ty::Int.optional().assignable_to(&Ty::Int));
        let full = record(&[("a", Ty::Int), ("b", Ty::String.optional())]);
        assert!(record(&[("a", Ty::Int)]).assignable_to(&full));
        assert!(!record(&[("b", Ty::String)]).assignable_to(&full));
        assert!(!record(&[("a", Ty::Int), ("c", Ty::Int)]).assignable_to(&full));
        assert!(Ty::Json.assignable_to(&full) && full.assignable_to(&Ty::Json));
    }

    /// The runtime decides assignability on plans, from schemas
    /// (`flow_plan::schema::assignable`, for `flowc diff` and moving runs
    /// between versions); it must answer as the checker does on types.
    #[test]
    fn schemas_are_assignable_exactly_when_their_types_are() {
        let mut types = leaves();
        types.extend([
            en(&["a", "b"]),
            en(&["a"]),
            en(&["a", "c"]),
            Ty::list(Ty::Int),
            Ty::list(Ty::Float),
            Ty::list(en(&["a"])),
            Ty::Int.optional(),
            Ty::Float.optional(),
            en(&["a", "b"]).optional(),
            record(&[("a", Ty::Int)]),
            record(&[("a", Ty::Float)]),
            record(&[("a", Ty::Int), ("b", Ty::String.optional())]),
            record(&[("a", Ty::Int), ("b", Ty::String)]),
            record(&[("b", Ty::String)]),
            record(&[("a", Ty::Int.optional())]),
            record(&[]),
            Ty::list(record(&[("a", Ty::Int)])).optional(),
        ]);
        for ty in &types {
            // Field order aside (a schema's properties are sorted), a
            // schema is named as its type is.
            assert_eq!(flow_plan::schema::show(&ty.json_schema()), ty.to_string());
        }
        for from in &types {
            for to in &types {
                let (from_schema, to_schema) = (from.json_schema(), to.json_schema());
                let expected = from.assignable_to(to);
                assert_eq!(
                    flow_plan::schema::assignable(&from_schema, &to_schema),
                    expected,
                    "{from} to {to}"
                );
                // A field's doc (`description`) changes no type: a plan
                // whose docs changed reads its old runs' records as before.
                assert_eq!(
                    flow_plan::schema::assignable(&described(from_schema), &to_schema),
                    expected,
                    "{from} (described) to {to}"
                );
                assert_eq!(
                    flow_plan::schema::assignable(&from.json_schema(), &described(to_schema)),
                    expected,
                    "{from} to {to} (described)"
                );
            }
        }
    }

    /// `schema` with a `description` on every schema in it but `{}`.
    fn described(mut schema: Value) -> Value {
        let Value::Object(map) = &mut schema else {
            return schema;
        };
        if map.is_empty() {
            return schema;
        }
        if let Some(Value::Object(properties)) = map.get_mut("properties") {
            for property in properties.values_mut() {
                *property = described(property.take());
            }
        }
        if let Some(items) = map.get_mut("items") {
            *items = described(items.take());
        }
        if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
            for branch in branches.iter_mut() {
                *branch = described(branch.take());
            }
        }
        map.insert("description".into(), Value::from("a doc"));
        schema
    }

    #[test]
    fn display_reads_like_source() {
        let ty = record(&[
            ("tags", Ty::list(Ty::String)),
            ("kind", Ty::enumeration(vec!["x".into()]).optional()),
        ]);
        assert_eq!(ty.to_string(), r#"{ tags: list<string>, kind: ("x")? }"#);
    }
}
