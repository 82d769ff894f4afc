//! The run inspector: a static page at `/inspector` that lists the runs,
//! shows one run's step tree from its trace, and decides pending approvals.
//! The files are built into the binary and hold no data, so they are served
//! without an API key; the page itself asks for a key and sends it with each
//! `/v1` call it makes.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX_HTML: &str = include_str!("inspector/index.html");
const APP_JS: &str = include_str!("inspector/app.js");
const APP_CSS: &str = include_str!("inspector/app.css");
const ICON_SVG: &str = include_str!("inspector/icon.svg");

/// Only the page's own files may load: no inline script or style, so that
/// text from a run that slipped into the markup could not run. Nothing may
/// frame the page either, or another site could overlay its Approve button.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; frame-ancestors 'none'";

/// The inspector's routes, for any router state (they use none).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/inspector",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/inspector/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/inspector/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/inspector/icon.svg",
            get(|| async { asset("image/svg+xml", ICON_SVG) }),
        )
        // `{*rest}` takes one character at least: without this, the page's
        // address with a slash asked for a key (401).
        .route(
            "/inspector/",
            get(|| async { axum::response::Redirect::permanent("/inspector") }),
        )
        // Not the API's key-guarded fallback: a mistyped file is a 404.
        .route(
            "/inspector/{*rest}",
            get(|| async {
                crate::server::problem(
                    axum::http::StatusCode::NOT_FOUND,
                    "not_found",
                    "the inspector has no such file; open /inspector",
                )
            }),
        )
}

/// One of the files, revalidated on each load (`no-cache`): after a flowd
/// upgrade, a reload gets the new files, not a cached mix of old and new.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}
