//! Reading the file into its sections, and placing each problem in the
//! file (`flowd.toml:12:3`) or the environment.

use serde::Deserialize;

use super::{File, Problem};

/// The most unknown keys listed: past them the file is likely not flowd's.
const UNKNOWN_KEYS_LISTED: usize = 100;

/// Parses the file into its sections. serde stops at the first unknown key,
/// which would hide the rest from an operator fixing them one by one: each
/// unknown key is reported and taken out of the parsed document, and the
/// document deserialized again, so that every unknown key is listed together
/// with serde's own "expected one of" for it. `None` when the file cannot be
/// read as flowd's (its problems reported).
pub(super) fn read_file(problems: &mut Problems) -> Option<File> {
    let mut document = match toml::de::DeTable::parse(problems.text) {
        Ok(document) => document,
        Err(error) => {
            problems.report_toml(&error);
            return None;
        }
    };
    // serde finds them in the order it reads fields; they are listed by
    // position.
    let mut unknown = Vec::new();
    let read = loop {
        let error = match File::deserialize(toml::de::Deserializer::from(document.clone())) {
            Ok(file) => break Some(file),
            Err(error) => error,
        };
        let removed = error.message().starts_with("unknown field")
            && unknown.len() < UNKNOWN_KEYS_LISTED
            && error
                .span()
                .is_some_and(|span| remove_key(document.get_mut(), &span));
        if !removed {
            problems.report_toml(&error);
            break None;
        }
        unknown.push(error);
    };
    unknown.sort_by_key(|error| error.span().map_or(0, |span| span.start));
    for error in &unknown {
        problems.report_toml(error);
    }
    // The rest of the file is still checked: its problems are as real.
    read
}

/// Removes the key written at `span` from `table` or a table inside it.
fn remove_key(table: &mut toml::de::DeTable, span: &Span) -> bool {
    let found = table.keys().find(|key| key.span() == *span).cloned();
    if let Some(key) = found {
        table.remove(&key);
        return true;
    }
    table.iter_mut().any(|(_, value)| match value.get_mut() {
        toml::de::DeValue::Table(inner) => remove_key(inner, span),
        toml::de::DeValue::Array(items) => items.iter_mut().any(|item| match item.get_mut() {
            toml::de::DeValue::Table(inner) => remove_key(inner, span),
            _ => false,
        }),
        _ => false,
    })
}

pub(super) type Span = std::ops::Range<usize>;

/// Where a setting came from, for its problems.
#[derive(Clone)]
pub(super) enum Place {
    File(Span),
    Env(String),
    /// The file as a whole (a setting it lacks).
    Whole,
}

/// The problems found so far, each placed in the file or the environment.
pub(super) struct Problems<'a> {
    pub(super) path: &'a str,
    pub(super) text: &'a str,
    pub(super) list: Vec<Problem>,
}

impl Problems<'_> {
    pub(super) fn at(&mut self, span: Span, message: String) {
        self.report(Place::File(span), message);
    }

    fn report_toml(&mut self, error: &toml::de::Error) {
        let place = match error.span() {
            Some(span) => Place::File(span),
            None => Place::Whole,
        };
        self.report(place, error.message().to_string());
    }

    pub(super) fn report(&mut self, place: Place, message: String) {
        let place = match place {
            Place::File(span) => at(self.path, self.text, span.start),
            Place::Env(variable) => format!("environment variable {variable}"),
            Place::Whole => self.path.to_string(),
        };
        self.list.push(Problem { place, message });
    }
}

/// `path:line:column` of byte `offset` in `text`, both counted from 1.
fn at(path: &str, text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{path}:{line}:{column}")
}
