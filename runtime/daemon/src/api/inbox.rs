//! `/v1/notifications`: an account's inbox, read and marked read.

use super::*;

#[derive(Serialize, ToSchema)]
pub(super) struct Notifications {
    pub(super) notifications: Vec<Notification>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Marked {
    pub(super) marked: usize,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReaderQuery {
    /// The reader's email: with an account's key, the account vouches for
    /// them; a user's key reads as its user (leave it out).
    reader: Option<String>,
    /// Only the ones this reader has not marked read.
    #[serde(default)]
    unread: bool,
    /// At most this many, newest first (default 100; more is read as 1,000).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<usize>,
}

/// Handoffs to the reader's departments and approval requests to them or
/// their approver groups, newest first.
#[utoipa::path(
    get, path = "/v1/notifications", tag = "notifications", params(ReaderQuery),
    responses(
        (status = 200, description = "The notifications", body = Notifications),
        (status = 400, description = "No reader, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "A user's key naming another reader (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn notifications(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    query: Result<Query<ReaderQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(invalid_query)?;
    let reader = holder.acting_as(query.reader, "reader")?;
    let audiences = daemon.config.people(&account).audiences_of(&reader);
    let wanted = NotificationQuery {
        unread_only: query.unread,
        limit: query.limit.unwrap_or(100).min(1_000),
    };
    let mut list = daemon
        .store
        .notifications(&account, &audiences, &reader, &wanted)
        .await
        .map_err(store_problem)?;
    for notification in &mut list {
        notification.id = daemon.links.disguise(&account, notification.id);
    }
    Ok(axum::Json(Notifications {
        notifications: list,
    })
    .into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MarkRead {
    /// As in `GET /v1/notifications`.
    pub(super) reader: Option<String>,
    #[schema(max_items = 1000)]
    pub(super) ids: Vec<i64>,
}

/// The most notifications one request marks: each is a write in one
/// transaction that other writers wait for.
pub(super) const MARK_AT_ONCE: usize = 1_000;

/// Marks notifications read for a reader; answers how many of them the
/// account has.
#[utoipa::path(
    post, path = "/v1/notifications/read", tag = "notifications", request_body = MarkRead,
    responses(
        (status = 200, description = "Marked", body = Marked),
        (status = 400, description = "No reader, with an account's key (`no_person`)", body = ProblemDoc, content_type = "application/problem+json"),
        (status = 403, description = "A user's key naming another reader (`not_this_person`)", body = ProblemDoc, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn mark_read(
    State(daemon): State<Arc<Daemon>>,
    Extension(AccountId(account)): Extension<AccountId>,
    Extension(holder): Extension<KeyHolder>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: MarkRead = json_body(&headers, body)?;
    let reader = holder.acting_as(request.reader, "reader")?;
    if request.ids.len() > MARK_AT_ONCE {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            &format!("mark at most {MARK_AT_ONCE} notifications at once"),
        ));
    }
    let rows: Vec<i64> = request
        .ids
        .iter()
        .filter_map(|id| daemon.links.row_of(&account, *id))
        .collect();
    let marked = daemon
        .store
        .mark_read(&account, &reader, &rows)
        .await
        .map_err(store_problem)?;
    Ok(axum::Json(Marked { marked }).into_response())
}
