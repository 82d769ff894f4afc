//! `/v1/kb/documents`: deleting what a tenant stored in its knowledge base.

use super::*;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct DocumentQuery {
    /// The document's collection.
    collection: String,
    /// The document's title.
    title: String,
}

/// Deletes a knowledge-base document of this account (every version).
#[utoipa::path(
    delete, path = "/v1/kb/documents", tag = "knowledge",
    params(DocumentQuery),
    responses(
        (status = 200, description = "Deleted", body = Deleted),
        (status = 400, description = "A malformed query (`invalid_query`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 404, description = "No such document in this account (`unknown_document`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn delete_document(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    query: Result<Query<DocumentQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    if daemon
        .store
        .delete_document(&account, &query.collection, &query.title)
        .await
        .map_err(store_problem)?
    {
        crate::storage::StoredBytes::measure_soon(&daemon, &account);
        Ok(axum::Json(Deleted { deleted: true }).into_response())
    } else {
        Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown_document",
            &format!("no document `{}/{}`", query.collection, query.title),
        ))
    }
}
