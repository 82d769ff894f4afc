//! An in-memory store: journal, knowledge-base documents and notifications.
//!
//! It serves single in-process runs (`flow run --memory`, the in-memory
//! benchmark) and the interpreter's tests; it keeps nothing across a restart.
//! The SQLite store implements the same traits with durability.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

pub use crate::approval::DecideError;
use crate::approval::{Decision, decide_record};
use crate::error::StepError;
use crate::journal::{Journal, StepRecord};
use crate::services::{BoxFuture, Effects, Handoff, KbDocument, KbWrite};
use crate::sync::lock;

#[derive(Debug, Default)]
pub struct MemoryStore {
    /// By path. Hashed, not ordered: a run's paths share long prefixes
    /// (`each[1234]/a`), which an ordered map compares byte by byte on
    /// every insert and lookup.
    records: Mutex<HashMap<String, StepRecord>>,
    /// (collection, title) → current version and content.
    /// By (collection, title).
    documents: Mutex<HashMap<(String, String), StoredDocument>>,
    /// Idempotency key → the result of the first write with it.
    keyed: Mutex<HashMap<String, Value>>,
    notifications: Mutex<Vec<Handoff>>,
}

impl MemoryStore {
    /// Every record, in path order.
    pub fn records(&self) -> Vec<StepRecord> {
        let mut records: Vec<StepRecord> = lock(&self.records).values().cloned().collect();
        records.sort_by(|a, b| a.path.cmp(&b.path));
        records
    }

    /// Visits each record, in no order, without copying it: `records`
    /// copies every input, which between each of a test's invocations
    /// made a long loop of gates quadratic.
    pub fn each_record(&self, mut visit: impl FnMut(&StepRecord)) {
        lock(&self.records).values().for_each(&mut visit);
    }

    pub fn notifications(&self) -> Vec<Handoff> {
        lock(&self.notifications).clone()
    }

    /// Decides the approval pending at `path`, exactly once: the check and the
    /// write happen under one lock, so of concurrent decisions one wins.
    pub fn decide(
        &self,
        path: &str,
        approver: &str,
        approved: bool,
        comment: Option<&str>,
        decided_at: &str,
    ) -> Result<(), DecideError> {
        self.decide_as_member(path, approver, &[], approved, comment, decided_at)
    }

    /// [`Self::decide`] by an approver who is a member of `groups`.
    #[allow(clippy::too_many_arguments)] // reason: a decision's parts, as `Decision` has them
    pub fn decide_as_member(
        &self,
        path: &str,
        approver: &str,
        groups: &[String],
        approved: bool,
        comment: Option<&str>,
        decided_at: &str,
    ) -> Result<(), DecideError> {
        let mut records = lock(&self.records);
        // A test's run is never redriven: its gates decide in their round.
        let round = records.get(path).map_or(0, |record| record.round);
        let decided = decide_record(
            records.get(path),
            path,
            &Decision {
                approver: approver.to_string(),
                groups: groups.to_vec(),
                approved,
                comment: comment.map(str::to_string),
                decided_at: decided_at.to_string(),
            },
            crate::time::now_ms(),
            round,
        )?;
        records.insert(path.to_string(), decided);
        Ok(())
    }
}

impl Journal for MemoryStore {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        let record = lock(&self.records).get(path).cloned()?;
        // A rejected approval that fails its run replays as that failure.
        Some(record)
    }

    fn resumed(&self) -> bool {
        !lock(&self.records).is_empty()
    }

    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        lock(&self.records).insert(record.path.clone(), record);
        Box::pin(async { Ok(()) })
    }
}

/// A document as the memory store keeps it.
#[derive(Debug, Default)]
struct StoredDocument {
    version: i64,
    content: String,
    department: Option<String>,
}

impl Effects for MemoryStore {
    fn kb_write<'a>(&'a self, write: &'a KbWrite) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            if let Some(key) = &write.key
                && let Some(first) = lock(&self.keyed).get(key)
            {
                return Ok(first.clone());
            }
            let id = format!("{}/{}", write.collection, write.title);
            let version = {
                let mut documents = lock(&self.documents);
                let entry = documents
                    .entry((write.collection.clone(), write.title.clone()))
                    .or_default();
                entry.version += 1;
                entry.content = write.content.clone();
                if write.department.is_some() {
                    entry.department = write.department.clone();
                }
                entry.version
            };
            let result = json!({ "id": id, "version": version });
            if let Some(key) = &write.key {
                lock(&self.keyed).insert(key.clone(), result.clone());
            }
            Ok(result)
        })
    }

    fn handoff<'a>(&'a self, handoff: &'a Handoff) -> BoxFuture<'a, Result<(), StepError>> {
        lock(&self.notifications).push(handoff.clone());
        Box::pin(async { Ok(()) })
    }

    fn kb_context<'a>(
        &'a self,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KbDocument>, StepError>> {
        // Ranked by how many of the terms a document has, then by id.
        let mut scored: Vec<(usize, KbDocument)> = lock(&self.documents)
            .iter()
            .filter(|((collection, title), stored)| {
                ids.iter()
                    .any(|id| id == collection || *id == format!("{collection}/{title}"))
                    || (department.is_some() && stored.department.as_deref() == department)
            })
            .map(|((collection, title), stored)| {
                let text = format!("{title} {}", stored.content).to_lowercase();
                let score = terms.iter().filter(|t| text.contains(t.as_str())).count();
                let document = KbDocument {
                    collection: collection.clone(),
                    title: title.clone(),
                    version: stored.version,
                    content: stored.content.clone(),
                };
                (score, document)
            })
            .collect();
        scored.sort_by(|(a, x), (b, y)| {
            b.cmp(a)
                .then_with(|| (&x.collection, &x.title).cmp(&(&y.collection, &y.title)))
        });
        let found = scored.into_iter().take(limit).map(|(_, d)| d).collect();
        Box::pin(async move { Ok(found) })
    }
}
