//! Request forwarding: any node serves the whole API. A node that is not the leader forwards
//! writes and linearizable reads to the leader over HTTP and relays the answer unchanged, on a
//! connection that the request's handler drives itself ([`crate::peer_conn`]). A forwarded
//! request is never sent twice: an answer lost on the way back is "the outcome is unknown".
//!
//! A forwarded request carries `permit-forwarded-by`; a node that receives one and is not the
//! leader answers `no_leader` rather than forwarding again, so requests never loop.
//!
//! The forwarding node signs each forwarded request for the leader ([`crate::peer::PeerSigner`]:
//! its method, path and body). A request whose `permit-forwarded-by` comes without a valid
//! signature of that same node is served as any client's: the header is removed first. One
//! whose signature is valid but whose body is not the one signed is refused (`401`), and one
//! signed for another start of this node is refused with this start's nonce, which the
//! forwarding node signs it again with (nothing of it was used, so it is sent once more).
//!
//! With `--auth`, a follower forwards only the requests of a caller it knows: it identifies the
//! bearer token on its own applied state (waiting a moment for a token created just before)
//! before it reads the body or reaches for the leader, and answers `401` otherwise, closing the
//! connection; whether the caller may do what it asks is still decided by the leader. So a
//! follower buffers no body for a caller without a valid token.
//!
//! Every answer names the leader's URL in `permit-leader` when the node knows one, so that a
//! client given several endpoints can send its requests there and save the forwarding hop
//! (`permit-client` does). A forwarded request pays two more HTTP hops (`docs/performance.md`,
//! *Forwarding and the leader hint*).

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permit_wire::{
    ErrorCode, BODY_BYTES_MAX, FORWARDED_HEADER, LEADER_HEADER, NODE_HEADER, TERM_HEADER, WAIT_MS_MAX,
};

use super::app::App;
use super::app::NodeId;
use crate::error::ApiError;
use crate::peer_conn::{PeerError, PeerRequest, Resend};

/// How long a request waits for a leader to be elected before it is answered `no_leader`.
const LEADER_PATIENCE: Duration = Duration::from_secs(3);
/// Longest a forwarded request may take: the longest long-poll plus a margin.
const FORWARD_TIMEOUT: Duration = Duration::from_millis(WAIT_MS_MAX + 10_000);

/// Routes that every node answers itself. A request no route matches is answered here too
/// (`404`, the same on every node): forwarding it would read its body for nothing.
fn served_locally(request: &Request) -> bool {
    let Some(route) = request.extensions().get::<MatchedPath>() else { return true };
    // A node's history is what it saw itself.
    if route.as_str() == "/v1/semaphores/{name}/history" {
        return true;
    }
    let path = request.uri().path();
    let stale_read = request.method() == Method::GET
        && request.uri().query().is_some_and(|q| q.split('&').any(|pair| pair == "stale=true"));
    let injected_stale = crate::bugs::is(crate::bugs::Bug::StaleReads)
        && (request.method() == Method::GET || path.ends_with("/validate"));
    stale_read
        || injected_stale
        || !path.starts_with("/v1/")
        || matches!(
            path,
            "/v1/health"
                | "/v1/health/live"
                | "/v1/openapi.json"
                | "/v1/cluster/init"
                | "/v1/debug/digest"
                | "/v1/events"
        )
}

/// Runs the request here if this node leads (or the route is local), once its caller is checked
/// ([`super::caller::authenticated`]), else forwards it; either way the answer is stamped.
pub(super) async fn forward(app: &App, mut request: Request, next: Next) -> Response {
    if request.headers().contains_key(FORWARDED_HEADER) {
        request = match forwarded_by_peer(app, request).await {
            Ok(request) => request,
            Err(refusal) => return refusal,
        };
    }
    let mut response = if served_locally(&request) || app.leads() {
        super::caller::authenticated(app, request, next).await
    } else if let Some(refusal) = unknown_caller(app, &request).await {
        refusal
    } else {
        match app.leader(LEADER_PATIENCE).await {
            Some((leader, _)) if leader == app.id => super::caller::authenticated(app, request, next).await,
            Some(_) if request.headers().contains_key(FORWARDED_HEADER) => ApiError::new(
                ErrorCode::LeaderUnreachable,
                "forwarded to a node that is not the leader; nothing was done, retry",
            )
            .into_response(),
            Some((leader, addr)) => proxy(app, leader, &addr, request).await,
            None => ApiError::new(
                ErrorCode::LeaderUnreachable,
                "no leader elected (the cluster may lack a quorum); nothing was done, retry",
            )
            .into_response(),
        }
    };
    stamp(app, response.headers_mut());
    response
}

/// With `--auth`, the refusal of a request whose caller this node cannot identify (no, a
/// malformed, or an unknown token) for a route that needs one, made before anything reads the
/// body: `401`, and the connection closes (its body, if any, is never read). A token unknown
/// here may have been created a moment ago on the leader: the node waits up to
/// [`catch_up`] for its applied state to move on before it refuses.
fn unknown_caller<'a>(
    app: &'a App,
    request: &'a Request,
) -> impl Future<Output = Option<Response>> + Send + 'a {
    let needs_token = app.config.auth
        && request.extensions().get::<MatchedPath>().is_some_and(|route| {
            // No rule: a method the route does not take, answered here; open: no token needed.
            !matches!(
                crate::auth::need(request.method(), route.as_str(), app.config.metrics_public),
                None | Some(crate::auth::Need::Open)
            )
        });
    // Only the headers are kept across the wait (a request's body cannot be shared).
    let headers = request.headers();
    async move {
        if needs_token {
            identified_in_time(app, headers).await
        } else {
            None
        }
    }
}

/// `None` once the token in `headers` is known here, or the `401` after [`catch_up`].
async fn identified_in_time(app: &App, headers: &HeaderMap) -> Option<Response> {
    let refusal = match super::caller::identify(app, headers) {
        Ok(_) => return None,
        Err(refusal) => refusal,
    };
    // Only a token that may yet be applied here is waited for: not a missing header.
    if headers.contains_key(axum::http::header::AUTHORIZATION) {
        let mut metrics = app.raft_metrics();
        let deadline = tokio::time::Instant::now() + catch_up(app);
        while let Ok(Ok(())) = tokio::time::timeout_at(deadline, metrics.changed()).await {
            if super::caller::identify(app, headers).is_ok() {
                return None;
            }
        }
    }
    let mut response = refusal.into_response();
    response.headers_mut().insert(axum::http::header::CONNECTION, HeaderValue::from_static("close"));
    Some(response)
}

/// How long a follower waits for a token it does not know yet to be applied: the shortest
/// election timeout (a follower that hears nothing from the leader that long starts an election).
fn catch_up(app: &App) -> Duration {
    Duration::from_millis(app.config.election_timeout_ms.0)
}

/// Whether a forwarded request is a long-poll: a waiting acquire, campaign, claim or take, an
/// ack whose next claim waits, or a blocking read.
fn forwards_long_poll(path: &str, body: &[u8]) -> bool {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if query.split('&').any(|pair| pair.starts_with("index=")) {
        return true;
    }
    let waits = ["/acquire", "/campaign", "/claim", "/take"];
    let waiting = |body: Option<&serde_json::Value>| {
        body.and_then(|body| body.get("wait_ms")?.as_u64()).is_some_and(|wait_ms| wait_ms > 0)
    };
    let body = || serde_json::from_slice::<serde_json::Value>(body).ok();
    if waits.iter().any(|verb| path.ends_with(verb)) {
        return waiting(body().as_ref());
    }
    path.ends_with("/ack") && waiting(body().as_ref().and_then(|body| body.get("claim")))
}

/// A request with `permit-forwarded-by`, checked: kept as forwarded when that names the node
/// whose valid signature it carries (its body read and checked against it), else served as any
/// client's with the header removed.
///
/// # Errors
/// The `401` answer when the signature is valid but not the body, or was made for another start
/// of this node.
async fn forwarded_by_peer(app: &App, mut request: Request) -> Result<Request, Response> {
    let claimed: Option<NodeId> =
        request.headers().get(FORWARDED_HEADER).and_then(|v| v.to_str().ok()?.parse().ok());
    let path = request.uri().path_and_query().map_or("", |p| p.as_str());
    let verified = match app.peer_verifier.as_ref() {
        Some(verifier) => verifier.verify_head(request.method().as_str(), path, request.headers()),
        None => Err(crate::peer::PeerAuthError::NoSecret),
    };
    let head = match verified {
        Ok(head) if claimed == Some(head.sender) => head,
        Err(error @ crate::peer::PeerAuthError::StaleNonce) => {
            return Err(super::raft::refuse_peer(app, &error))
        }
        _ => {
            request.headers_mut().remove(FORWARDED_HEADER);
            return Ok(request);
        }
    };
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, BODY_BYTES_MAX).await {
        Ok(body) => body,
        Err(error) if crate::listener::is_body_timeout(&error) => {
            return Err(ApiError::body_timeout().into_response())
        }
        Err(_) => {
            let message = format!("bodies are at most {BODY_BYTES_MAX} bytes");
            return Err(ApiError::new(ErrorCode::BodyTooLarge, message).into_response());
        }
    };
    head.check_body(&body).map_err(|error| super::raft::refuse_peer(app, &error))?;
    Ok(Request::from_parts(parts, Body::from(body)))
}

/// Adds which node answered, its term and the leader it knows, unless a forwarded answer
/// carries the leader's.
fn stamp(app: &App, headers: &mut HeaderMap) {
    static NODE: HeaderName = HeaderName::from_static(NODE_HEADER);
    static TERM: HeaderName = HeaderName::from_static(TERM_HEADER);
    static LEADER: HeaderName = HeaderName::from_static(LEADER_HEADER);
    if headers.contains_key(&NODE) {
        return;
    }
    let (term, leader) = app.term_and_leader(|term, leader| app.stamps.values(term, leader));
    headers.insert(NODE.clone(), app.stamps.node().clone());
    headers.insert(TERM.clone(), term);
    if let Some(url) = leader {
        headers.insert(LEADER.clone(), url);
    }
}

/// The largest body a request with `method` and `extensions` (its route) takes: a push's, or
/// every other route's. Peers' routes read theirs with their own limits.
pub(super) fn body_limit(method: &Method, extensions: &axum::http::Extensions) -> usize {
    let push = *method == Method::POST
        && extensions.get::<MatchedPath>().is_some_and(|route| route.as_str() == "/v1/queues/{name}/items");
    if push {
        permit_wire::QUEUE_PUSH_BODY_BYTES_MAX
    } else {
        BODY_BYTES_MAX
    }
}

async fn proxy(app: &App, leader: u64, addr: &str, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // The route's own limit (a push's is larger), as the handler would apply it.
    let limit = body_limit(&parts.method, &parts.extensions);
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(body) => body,
        Err(error) if crate::listener::is_body_timeout(&error) => {
            return ApiError::body_timeout().into_response()
        }
        Err(_) => {
            return ApiError::new(ErrorCode::BodyTooLarge, format!("bodies are at most {limit} bytes here"))
                .into_response()
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let long_poll = forwards_long_poll(path, &body);
    if long_poll {
        super::long_poll::mark_long_poll();
    }
    let mut headers = HeaderMap::new();
    headers.insert(FORWARDED_HEADER, HeaderValue::from(app.id));
    // The client's credential travels with its request: the leader authorises it (`auth.rs`).
    for name in [axum::http::header::CONTENT_TYPE, axum::http::header::AUTHORIZATION] {
        if let Some(value) = parts.headers.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    let started = std::time::Instant::now();
    let mut resent = false;
    let sent = loop {
        let signed_for = app
            .peer_signer
            .as_ref()
            .map(|signer| signer.sign(leader, parts.method.as_str(), path, &body, "", &mut headers));
        // A write may have been applied even if its answer was lost: never sent twice, but for
        // a refusal of its signature, which the leader gives before using anything of it.
        let request = PeerRequest {
            method: parts.method.clone(),
            path,
            headers: &headers,
            body: body.clone(),
            resend: Resend::Never,
        };
        let sent = tokio::time::timeout(FORWARD_TIMEOUT, app.forwarder.send(addr, request)).await;
        if let (Ok(Ok(answer)), Some(signer), Some(used)) = (&sent, &app.peer_signer, signed_for) {
            if answer.status() == axum::http::StatusCode::UNAUTHORIZED
                && !resent
                && signer.learn(leader, answer.headers(), used)
            {
                resent = true;
                continue;
            }
        }
        break sent;
    };
    let answer = match sent {
        Ok(Ok(answer)) => answer,
        Ok(Err(PeerError::Connect(e))) => {
            tracing::debug!(leader, %addr, error = %e, "no connection to the leader");
            return ApiError::new(
                ErrorCode::LeaderUnreachable,
                format!("the leader (node {leader}) refused the connection; nothing was done, retry"),
            )
            .into_response();
        }
        Ok(Err(PeerError::Lost(e))) => {
            tracing::warn!(leader, %addr, error = %e, "forwarding to the leader failed");
            return ApiError::new(
                ErrorCode::NoLeader,
                format!("the leader (node {leader}) did not answer whole; the outcome is unknown, retry"),
            )
            .into_response();
        }
        Err(_) => {
            tracing::warn!(leader, %addr, "forwarding to the leader timed out");
            return ApiError::new(
                ErrorCode::NoLeader,
                format!("the leader (node {leader}) did not answer in time; the outcome is unknown, retry"),
            )
            .into_response();
        }
    };
    app.metrics.observe_forward(long_poll, started.elapsed().as_secs_f64());
    let (parts, bytes) = answer.into_parts();
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = parts.status;
    for name in ["content-type", permit_wire::INDEX_HEADER, NODE_HEADER, TERM_HEADER, LEADER_HEADER] {
        if let Some(value) = parts.headers.get(name) {
            response.headers_mut().insert(HeaderName::from_static(name), value.clone());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::forwards_long_poll;

    /// A forwarded request that waits gets the long-poll's time: a claim, and an ack whose next
    /// claim waits; not an ack without one, nor a claim that answers at once.
    #[test]
    fn waiting_claims_and_acks_that_claim_are_long_polls() {
        let waits = [
            ("/v1/queues/q/claim", r#"{"session":"s","wait_ms":5000}"#),
            ("/v1/queues/q/items/1/ack", r#"{"session":"s","token":1,"claim":{"wait_ms":5000}}"#),
            ("/v1/semaphores/s/acquire", r#"{"session":"s","wait_ms":1}"#),
            ("/v1/semaphores/s?index=3", ""),
        ];
        for (path, body) in waits {
            assert!(forwards_long_poll(path, body.as_bytes()), "{path} {body}");
        }
        let quick = [
            ("/v1/queues/q/claim", r#"{"session":"s"}"#),
            ("/v1/queues/q/items/1/ack", r#"{"session":"s","token":1,"wait_ms":5000}"#),
            ("/v1/queues/q/items/1/ack", r#"{"session":"s","token":1,"claim":{"max":2}}"#),
            ("/v1/queues/q/items/1/nack", r#"{"session":"s","token":1,"claim":{"wait_ms":5000}}"#),
        ];
        for (path, body) in quick {
            assert!(!forwards_long_poll(path, body.as_bytes()), "{path} {body}");
        }
    }
}
