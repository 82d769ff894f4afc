//! The HTTP surface: `/metrics`, the API's routes behind authentication, and
//! the layers every answer passes (no NUL in a URI, errors as problems).

use super::*;

/// `/metrics` for Prometheus, then the API's routes, every one behind
/// API-key authentication.
pub fn router(daemon: Arc<Daemon>) -> Router {
    let metrics = Router::new().route(
        "/metrics",
        axum::routing::get(
            |State(daemon): State<Arc<Daemon>>, headers: axum::http::HeaderMap| async move {
                if let Some(Secret(token)) = &daemon.config.metrics_token {
                    let sent = bearer_token(&headers);
                    // Compared in constant time, as a MAC is.
                    if !sent.is_some_and(|sent| same_secret(sent, token)) {
                        return problem(
                            StatusCode::UNAUTHORIZED,
                            "unauthenticated",
                            "/metrics needs `Authorization: Bearer` with the metrics_token",
                        );
                    }
                }
                // The store is the truth of what waits: a restart or another
                // process deciding keeps it right, as a counter here would not.
                match daemon.store.pending_approvals().await {
                    Ok(counts) => daemon.metrics.set_pending_approvals(&counts),
                    Err(error) => {
                        tracing::error!("metrics: cannot count pending approvals: {error}")
                    }
                }
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    daemon.metrics.encode(),
                )
                    .into_response()
            },
        ),
    );
    let api = Router::new()
        .route(
            "/v1/workflows",
            axum::routing::post(crate::api::deploy).get(crate::api::workflows),
        )
        .route(
            "/v1/workflows/{workflow}",
            axum::routing::delete(crate::api::undeploy),
        )
        .route(
            "/v1/workflows/{workflow}/migrate",
            axum::routing::post(crate::migrate::migrate),
        )
        .route(
            "/v1/kb/documents",
            axum::routing::delete(crate::api::delete_document),
        )
        .route(
            "/v1/runs",
            axum::routing::post(crate::api::start_run).get(crate::api::runs),
        )
        .route("/v1/runs/{id}/trace", axum::routing::get(crate::api::trace))
        .route("/v1/runs/{id}/graph", axum::routing::get(crate::api::graph))
        .route(
            "/v1/runs/{id}/test",
            axum::routing::get(crate::api::test_from),
        )
        .route(
            "/v1/runs/{id}/cancel",
            axum::routing::post(crate::api::cancel),
        )
        .route(
            "/v1/runs/{id}/redrive",
            axum::routing::post(crate::api::redrive),
        )
        .route(
            "/v1/runs/{id}",
            axum::routing::get(crate::api::get_run).delete(crate::api::delete_run),
        )
        .route(
            "/v1/runs/{id}/approvals/{*step_path}",
            axum::routing::post(crate::api::decide),
        )
        .route(
            "/v1/approvals",
            axum::routing::get(crate::api::my_approvals),
        )
        .route(
            "/v1/notifications",
            axum::routing::get(crate::api::notifications),
        )
        .route(
            "/v1/notifications/read",
            axum::routing::post(crate::api::mark_read),
        )
        .fallback(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; the API is under /v1 (see /v1/openapi.json)",
            )
        })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&daemon),
            authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT));
    // The API's description is public, like the API's existence.
    let openapi = Router::new().route(
        "/v1/openapi.json",
        axum::routing::get(|| async {
            axum::Json(<crate::api::ApiDoc as utoipa::OpenApi>::openapi())
        }),
    );
    // An approval link's token is its credential: no API key.
    let links = Router::new().route(
        "/approvals/{token}",
        axum::routing::get(crate::pages::show).post(crate::pages::confirm),
    );
    // The inspector's files hold no data: no API key (the page sends one).
    metrics
        .merge(openapi)
        .merge(links)
        .merge(crate::inspector::routes())
        .merge(api)
        .layer(middleware::map_response(plain_errors_as_problems))
        .layer(middleware::from_fn(refuse_nul_in_uri))
        .with_state(daemon)
}

/// Refuses a path or query that holds a NUL byte (`%00`): no id, name or
/// key of flow has one, and PostgreSQL cannot even compare one, so both
/// stores answer the same 400 instead of a 404 on one and a 503 on the
/// other.
pub(super) async fn refuse_nul_in_uri(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let raw = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    if raw.to_ascii_lowercase().contains("%00") {
        return problem(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "a path or query cannot hold a NUL byte (%00)",
        );
    }
    next.run(request).await
}

/// Errors that axum answers itself come as plain text or nothing: a method
/// a route does not have (405), a body over the limit (413), a form of
/// another media type (415), a path that does not decode (`%ff`, 400).
/// They become problems like every other error, keeping their status and
/// their `Allow` header; pages that answer HTML keep their own.
pub(super) async fn plain_errors_as_problems(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let plain = match response.headers().get(header::CONTENT_TYPE) {
        None => true,
        Some(kind) => kind
            .to_str()
            .is_ok_and(|kind| kind.starts_with("text/plain")),
    };
    if !plain {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let said = axum::body::to_bytes(response.into_body(), 2048)
        .await
        .map(|text| String::from_utf8_lossy(&text).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::NOT_FOUND => "not_found",
        status if status.is_client_error() => "bad_request",
        _ => "internal_error",
    };
    let detail = if said.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        said
    };
    let mut answer = problem(status, code, &detail);
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}
