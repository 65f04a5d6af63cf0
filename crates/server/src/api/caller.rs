//! Who is asking, on this node: the check that finds a request's [`Caller`] and its route's
//! [`Need`] before the request runs here, and the checks that need this node's state (a
//! session's owner, the objects cap, long-poll places, a caller cut off by a token deletion or a
//! lost contact). The rules themselves are `auth`'s.

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permit_core::{Creator, Key, SessionId, Token};
use permit_wire::{ErrorCode, AUTHORIZATION_SCHEME};

use super::app::{App, Standing};
use super::long_poll::mark_long_poll;
use crate::auth::{need, objects_cap_refusal, secret_hash, slowly, token_of_secret, Caller, LongPoll, Need};
use crate::error::ApiError;

impl Caller {
    /// The token an object this caller creates is recorded under, with its cap
    /// (`--objects-per-token-max`); `None` with auth off.
    pub(crate) fn creator(&self, app: &App) -> Option<Creator> {
        self.token_id().map(|token| Creator { token, objects_max: app.config.objects_per_token_max })
    }

    /// Refuses, after [`PER_TOKEN_REFUSAL_DELAY`](crate::auth::PER_TOKEN_REFUSAL_DELAY), a request that would create `key` when the
    /// caller's token has created its cap of objects already: a flood at the cap costs no log
    /// write. `apply` decides the close cases (concurrent creations) alike on every replica.
    ///
    /// # Errors
    /// `limit_exceeded`.
    pub(crate) async fn check_objects_cap(&self, app: &App, key: &Key) -> Result<(), ApiError> {
        let Some(creator) = self.creator(app) else { return Ok(()) };
        let capped = {
            let replica = app.replica().read();
            let exists = match key.kind {
                permit_core::Kind::Queue => replica.state.queue(&key.name).is_some(),
                permit_core::Kind::Semaphore | permit_core::Kind::Election => {
                    replica.state.object(key).is_some()
                }
            };
            !exists && replica.state.objects_created_by(creator.token) >= creator.objects_max
        };
        if capped {
            return Err(slowly(objects_cap_refusal()).await);
        }
        Ok(())
    }

    /// [`Caller::owns`] on the node's applied state.
    ///
    /// # Errors
    /// `permission_denied`.
    pub(crate) fn check_owns(&self, app: &App, session: SessionId) -> Result<(), ApiError> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Token { .. } => self.owns(&app.replica().read().state, session),
        }
    }

    /// A place for one long-poll of this caller on this node (see `auth::LongPolls`); a refusal is
    /// answered after [`PER_TOKEN_REFUSAL_DELAY`](crate::auth::PER_TOKEN_REFUSAL_DELAY).
    ///
    /// # Errors
    /// `limit_exceeded`.
    pub(crate) async fn long_poll(&self, app: &App) -> Result<LongPoll, ApiError> {
        mark_long_poll();
        match app.long_polls.enter(self, app.config.long_polls_per_token_max) {
            Ok(poll) => Ok(poll),
            Err(refusal) => Err(slowly(refusal).await),
        }
    }
}

/// Runs `request` on this node once its caller is found and allowed its route's [`Need`]
/// (the caller then is in its extensions, for the [`Caller`] extractor); otherwise answers the
/// refusal and runs nothing. The edge calls this where it runs a request here rather than
/// forwarding it: in the edge, not in a layer of its own, because axum wraps every route in
/// every layer and each costs a request a boxed clone of its route's stack.
///
/// A method without an access rule in [`need`] is answered `405 method_not_allowed`, with the
/// methods that have one in `Allow`: the rules are the list of what is served, so a handler
/// added without a rule is refused to everyone (and the route-matrix test fails).
pub(super) async fn authenticated(app: &App, mut request: Request, next: Next) -> Response {
    let Some(route) = request.extensions().get::<MatchedPath>().cloned() else {
        return next.run(request).await; // unmatched: the fallback answers 404
    };
    let metrics_public = app.config.metrics_public;
    let Some(need) = need(request.method(), route.as_str(), metrics_public) else {
        return method_not_allowed(route.as_str(), metrics_public);
    };
    let caller = match check(app, &mut request, need).await {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

async fn check(app: &App, request: &mut Request, need: Need) -> Result<Caller, ApiError> {
    if !app.config.auth || need == Need::Open {
        return Ok(Caller::Anyone);
    }
    if let Some(refusal) = out_of_contact(app) {
        return Err(refusal);
    }
    let caller = identify(app, request.headers())?;
    match need {
        Need::Open | Need::Authenticated | Need::InBody(..) => {}
        Need::Global(resource, access) => caller.require(resource, "", access)?,
        Need::Named(resource, access) => {
            let (mut parts, body) = std::mem::take(request).into_parts();
            let params = RawPathParams::from_request_parts(&mut parts, &()).await;
            *request = Request::from_parts(parts, body);
            let params = params.map_err(|_| ApiError::internal("no path parameters"))?;
            let name = params.iter().find(|(key, _)| *key == "name").map_or("", |(_, value)| value);
            caller.require(resource, name, access)?;
        }
    }
    Ok(caller)
}

/// The `405` of a method that `route` has no access rule for, naming in `Allow` those it has.
fn method_not_allowed(route: &str, metrics_public: bool) -> Response {
    use axum::http::Method;
    let allowed: Vec<&str> = [Method::GET, Method::PUT, Method::POST, Method::DELETE]
        .iter()
        .filter(|method| need(method, route, metrics_public).is_some())
        .map(Method::as_str)
        .collect();
    let mut response = super::wrong_method().into_response();
    if let Ok(allow) = header::HeaderValue::from_str(&allowed.join(",")) {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}

/// The refusal of every token-checked route on a node that does not apply the cluster's log
/// now (`raft::contact`): removed and left running, or cut off from its leader (or quorum) for
/// longer than the election bound. Its state no longer learns of deleted tokens, so it would
/// serve them, even to `?stale=true` reads; the client goes to another node instead. `None`
/// while the node is in contact.
fn out_of_contact(app: &App) -> Option<ApiError> {
    let why = match app.standing() {
        Standing::InContact => return None,
        Standing::Removed => "this node was removed from the cluster",
        Standing::OutOfContact => "this node has not heard from a leader (or, leading, from a quorum) lately",
    };
    let message =
        format!("{why}: it serves no authenticated request; nothing was done, retry on another node");
    Some(ApiError::new(ErrorCode::LeaderUnreachable, message))
}

impl Caller {
    /// Runs `poll`, a long-poll or stream held open for this caller, unless it is cut off
    /// first: its token is deleted (`401 unauthenticated`, as soon as this node applies the
    /// deletion) or, for a `read` served from this node's state (a blocking read, the event
    /// stream), this node stops applying the log (`503 leader_unreachable`, see
    /// `out_of_contact`). A waiting acquire or campaign is not cut off by the latter: its
    /// wait is in the log already, and `leader_unreachable` promises that nothing was done.
    ///
    /// # Errors
    /// `poll`'s, `unauthenticated` or `leader_unreachable`.
    pub(crate) async fn unless_cut_off<T>(
        &self,
        app: &App,
        read: bool,
        poll: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        if matches!(self, Caller::Anyone) {
            return poll.await;
        }
        tokio::select! {
            biased;
            cut = self.cut_off(app, read) => Err(cut),
            answer = poll => answer,
        }
    }

    /// Resolves when this caller's long-polls must end (see [`Caller::unless_cut_off`]), with
    /// the error that ends them; never without auth.
    pub(crate) async fn cut_off(&self, app: &App, read: bool) -> ApiError {
        let Caller::Token { id, .. } = self else { return std::future::pending().await };
        let revocation = app.notifier.on_revocation(*id);
        let mut standing = app.standing_changes();
        loop {
            // Enabled before the check, so that a deletion applied in between is not missed.
            let revoked = revocation.notify().notified();
            tokio::pin!(revoked);
            revoked.as_mut().enable();
            if !self.valid_in(&app.replica().read().state) {
                return ApiError::new(ErrorCode::Unauthenticated, "the token was deleted");
            }
            if read {
                if let Some(refusal) = out_of_contact(app) {
                    return refusal;
                }
            }
            tokio::select! {
                () = &mut revoked => {}
                changed = standing.changed(), if read => {
                    if changed.is_err() {
                        // The watcher stopped with the Raft core; fail-stop ends the app.
                        return std::future::pending().await;
                    }
                }
            }
        }
    }
}

/// The caller whose token `headers` carry, on this node's applied state (authentication
/// only: what the route needs is checked by [`check`]).
///
/// # Errors
/// `unauthenticated`.
pub(crate) fn identify(app: &App, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
    let unauthenticated = |why: &str| ApiError::new(ErrorCode::Unauthenticated, why.to_owned());
    let header = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthenticated("auth is on: send `Authorization: Bearer SECRET`"))?;
    let secret = header
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix(AUTHORIZATION_SCHEME))
        .and_then(|rest| rest.strip_prefix(' '))
        .map(str::trim)
        .filter(|secret| !secret.is_empty())
        .ok_or_else(|| unauthenticated("malformed Authorization header: expected `Bearer SECRET`"))?;
    let replica = app.replica().read();
    if let Some((id, token)) = token_of_secret(&replica.state, secret) {
        return Ok(Caller::Token { id, token: token.clone() });
    }
    // Before the bootstrap has committed the root token (a `--join` node waiting for
    // `POST /v1/cluster/init`, or the first moments of a new cluster), the root secret this node
    // was given already acts as root: it is the secret the bootstrap will install.
    let hash = secret_hash(None, secret);
    let configured = app.config.root_token.as_deref().map(|secret| secret_hash(None, secret));
    if !replica.state.root_created() && configured == Some(hash) {
        let token = Token { name: "root".to_owned(), secret_hash: hash, rules: permit_core::root_rules() };
        return Ok(Caller::Token { id: permit_core::ROOT_TOKEN_ID, token });
    }
    Err(unauthenticated("unknown or deleted token"))
}
