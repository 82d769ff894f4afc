//! The step table: every id of a workflow with what the checker knows of it.

use std::hash::BuildHasher;
use std::ops::Deref;

use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashTable};

use super::StepInfo;

/// Every id of a workflow (its steps, loops and parallel blocks) with what
/// the checker knows of it, in the order registered: an entry's index is
/// its slot in the plan.
///
/// Ids are found through an index of positions whose keys are the entries'
/// own ids: 5 bytes per id, where a map from each id (borrowed) to its
/// position took 25, and was built twice, by the checker and again by
/// lowering (6.5 MB each of a 100,000-step file's peak).
#[derive(Debug, Clone, Default)]
pub struct StepTable {
    entries: Vec<StepInfo>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl StepTable {
    /// A table with room for `ids` entries: a large workflow's table does
    /// not carry the spare room of a vector grown by doubling.
    pub(crate) fn with_capacity(ids: usize) -> StepTable {
        StepTable {
            entries: Vec::with_capacity(ids),
            index: HashTable::with_capacity(ids),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The position and entry of the id `id`.
    pub fn get(&self, id: &str) -> Option<(usize, &StepInfo)> {
        let hash = self.hasher.hash_one(id);
        let &at = self
            .index
            .find(hash, |&at| self.entries[at as usize].id == id)?;
        Some((at as usize, &self.entries[at as usize]))
    }

    /// Whether some entry has the id `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Adds `info` at the end and gives its position; when another entry
    /// has its id, gives that entry's position and `info` back. An empty id
    /// (a `parallel` whose name did not parse) is added and clashes with none.
    pub(crate) fn insert(&mut self, info: StepInfo) -> Result<usize, (usize, StepInfo)> {
        let position = self.entries.len();
        if !info.id.is_empty() {
            let StepTable {
                entries,
                index,
                hasher,
            } = self;
            let hash = hasher.hash_one(info.id.as_str());
            let same = |&at: &u32| entries[at as usize].id == info.id;
            let rehash = |&at: &u32| hasher.hash_one(entries[at as usize].id.as_str());
            match index.entry(hash, same, rehash) {
                Entry::Occupied(entry) => return Err((*entry.get() as usize, info)),
                Entry::Vacant(entry) => {
                    entry.insert(position as u32);
                }
            }
        }
        self.entries.push(info);
        Ok(position)
    }
}

/// The entries in the order registered, for iteration and indexing.
impl Deref for StepTable {
    type Target = [StepInfo];

    fn deref(&self) -> &[StepInfo] {
        &self.entries
    }
}

impl<'a> IntoIterator for &'a StepTable {
    type Item = &'a StepInfo;
    type IntoIter = std::slice::Iter<'a, StepInfo>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

/// The ids in `stmts`, nested ones included: the size of their step table.
pub(crate) fn ids_in(stmts: &[crate::syntax::ast::Stmt]) -> usize {
    use crate::syntax::ast::{ErrorPolicy, Stmt};
    stmts
        .iter()
        .map(|stmt| match stmt {
            Stmt::Step(step) => {
                1 + match step.options.on_error.as_deref() {
                    Some(ErrorPolicy::Fallback(block)) => ids_in(&block.stmts),
                    _ => 0,
                }
            }
            Stmt::If(stmt) => {
                let blocks = stmt.branches.iter().map(|(_, b)| b).chain(&stmt.else_block);
                blocks.map(|block| ids_in(&block.stmts)).sum()
            }
            Stmt::For(stmt) => 1 + ids_in(&stmt.body.stmts),
            Stmt::Parallel(stmt) => {
                let branches: usize = stmt.branches.iter().map(|b| ids_in(&b.body.stmts)).sum();
                1 + branches + ids_in(&stmt.broken)
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::workflow::StepKind;
    use crate::diagnostic::Span;

    fn entry(id: &str) -> StepInfo {
        StepInfo {
            id: id.into(),
            id_span: Span::default(),
            span: Span::default(),
            kind: StepKind::Unknown,
            output: None,
            containers: Box::new([]),
            may_fail: false,
        }
    }

    #[test]
    fn a_taken_id_answers_the_first_entry_and_adds_nothing() {
        let mut table = StepTable::with_capacity(2);
        assert_eq!(table.insert(entry("a")).ok(), Some(0));
        assert_eq!(table.insert(entry("b")).ok(), Some(1));
        let (first, again) = table.insert(entry("a")).unwrap_err();
        assert_eq!((first, again.id.as_str()), (0, "a"));
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.get("b").map(|(at, info)| (at, info.id.as_str())),
            Some((1, "b"))
        );
        assert!(table.get("c").is_none());
    }

    #[test]
    fn empty_ids_clash_with_none_and_are_not_found() {
        let mut table = StepTable::default();
        assert_eq!(table.insert(entry("")).ok(), Some(0));
        assert_eq!(table.insert(entry("")).ok(), Some(1));
        assert!(!table.contains(""));
    }

    #[test]
    fn ids_are_found_after_the_index_grows() {
        let mut table = StepTable::default();
        for n in 0..1000 {
            assert_eq!(table.insert(entry(&format!("s{n}"))).ok(), Some(n));
        }
        assert!((0..1000).all(|n| table.get(&format!("s{n}")).map(|(at, _)| at) == Some(n)));
    }
}
