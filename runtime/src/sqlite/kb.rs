//! The knowledge base in SQLite: documents by account, collection and title,
//! versioned, searched with FTS5.

use super::*;

/// The `kb_context` query of both stores' SQL: documents of `ids` matching
/// any of `terms`, best first.
pub(super) fn fts_query(terms: &[String]) -> String {
    // Each term quoted: FTS5 reads it as a word, never as syntax.
    terms
        .iter()
        .map(|term| format!("\"{term}\""))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// A row of `collection, title, version, content` as a document.
pub(super) fn kb_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<KbDocument> {
    Ok(KbDocument {
        collection: row.get(0)?,
        title: row.get(1)?,
        version: row.get(2)?,
        content: row.get(3)?,
    })
}

impl SqliteStore {
    /// `KbStore::kb_documents`.
    pub(super) fn kb_documents(
        &self,
        account: &str,
        query: &KbQuery,
    ) -> Result<Vec<KbDocument>, StoreError> {
        let conn = self.reader()?;
        let limit = sql_limit(query.limit);
        let found = if query.terms.is_empty() {
            conn.prepare_cached(
                "SELECT collection, title, version, content FROM kb_documents
                 WHERE account = ?1 AND (?2 IS NULL OR collection = ?2)
                 ORDER BY collection, title
                 LIMIT ?3",
            )?
            .query_map(params![account, query.collection, limit], kb_row)?
            .collect::<Result<_, _>>()?
        } else {
            conn.prepare_cached(
                "SELECT d.collection, d.title, d.version, d.content
                 FROM kb_search s JOIN kb_documents d ON d.search_id = s.rowid
                 WHERE kb_search MATCH ?2 AND s.account = ?1 AND d.account = ?1
                   AND (?3 IS NULL OR d.collection = ?3)
                 ORDER BY bm25(kb_search), d.collection, d.title
                 LIMIT ?4",
            )?
            .query_map(
                params![account, fts_query(&query.terms), query.collection, limit],
                kb_row,
            )?
            .collect::<Result<_, _>>()?
        };
        Ok(found)
    }

    /// `KbStore::kb_document`.
    pub(super) fn kb_document(
        &self,
        account: &str,
        collection: &str,
        title: &str,
    ) -> Result<Option<KbDocument>, StoreError> {
        let conn = self.reader()?;
        let found = conn
            .prepare_cached(
                "SELECT collection, title, version, content FROM kb_documents
                 WHERE account = ?1 AND collection = ?2 AND title = ?3",
            )?
            .query_row(params![account, collection, title], kb_row)
            .optional()?;
        Ok(found)
    }

    /// `Effects::kb_context` of a run of `account`.
    pub(super) fn kb_context(
        &self,
        account: &str,
        ids: &[String],
        department: Option<&str>,
        terms: &[String],
        limit: usize,
    ) -> Result<Vec<KbDocument>, StoreError> {
        let conn = self.reader()?;
        let ids = serde_json::to_string(ids).map_err(|e| StoreError::Damaged(e.to_string()))?;
        let mut found: Vec<KbDocument> = Vec::new();
        if !terms.is_empty() {
            let mut ranked = conn.prepare_cached(
                "SELECT d.collection, d.title, d.version, d.content
                 FROM kb_search s
                 JOIN kb_documents d
                   ON d.account = s.account AND d.collection = s.collection AND d.title = s.title
                 WHERE kb_search MATCH ?2 AND s.account = ?1
                   AND (d.collection IN (SELECT value FROM json_each(?3))
                        OR d.collection || '/' || d.title IN (SELECT value FROM json_each(?3))
                        OR d.department = ?5)
                 ORDER BY bm25(kb_search)
                 LIMIT ?4",
            )?;
            found = ranked
                .query_map(
                    params![account, fts_query(terms), ids, sql_limit(limit), department],
                    kb_row,
                )?
                .collect::<Result<_, _>>()?;
        }
        if found.len() < limit {
            let mut rest = conn.prepare_cached(
                "SELECT collection, title, version, content FROM kb_documents
                 WHERE account = ?1
                   AND (collection IN (SELECT value FROM json_each(?2))
                        OR collection || '/' || title IN (SELECT value FROM json_each(?2))
                        OR department = ?4)
                 ORDER BY collection, title
                 LIMIT ?3",
            )?;
            let others: Vec<KbDocument> = rest
                .query_map(params![account, ids, sql_limit(limit), department], kb_row)?
                .collect::<Result<_, _>>()?;
            found = crate::kb::merged(&found, others);
            found.truncate(limit);
        }
        Ok(found)
    }
}

impl KbStore for SqliteStore {
    fn write_document<'a>(
        &'a self,
        account: &'a str,
        write: &'a KbWrite,
    ) -> StoreFuture<'a, Value> {
        self.queue_document(None, account, write)
    }

    fn kb_documents<'a>(
        &'a self,
        account: &'a str,
        query: &'a KbQuery,
    ) -> StoreFuture<'a, Vec<KbDocument>> {
        ready(self.kb_documents(account, query))
    }

    fn kb_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, Option<KbDocument>> {
        ready(self.kb_document(account, collection, title))
    }

    fn delete_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, bool> {
        ready(self.delete_document(account, collection, title))
    }
}
