//! The HTTP API: routes, the edge every request passes, and one file per resource. Everything
//! here serves from one `App` (`app.rs`), the layer's only door to the consensus layer.

mod acl;
pub(crate) mod app;
mod caller;
mod cluster;
mod elections;
mod events;
mod extract;
mod forward;
mod grant;
mod long_poll;
pub mod openapi;
mod queues;
mod raft;
mod semaphores;
mod sessions;
pub(crate) mod system;
mod ui;
mod watch;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use permit_wire::ErrorCode;

use self::app::App;
use crate::error::ApiError;

/// The `Retry-After` of every 503 and 429 answer, in seconds: a retry (here or on another node)
/// soon after is the right move for every such answer.
const RETRY_AFTER_SECONDS: &str = "1";

/// The client API and, on a node with a cluster secret, the peer RPC routes, served from `app`.
pub(crate) fn router(app: Arc<App>) -> Router {
    let client = Router::new()
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route("/v1/sessions/keepalive", post(sessions::keepalive_batch))
        .route("/v1/sessions/{id}", get(sessions::get).delete(sessions::close))
        .route("/v1/sessions/{id}/keepalive", post(sessions::keepalive))
        .route("/v1/semaphores", get(semaphores::list))
        .route("/v1/semaphores/{name}", get(semaphores::get).put(semaphores::put).delete(semaphores::delete))
        .route("/v1/semaphores/{name}/acquire", post(semaphores::acquire))
        .route("/v1/semaphores/{name}/release", post(semaphores::release))
        .route("/v1/semaphores/{name}/take", post(semaphores::take))
        .route("/v1/semaphores/{name}/validate", post(semaphores::validate))
        .route("/v1/semaphores/{name}/revoke", post(semaphores::revoke))
        .route("/v1/semaphores/{name}/history", get(semaphores::history))
        .route("/v1/elections", get(elections::list))
        .route("/v1/elections/{name}", get(elections::get))
        .route("/v1/elections/{name}/campaign", post(elections::campaign))
        .route("/v1/elections/{name}/proclaim", post(elections::proclaim))
        .route("/v1/elections/{name}/resign", post(elections::resign))
        .route("/v1/elections/{name}/revoke", post(elections::revoke))
        .route("/v1/queues", get(queues::list))
        .route("/v1/queues/{name}", get(queues::get).put(queues::put).delete(queues::delete))
        .route("/v1/queues/{name}/items", post(queues::push).get(queues::items))
        .route("/v1/queues/{name}/claim", post(queues::claim))
        .route("/v1/queues/{name}/claim/cancel", post(queues::cancel_claim))
        .route("/v1/queues/{name}/items/{id}", axum::routing::delete(queues::remove_item))
        .route("/v1/queues/{name}/items/{id}/ack", post(queues::ack))
        .route("/v1/queues/{name}/items/{id}/nack", post(queues::nack))
        .route("/v1/acl/tokens", post(acl::create).get(acl::list))
        .route("/v1/acl/tokens/self", get(acl::current))
        .route("/v1/acl/tokens/{id}", axum::routing::delete(acl::delete))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/snapshot", get(cluster::snapshot))
        .route("/v1/cluster/init", post(cluster::init))
        .route("/v1/cluster/members", post(cluster::add))
        .route("/v1/cluster/members/{id}", axum::routing::delete(cluster::remove))
        .route("/v1/health", get(system::health))
        .route("/v1/health/live", get(system::live))
        .route("/v1/debug/digest", get(system::digest))
        .route("/v1/openapi.json", get(openapi::spec))
        .route("/metrics", get(system::metrics))
        .route("/ui", get(ui::page))
        .route("/ui/", get(ui::page))
        .route("/ui/{file}", get(ui::asset))
        .route("/v1/events", get(events::events));
    // Peer routes exist only on a node with a cluster secret (a single node without one serves
    // none); each handler reads its body itself, with its own limit, after the credential check.
    let client = if app.config.cluster_secret.is_some() {
        client.merge(
            Router::new()
                .route("/raft/append", post(raft::append))
                .route("/raft/vote", post(raft::vote))
                .route("/raft/snapshot", post(raft::snapshot)),
        )
    } else {
        client
    };
    client
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), edge))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    wrong_method()
}

/// The refusal of a method a route does not take (axum's fallback, or no access rule for it).
fn wrong_method() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this route does not take this method")
}

/// What every request passes through, outermost first. One layer, because axum wraps each
/// route in each layer: every layer costs a request a boxed clone of its route's stack and a
/// move of its future.
/// 0. Given its route's body limit ([`limit_body`]).
/// 1. Counted by route template, method and status, with its duration.
/// 2. `Retry-After` added to a 503 or 429 answer that has none.
/// 3. Refused once the node failed ([`fail_stopped`]), or, without `--auth`, when its `Host`
///    may be a DNS rebinding ([`misdirected`]).
/// 4. Run here, once its caller is found and checked ([`caller::authenticated`]), or forwarded
///    to the leader, and stamped ([`forward::forward`]).
async fn edge(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let request = limit_body(request);
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = request.method().clone();
    let long_poll = std::cell::Cell::new(false);
    let served = async {
        let response = match fail_stopped(&app, &request).or_else(|| misdirected(&app, &request)) {
            Some(refusal) => refusal,
            None => forward::forward(&app, request, next).await,
        };
        (long_poll::LONG_POLL.with(std::cell::Cell::get), retry_after(response))
    };
    let (long_poll, response) = long_poll::LONG_POLL.scope(long_poll, served).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    if !route.starts_with("/raft/") {
        let seconds = started.elapsed().as_secs_f64();
        app.metrics.observe_request(route, method.as_str(), response.status().as_u16(), seconds, long_poll);
    }
    response
}

/// `request` with the largest body its route takes ([`forward::body_limit`]) set for axum's
/// body extractors (`body_too_large` beyond it). axum takes the limit only from its
/// `DefaultBodyLimit` layer's service, which sets it on the request and calls its inner service:
/// here that is one that hands the request back, so no route pays a layer of its own.
fn limit_body(request: Request) -> Request {
    use tower::{Layer, Service};
    let limit = forward::body_limit(request.method(), request.extensions());
    let mut set = DefaultBodyLimit::max(limit).layer(HandBack);
    match set.call(request).into_inner() {
        Ok(request) => request,
        Err(never) => match never {},
    }
}

/// A service that answers a request with the request itself (see [`limit_body`]).
#[derive(Clone, Copy)]
struct HandBack;

impl tower::Service<Request> for HandBack {
    type Response = Request;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Request, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        std::future::ready(Ok(request))
    }
}

/// The refusal of every request but the health probes and metrics once the node failed (see
/// `failstop`): `storage_error` after a storage failure, `shutting_down` after Raft stopped.
fn fail_stopped(app: &App, request: &Request) -> Option<Response> {
    let failure = app.fail_stop.failure()?;
    let path = request.uri().path();
    if path.starts_with("/v1/health") || path == "/metrics" {
        return None;
    }
    let code = match failure.reason {
        permit_wire::NotReady::StorageError => ErrorCode::StorageError,
        _ => ErrorCode::ShuttingDown,
    };
    let message = format!("this node stopped serving ({failure}); nothing was done, retry on another node");
    Some(ApiError::new(code, message).into_response())
}

/// Without `--auth`, the `421 misdirected_request` refusal of a request whose `Host` is neither
/// `localhost` nor an IP address literal (with or without a port).
///
/// Why: the no-auth default listens on loopback, where only this machine's programs can reach
/// it. A web page can still reach it through the browser by DNS rebinding: a name of the
/// attacker's that first pointed at the attacker's server is pointed at 127.0.0.1, and the
/// page's requests (same origin for the browser) arrive with `Host: that-name`. A name other
/// than `localhost` therefore marks a request that this machine's user did not address here.
///
/// Exceptions: a request without `Host` (browsers always send one); the health probes
/// (`/v1/health`, `/v1/health/live`: orchestrators may probe by a service name, and they show
/// nothing a page could abuse); and peer requests, which peers address by the names in the
/// membership and authenticate with the cluster secret (`/raft/*`, whose handlers check the
/// credential, and requests that carry a valid peer credential, such as forwarded ones).
fn misdirected(app: &App, request: &Request) -> Option<Response> {
    if app.config.auth {
        return None;
    }
    let host = request.headers().get(header::HOST)?;
    if host.to_str().is_ok_and(local_or_ip_host) {
        return None;
    }
    let path = request.uri().path();
    if matches!(path, "/v1/health" | "/v1/health/live")
        || path.starts_with("/raft/")
        || app.config.cluster_secret.as_ref().is_some_and(|secret| {
            let path = request.uri().path_and_query().map_or("", |p| p.as_str());
            crate::peer::signed_for(secret, app.id, request.method().as_str(), path, request.headers())
        })
    {
        return None;
    }
    let message = "auth is off, and this request's Host is neither localhost nor an IP address: a web page \
        may be using this server through DNS rebinding. Address it as http://127.0.0.1:PORT (or localhost), \
        or start it with --auth";
    Some(ApiError::new(ErrorCode::MisdirectedRequest, message).into_response())
}

/// Whether a `Host` value is `localhost` or an IP address literal (`127.0.0.1`, `[::1]`,
/// `10.1.2.3`), each with an optional port.
fn local_or_ip_host(host: &str) -> bool {
    let is_port = |port: &str| (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        let Some((address, port)) = rest.split_once(']') else { return false };
        let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(is_port);
        return port_ok && address.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Adds `Retry-After` to every 503 and 429 answer that has none.
fn retry_after(mut response: Response) -> Response {
    let status = response.status();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .entry(header::RETRY_AFTER)
            .or_insert(HeaderValue::from_static(RETRY_AFTER_SECONDS));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::local_or_ip_host;

    #[test]
    fn only_localhost_and_ip_literals_are_local_or_ip_hosts() {
        for good in [
            "localhost",
            "LOCALHOST:7376",
            "127.0.0.1",
            "127.0.0.1:7376",
            "127.8.9.10:1",
            "10.0.0.7:7376",
            "[::1]",
            "[::1]:7376",
            "[fd00::1]:80",
        ] {
            assert!(local_or_ip_host(good), "{good}");
        }
        for bad in [
            "evil.example",
            "evil.example:7376",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "localhost.",
            "127.0.0.1:",
            "127.0.0.1:123456",
            "127.1",
            "0x7f.0.0.1",
            "[::1",
            "[::1]x",
            "::1",
            "",
        ] {
            assert!(!local_or_ip_host(bad), "{bad}");
        }
    }
}
