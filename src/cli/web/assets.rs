//! The dashboard's page, script and style, built into the binary: nothing is fetched from
//! elsewhere and there is no build step.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// Nothing is loaded from another origin, and no page may frame this one.
const POLICY: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn page(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn index() -> Response {
    page(INDEX, "text/html; charset=utf-8")
}

/// The task page is the same document; the script shows the task the address names.
pub(super) async fn task_page() -> Response {
    page(INDEX, "text/html; charset=utf-8")
}

pub(super) async fn script() -> Response {
    page(SCRIPT, "text/javascript; charset=utf-8")
}

pub(super) async fn style() -> Response {
    page(STYLE, "text/css; charset=utf-8")
}
