//! The checker's types: what a value can be, assignability, and display.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use serde_json::{Value, json};

/// The longest literal a quick fix fills in for a value ([`Ty::placeholder`]):
/// a record of a few dozen fields. A longer one is for its author to write.
pub(crate) const PLACEHOLDER_CHARS: usize = 2_048;

/// How many characters of a type a message, a hover or a hint shows before
/// `…`: a record of 30,000 fields, or an alias's parts written out wherever
/// it is named, made each message that showed one megabytes long.
pub(crate) const SHOWN_TYPE_CHARS: usize = 400;

/// A record with more fields than this is read through an index of them
/// ([`ByName`]; the lowerer's wide input), not a scan.
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

/// Items in their order, each found by its name (the first of a name
/// repeated) through an index made the first time one is looked for in a
/// list wider than [`INDEXED_FIELDS`]: scanning a record for each
/// reference made a workflow of 50,000 input fields, each read once, take
/// 7 s to check, and scanning an enum of 10,000 variants for each literal
/// compared with it, or each of two enums' variants for the other's, was
/// as slow. The index lives as long as the list, which every copy of a
/// type shares.
#[derive(Debug)]
pub struct ByName<T> {
    list: Box<[T]>,
    /// The bytes of the items' names together.
    name_bytes: u64,
    /// What a wide list keeps beside it, made the first time it is needed.
    /// A narrow list, nearly every one, is scanned and keeps nothing: kept
    /// inline, these took some 130 bytes of every record and enum type, a
    /// 100,000-step check's peak 117.4 -> 124.4 MB.
    wide: OnceLock<Box<Wide<T>>>,
}

/// A wide list's index and what is remembered of it.
#[derive(Debug)]
struct Wide<T> {
    index: HashMap<String, usize>,
    /// For a record's fields: how many are required, counted once.
    required: OnceLock<usize>,
    /// Whether a value of a wide type of these fits types of other lists,
    /// by the other's address (see [`ByName::remembered`]).
    fits: Mutex<HashMap<usize, Fits<T>>>,
}

/// Whether a type of one list fits a type of the other, kept with a
/// `Weak` of the other, which keeps its address its own.
type Fits<T> = (Weak<ByName<T>>, bool);

/// An item of a [`ByName`] list: a variant, or a field and its type.
pub trait ItemName {
    fn name(&self) -> &str;
}

impl ItemName for String {
    fn name(&self) -> &str {
        self
    }
}

impl ItemName for (String, Ty) {
    fn name(&self) -> &str {
        &self.0
    }
}

/// A record's fields.
pub type Fields = ByName<(String, Ty)>;

/// An enum's variants.
pub type Variants = ByName<String>;

impl<T: ItemName> ByName<T> {
    pub fn new(list: Vec<T>) -> Self {
        ByName {
            name_bytes: list.iter().map(|item| item.name().len() as u64).sum(),
            list: list.into(),
            wide: OnceLock::new(),
        }
    }

    /// The index and memory of this list, made the first time they are
    /// needed.
    fn wide(&self) -> &Wide<T> {
        self.wide.get_or_init(|| {
            let mut index = HashMap::with_capacity(self.list.len());
            for (at, item) in self.list.iter().enumerate() {
                index.entry(item.name().to_string()).or_insert(at);
            }
            Box::new(Wide {
                index,
                required: OnceLock::new(),
                fits: Mutex::default(),
            })
        })
    }

    /// `fits()`: whether a value of a type of `from` fits a type of `to`,
    /// worked out once for each pair of wide types. A value of an enum of
    /// 10,000 variants given where another enum is expected, at each of
    /// 40,000 calls, took 23 s to check; a record of 20,000 fields, 5 s.
    fn remembered(from: &Arc<Self>, to: &Arc<Self>, fits: impl FnOnce() -> bool) -> bool {
        if from.len() <= INDEXED_FIELDS && to.len() <= INDEXED_FIELDS {
            return fits();
        }
        let key = Arc::as_ptr(to) as *const () as usize;
        // The `Weak` keeps `to`'s allocation, so that its address is not
        // another list's while the answer is kept.
        if let Some((_, known)) = from
            .wide()
            .fits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return *known;
        }
        let known = fits();
        from.wide()
            .fits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, (Arc::downgrade(to), known));
        known
    }

    /// The position of the item named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        if self.list.len() <= INDEXED_FIELDS {
            return self.list.iter().position(|item| item.name() == name);
        }
        self.wide().index.get(name).copied()
    }

    /// The item named `name`.
    pub fn get(&self, name: &str) -> Option<&T> {
        self.position(name).map(|at| &self.list[at])
    }
}

impl Fields {
    /// The type of the field `name`.
    pub fn ty(&self, name: &str) -> Option<&Ty> {
        self.get(name).map(|(_, ty)| ty)
    }

    /// How many of the fields are required (not optional).
    pub fn required(&self) -> usize {
        let count = || self.list.iter().filter(|(_, ty)| !ty.is_optional()).count();
        if self.list.len() <= INDEXED_FIELDS {
            return count();
        }
        *self.wide().required.get_or_init(count)
    }
}

impl Variants {
    /// Whether `variant` is one of these.
    pub fn contains(&self, variant: &str) -> bool {
        self.position(variant).is_some()
    }

    /// Whether a value could be one of these and one of `other`'s.
    pub fn overlap(&self, other: &Variants) -> bool {
        let (few, many) = if self.len() <= other.len() {
            (self, other)
        } else {
            (other, self)
        };
        few.iter().any(|v| many.contains(v))
    }

    /// The bytes of the JSON Schema of an enum of these:
    /// `{"enum":[` and `],"type":"string"}`, each variant quoted, commas
    /// between.
    fn schema_bytes(&self) -> u64 {
        let listed = self.name_bytes + 3 * self.list.len() as u64;
        26 + listed.max(1)
    }

    /// The memory that a copy of these takes: each variant's text and
    /// its `String`.
    pub fn copy_bytes(&self) -> u64 {
        self.name_bytes + std::mem::size_of::<String>() as u64 * self.list.len() as u64
    }
}

impl<T> std::ops::Deref for ByName<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.list
    }
}

impl<T: PartialEq> PartialEq for ByName<T> {
    fn eq(&self, other: &Self) -> bool {
        self.list == other.list
    }
}

impl<T: Eq> Eq for ByName<T> {}

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
    Enum(Arc<Variants>),
    List(Arc<Ty>),
    Record(Arc<Fields>),
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
    /// the type of a mistake, not of a value, and for a literal longer than
    /// [`PLACEHOLDER_CHARS`]: a record of 30,000 required fields, filled in
    /// for each of thousands of calls that missed it, took gigabytes.
    pub fn placeholder(&self) -> Option<String> {
        let mut left = PLACEHOLDER_CHARS;
        self.placeholder_within(&mut left)
    }

    /// [`Ty::placeholder`], paying each character written from `left`.
    pub(crate) fn placeholder_within(&self, left: &mut usize) -> Option<String> {
        let leaf = match self {
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
                // The braces, and for each field its name, `: ` and `, `.
                *left = left.checked_sub(4)?;
                let mut parts = Vec::new();
                for (name, ty) in fields.iter().filter(|(_, ty)| !ty.is_optional()) {
                    *left = left.checked_sub(name.len() + 4)?;
                    parts.push(format!("{name}: {}", ty.placeholder_within(left)?));
                }
                return Some(if parts.is_empty() {
                    "{}".to_string()
                } else {
                    format!("{{ {} }}", parts.join(", "))
                });
            }
        };
        *left = left.checked_sub(leaf.len())?;
        Some(leaf)
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
        Ty::Record(Arc::new(Fields::new(fields)))
    }

    pub fn list(item: Ty) -> Ty {
        Ty::List(Arc::new(item))
    }

    pub fn enumeration(variants: Vec<String>) -> Ty {
        Ty::Enum(Arc::new(Variants::new(variants)))
    }

    pub fn is_unchecked(&self) -> bool {
        matches!(self, Ty::Any | Ty::Json)
    }

    pub fn field(&self, name: &str) -> Option<&Ty> {
        match self {
            Ty::Record(fields) => fields.ty(name),
            _ => None,
        }
    }

    /// Whether a value of type `self` may be used where `target` is expected.
    pub fn assignable_to(&self, target: &Ty) -> bool {
        match (self, target) {
            (Ty::Any | Ty::Json, _) | (_, Ty::Any | Ty::Json) => true,
            // A type fits itself (a record that repeats a field, after its
            // error, too).
            (Ty::Enum(from), Ty::Enum(to)) if Arc::ptr_eq(from, to) => true,
            (Ty::Record(from), Ty::Record(to)) if Arc::ptr_eq(from, to) => true,
            // Parts compared, not types for equality: two wide types of one
            // shape are equal only once compared part by part, each time.
            (Ty::Enum(from), Ty::Enum(to)) => {
                ByName::remembered(from, to, || from.iter().all(|v| to.contains(v)))
            }
            (Ty::Record(from), Ty::Record(to)) => ByName::remembered(from, to, || {
                from.iter().all(|(name, _)| to.position(name).is_some())
                    && to.iter().all(|(name, ty)| match from.ty(name) {
                        Some(from_ty) => from_ty.assignable_to(ty),
                        None => ty.is_optional(),
                    })
            }),
            (Ty::String, Ty::String)
            | (Ty::Int, Ty::Int | Ty::Float)
            | (Ty::Float, Ty::Float)
            | (Ty::Bool, Ty::Bool)
            | (Ty::Duration, Ty::Duration)
            | (Ty::Null, Ty::Null) => true,
            (Ty::Enum(_), Ty::String) => true,
            (Ty::Null, Ty::Optional(_)) => true,
            (Ty::Optional(from), Ty::Optional(to)) => from.assignable_to(to),
            (from, Ty::Optional(to)) => from.assignable_to(to),
            (Ty::List(from), Ty::List(to)) => from.assignable_to(to),
            _ => false,
        }
    }

    /// The narrowest type that values of both types fit, if one exists:
    /// a list literal's element type. `int` and `float` make `float`,
    /// `null` and `T` make `T?`, two records the fields of both (a field
    /// only one has, optional).
    pub fn join(&self, other: &Ty) -> Option<Ty> {
        // `json` (and `any`) take everything, on either side: checked
        // first, as `assignable_to` says yes both ways for them.
        for unchecked in [Ty::Any, Ty::Json] {
            if *self == unchecked || *other == unchecked {
                return Some(unchecked);
            }
        }
        if other.assignable_to(self) {
            return Some(self.clone());
        }
        if self.assignable_to(other) {
            return Some(other.clone());
        }
        match (self, other) {
            (Ty::Null, some) | (some, Ty::Null) => Some(some.clone().optional()),
            (Ty::Optional(one), other) | (other, Ty::Optional(one)) => {
                Some(one.join(other.required())?.optional())
            }
            (Ty::List(one), Ty::List(other)) => Some(Ty::list(one.join(other)?)),
            // Two enums of other variants are both strings.
            (Ty::Enum(_), Ty::Enum(_)) => Some(Ty::String),
            (Ty::Record(one), Ty::Record(other)) => {
                let mut fields = Vec::with_capacity(one.len().max(other.len()));
                for (name, ty) in one.iter() {
                    fields.push((
                        name.clone(),
                        match other.ty(name) {
                            Some(theirs) => ty.join(theirs)?,
                            None => ty.clone().optional(),
                        },
                    ));
                }
                for (name, ty) in other.iter() {
                    if one.position(name).is_none() {
                        fields.push((name.clone(), ty.clone().optional()));
                    }
                }
                Some(Ty::record(fields))
            }
            _ => None,
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
            Ty::Enum(variants) => return variants.schema_bytes(),
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
        TyWriter::new(f, None).ty(self)
    }
}

/// A type as its author wrote it: a record or an enum that a `type` alias
/// names is shown by that name (`Contact`, `list<Contact>`), the rest as
/// [`Ty`]'s display. See `Env::show`.
pub struct Named<'t> {
    pub ty: &'t Ty,
    /// The aliases in scope.
    pub aliases: &'t AliasNames,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        TyWriter::new(f, Some(self.aliases)).ty(self.ty)
    }
}

/// The name of each record and enum that a `type` alias names, by the
/// address of its parts (the first name, by name, when several aliases
/// name one): every type the checker builds from an alias shares its
/// parts. Comparing each part shown with every alias took time in the
/// product of the program's aliases and its messages.
#[derive(Debug, Default)]
pub struct AliasNames(HashMap<usize, String>);

impl AliasNames {
    /// Names `ty` `name`, unless a name was given to it first. The caller
    /// keeps `ty`, so that its address stays its own.
    pub(crate) fn add(&mut self, name: &str, ty: &Ty) {
        if let Some(address) = parts_address(ty) {
            self.0.entry(address).or_insert_with(|| name.to_string());
        }
    }

    /// The alias that names `ty`, a record or an enum, if one does.
    pub(crate) fn of(&self, ty: &Ty) -> Option<&str> {
        self.0.get(&parts_address(ty)?).map(String::as_str)
    }
}

fn parts_address(ty: &Ty) -> Option<usize> {
    match ty {
        Ty::Record(fields) => Some(Arc::as_ptr(fields) as *const () as usize),
        Ty::Enum(variants) => Some(Arc::as_ptr(variants) as *const () as usize),
        _ => None,
    }
}

/// Writes a type, with the alias names of its parts when it has them, and
/// at most [`SHOWN_TYPE_CHARS`] characters of it: the rest is `…`, the
/// brackets open at the cut closed.
struct TyWriter<'f, 'g, 'a> {
    f: &'f mut fmt::Formatter<'g>,
    aliases: Option<&'a AliasNames>,
    /// The characters that may still be written.
    left: usize,
    /// Whether the text was cut (and `…` written): nothing more is
    /// written but the closing brackets.
    cut: bool,
}

impl<'f, 'g, 'a> TyWriter<'f, 'g, 'a> {
    fn new(f: &'f mut fmt::Formatter<'g>, aliases: Option<&'a AliasNames>) -> Self {
        TyWriter {
            f,
            aliases,
            left: SHOWN_TYPE_CHARS,
            cut: false,
        }
    }

    /// Writes `text` as far as the characters left allow, and `…` where it
    /// is cut; nothing once cut.
    fn put(&mut self, text: &str) -> fmt::Result {
        if self.cut {
            return Ok(());
        }
        match text.char_indices().nth(self.left) {
            None => {
                self.left -= text.chars().count();
                self.f.write_str(text)
            }
            Some((at, _)) => {
                self.cut = true;
                self.f.write_str(&text[..at])?;
                self.f.write_str("…")
            }
        }
    }

    /// Writes an opening bracket: whether it was written whole, and what
    /// it opens is to follow (and its closing bracket, written whatever
    /// is cut).
    fn opened(&mut self, bracket: &str) -> Result<bool, fmt::Error> {
        self.put(bracket)?;
        Ok(!self.cut)
    }

    fn alias(&self, ty: &Ty) -> Option<&'a str> {
        self.aliases.and_then(|aliases| aliases.of(ty))
    }

    fn ty(&mut self, ty: &Ty) -> fmt::Result {
        if self.cut {
            return Ok(());
        }
        if let Some(name) = self.alias(ty) {
            return self.put(name);
        }
        match ty {
            Ty::Any => self.put("any"),
            Ty::Json => self.put("json"),
            Ty::String => self.put("string"),
            Ty::Int => self.put("int"),
            Ty::Float => self.put("float"),
            Ty::Bool => self.put("bool"),
            Ty::Duration => self.put("duration"),
            Ty::Null => self.put("null"),
            Ty::Enum(variants) => {
                for (index, variant) in variants.iter().enumerate() {
                    if index > 0 {
                        self.put(" | ")?;
                    }
                    if self.cut {
                        break;
                    }
                    self.put(&format!("{variant:?}"))?;
                }
                Ok(())
            }
            Ty::List(item) => {
                if self.opened("list<")? {
                    self.ty(item)?;
                    self.f.write_str(">")?;
                }
                Ok(())
            }
            Ty::Record(fields) => {
                if !self.opened("{ ")? {
                    return Ok(());
                }
                for (index, (name, ty)) in fields.iter().enumerate() {
                    if index > 0 {
                        self.put(", ")?;
                    }
                    if self.cut {
                        break;
                    }
                    self.put(name)?;
                    self.put(": ")?;
                    self.ty(ty)?;
                }
                self.f.write_str(" }")
            }
            Ty::Optional(inner)
                if matches!(**inner, Ty::Enum(_)) && self.alias(inner).is_none() =>
            {
                if self.opened("(")? {
                    self.ty(inner)?;
                    self.f.write_str(")?")?;
                }
                Ok(())
            }
            Ty::Optional(inner) => {
                self.ty(inner)?;
                self.f.write_str("?")
            }
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
        Ty::record(
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
