//! The knowledge base in PostgreSQL: documents by account, collection and
//! title, versioned, searched by a `tsvector` of the `simple` configuration.

use super::*;

/// Creates or updates `write`'s document of `account` in `tx`, unless its
/// idempotency key wrote one before (then that write's result); its id and
/// version.
pub(super) async fn write_document(
    tx: &deadpool_postgres::Transaction<'_>,
    account: &str,
    write: &KbWrite,
) -> Result<Value, StoreError> {
    if let Some(key) = &write.key {
        // Taking the key first makes a concurrent write with the same key
        // wait for this one, then find its result.
        let taken = tx
            .execute(
                "INSERT INTO kb_keys (account, key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&account, key],
            )
            .await?;
        if taken == 0 {
            let first: Option<String> = tx
                .query_one(
                    "SELECT result FROM kb_keys WHERE account = $1 AND key = $2",
                    &[&account, key],
                )
                .await?
                .get(0);
            let first = first.ok_or_else(|| {
                StoreError::Damaged(format!("KB write key `{key}` has no result stored"))
            })?;
            return serde_json::from_str(&first).map_err(|e| StoreError::Damaged(e.to_string()));
        }
    }
    let metadata = write.metadata.as_ref().map(Value::to_string);
    let version: i32 = tx
        .query_one(
            "INSERT INTO kb_documents
                 (account, collection, title, version, content, metadata, department)
             VALUES ($1, $2, $3, 1, $4, $5, $6)
             ON CONFLICT (account, collection, title) DO UPDATE
                 SET version = kb_documents.version + 1, content = excluded.content,
                     metadata = excluded.metadata,
                     department = COALESCE(excluded.department, kb_documents.department)
             RETURNING version",
            &[
                &account,
                &write.collection,
                &write.title,
                &write.content,
                &metadata,
                &write.department,
            ],
        )
        .await?
        .get(0);
    let result = json!({
        "id": format!("{}/{}", write.collection, write.title),
        "version": version,
    });
    if let Some(key) = &write.key {
        tx.execute(
            "UPDATE kb_keys SET result = $3 WHERE account = $1 AND key = $2",
            &[&account, key, &result.to_string()],
        )
        .await?;
    }
    Ok(result)
}

/// A notification from `NOTIFICATION_COLUMNS` and then its read mark.
/// A row of `collection, title, version, content` as a document.
pub(super) fn kb_row(row: &tokio_postgres::Row) -> KbDocument {
    KbDocument {
        collection: row.get(0),
        title: row.get(1),
        version: i64::from(row.get::<_, i32>(2)),
        content: row.get(3),
    }
}

impl KbStore for PostgresStore {
    fn write_document<'a>(
        &'a self,
        account: &'a str,
        write: &'a KbWrite,
    ) -> StoreFuture<'a, Value> {
        Box::pin(self.account_document(account, write))
    }

    fn kb_documents<'a>(
        &'a self,
        account: &'a str,
        query: &'a KbQuery,
    ) -> StoreFuture<'a, Vec<KbDocument>> {
        Box::pin(async move {
            let limit = sql_limit(query.limit);
            let rows = if query.terms.is_empty() {
                self.query(
                    "SELECT collection, title, version, content FROM kb_documents
                     WHERE account = $1 AND ($2::text IS NULL OR collection = $2)
                     ORDER BY collection, title
                     LIMIT $3",
                    &[&account, &query.collection, &limit],
                )
                .await?
            } else {
                // Plain words joined by `|`: to_tsquery reads no syntax from them.
                let words = query.terms.join(" | ");
                self.query(
                    "SELECT collection, title, version, content FROM kb_documents
                     WHERE account = $1 AND ($2::text IS NULL OR collection = $2)
                       AND search @@ to_tsquery('simple', $3)
                     ORDER BY ts_rank(search, to_tsquery('simple', $3)) DESC, collection, title
                     LIMIT $4",
                    &[&account, &query.collection, &words, &limit],
                )
                .await?
            };
            Ok(rows.iter().map(kb_row).collect())
        })
    }

    fn kb_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, Option<KbDocument>> {
        Box::pin(async move {
            let rows = self
                .query(
                    "SELECT collection, title, version, content FROM kb_documents
                     WHERE account = $1 AND collection = $2 AND title = $3",
                    &[&account, &collection, &title],
                )
                .await?;
            Ok(rows.first().map(kb_row))
        })
    }

    fn delete_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(self.delete_document(account, collection, title))
    }
}
