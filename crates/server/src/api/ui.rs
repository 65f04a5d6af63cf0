//! `/ui`: the dashboard. Hand-written HTML, CSS and JavaScript in `crates/server/ui/`, embedded
//! in the binary at build time: nothing is fetched at run time. The page and its assets are
//! public (they hold no data); every call the page makes to the JSON API and the event stream
//! carries the token the operator entered, and is authorised as any client's.
//!
//! Every answer carries a strict Content-Security-Policy: scripts, styles and connections only
//! from this origin, no inline script or style, no frames, no forms posted elsewhere.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use permit_wire::ErrorCode;

use super::app::App;
use crate::error::ApiError;

/// The policy of every `/ui` answer.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The embedded files: name under `/ui/`, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../../ui/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../../ui/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../../ui/app.css")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../../ui/favicon.svg")),
];

/// The dashboard page.
pub(crate) async fn page() -> Response {
    serve("index.html")
}

/// One of the page's assets, or `config.json`: what the page must know before its first API
/// call (whether to ask for a token), so that it makes no call bound to fail, and which node
/// it talks to (id and address, for its header).
pub(crate) async fn asset(State(app): State<Arc<App>>, Path(file): Path<String>) -> Response {
    if file == "config.json" {
        // The address the cluster knows this node by, else the one it listens on.
        let addr = app.status().members.get(&app.id).map_or_else(|| app.addr.to_string(), |m| m.addr.clone());
        let config = serde_json::json!({ "auth": app.config.auth, "node_id": app.id, "addr": addr });
        return with_headers("application/json", config.to_string().into_bytes());
    }
    serve(&file)
}

fn serve(file: &str) -> Response {
    let Some((_, content_type, bytes)) = ASSETS.iter().find(|(name, _, _)| *name == file) else {
        return ApiError::new(ErrorCode::NotFound, "no such dashboard file").into_response();
    };
    with_headers(content_type, bytes.to_vec())
}

fn with_headers(content_type: &'static str, body: Vec<u8>) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY")),
    ];
    (headers, body).into_response()
}
