//! Who is asking, and may they: authentication and authorisation of client requests.
//!
//! With `--auth`, every client request carries `Authorization: Bearer SECRET`. The middleware
//! `authenticate` hashes the secret ([`secret_hash`]), finds the token in the replicated state, checks
//! the route's [`Need`] (from [`need`], the one table of every route's permission) and hands the
//! handler a `Caller`. Handlers then check what only they can see: that a session named in the
//! request belongs to the caller's token. Without `--auth` every request is `Caller::Anyone`.
//!
//! Authorisation runs on the node that executes the request: a follower forwards writes to the
//! leader with the `Authorization` header, and the leader decides on its own state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
pub(crate) use permit_core::{Access, Resource};
use permit_core::{Creator, Key, Kind, SessionId, State as CoreState, Token, TokenId};
use permit_wire::{ErrorCode, AUTHORIZATION_SCHEME};
use sha2::{Digest, Sha256};

use crate::api::ApiError;
use crate::node::Node;
use crate::raft::contact::Standing;

/// The identity a request was made with.
#[derive(Clone, Debug)]
pub(crate) enum Caller {
    /// Auth is off: everyone may do everything, and sessions have no owner.
    Anyone,
    /// A valid token.
    Token {
        /// Its public id.
        id: TokenId,
        /// The token, as the state held it when the request arrived.
        token: Token,
    },
}

/// What a route needs from its caller, before the handler looks at the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health, the OpenAPI spec, peer RPC (which the peer channel checks).
    Open,
    /// Any valid token; the handler checks the rest (a session's owner, a list's filter).
    Authenticated,
    /// This access to the object named by the route's `{name}`.
    Named(Resource, Access),
    /// This access to the resource as a whole (name `""`).
    Global(Resource, Access),
    /// This access to a name the request body carries (a new session's name): the middleware
    /// only authenticates, the handler checks the name.
    InBody(Resource, Access),
}

/// The permission each route needs. `None` for a route missing from this table: such a route is
/// refused to everyone (deny by default), and the route-matrix test fails, so a new route cannot
/// skip authorisation silently.
pub fn need(method: &Method, route: &str, metrics_public: bool) -> Option<Need> {
    use Access::{Admin, Read, Write};
    use Need::{Authenticated, Global, InBody, Named, Open};
    use Resource::{Acl, Cluster, Election, Semaphore};
    let need = match (method.as_str(), route) {
        ("GET", "/v1/health" | "/v1/health/live" | "/v1/openapi.json") => Open,
        // The dashboard's page and assets hold no data; every call it makes needs its token.
        ("GET", "/ui" | "/ui/" | "/ui/{file}") => Open,
        (_, route) if route.starts_with("/raft/") => Open,
        ("GET", "/metrics") if metrics_public => Open,
        ("GET", "/metrics") => Global(Cluster, Read),
        ("POST", "/v1/sessions") => InBody(Resource::Session, Write),
        ("GET", "/v1/sessions") => Authenticated,
        ("GET" | "DELETE", "/v1/sessions/{id}") => Authenticated,
        ("POST", "/v1/sessions/{id}/keepalive" | "/v1/sessions/keepalive") => Authenticated,
        ("GET", "/v1/semaphores") => Authenticated,
        ("GET", "/v1/semaphores/{name}" | "/v1/semaphores/{name}/history") => Named(Semaphore, Read),
        ("PUT" | "DELETE", "/v1/semaphores/{name}") => Named(Semaphore, Admin),
        ("POST", "/v1/semaphores/{name}/acquire" | "/v1/semaphores/{name}/release") => {
            Named(Semaphore, Write)
        }
        ("POST", "/v1/semaphores/{name}/validate") => Named(Semaphore, Read),
        ("POST", "/v1/semaphores/{name}/revoke") => Named(Semaphore, Admin),
        ("GET", "/v1/elections") => Authenticated,
        ("GET", "/v1/elections/{name}") => Named(Election, Read),
        ("POST", "/v1/elections/{name}/campaign" | "/v1/elections/{name}/resign") => Named(Election, Write),
        ("POST", "/v1/elections/{name}/revoke") => Named(Election, Admin),
        ("GET", "/v1/cluster") => Global(Cluster, Read),
        // Filtered per event: read access to each semaphore, election or session name.
        ("GET", "/v1/events") => Authenticated,
        ("GET", "/v1/snapshot") => Global(Cluster, Admin),
        ("POST", "/v1/cluster/init" | "/v1/cluster/members") => Global(Cluster, Admin),
        ("DELETE", "/v1/cluster/members/{id}") => Global(Cluster, Admin),
        ("GET", "/v1/debug/digest") => Global(Cluster, Admin),
        ("GET", "/v1/acl/tokens/self") => Authenticated,
        ("GET", "/v1/acl/tokens") => Global(Acl, Read),
        ("POST", "/v1/acl/tokens") => Global(Acl, Admin),
        ("DELETE", "/v1/acl/tokens/{id}") => Global(Acl, Admin),
        _ => return None,
    };
    Some(need)
}

impl Caller {
    /// Whether the caller has `access` to `name` of `resource`.
    pub(crate) fn can(&self, resource: Resource, name: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token { token, .. } => token.allows(resource, name, access),
        }
    }

    /// Prefixes that cover every name of `resource` to which the caller has `access`: each such
    /// name starts with one of them (`[""]` with auth off). They are the prefixes of the rules
    /// that grant `access`, so a name under one of them may still be refused by a longer rule
    /// that grants less: check each name with [`Caller::can`]. For read access no rule grants
    /// less (every level includes read), so the names under them are exactly the readable
    /// ones, and a list walks only what the caller may see.
    pub(crate) fn prefixes(&self, resource: Resource, access: Access) -> Vec<&str> {
        match self {
            Caller::Anyone => vec![""],
            Caller::Token { token, .. } => token
                .rules
                .iter()
                .filter(|rule| rule.resource == resource && rule.access >= access)
                .map(|rule| rule.prefix.as_str())
                .collect(),
        }
    }

    /// Whether the caller may read the object `key` (semaphore or election read access).
    pub(crate) fn reads(&self, key: &Key) -> bool {
        let resource = match key.kind {
            Kind::Semaphore => Resource::Semaphore,
            Kind::Election => Resource::Election,
        };
        self.can(resource, key.name.as_str(), Access::Read)
    }

    /// Whether the caller may see a session owned by `owner` and named `name` (in session
    /// listings, session views and session events): its own sessions, or any with `session`
    /// admin on its name. `session` read or write alone shows no other token's session: the
    /// README's `session:=write` must not let one tenant list another's holds.
    pub(crate) fn sees_session(&self, owner: Option<TokenId>, name: Option<&str>) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token { id, token } => {
                owner == Some(*id) || token.allows(Resource::Session, name.unwrap_or(""), Access::Admin)
            }
        }
    }

    /// Like [`Caller::can`], as a typed 403 naming the missing permission.
    ///
    /// # Errors
    /// `permission_denied`.
    pub(crate) fn require(&self, resource: Resource, name: &str, access: Access) -> Result<(), ApiError> {
        if self.can(resource, name, access) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!("this token lacks {} access to {} {name:?}", access.as_str(), resource.as_str()),
        ))
    }

    /// The caller's token id, when auth is on.
    pub(crate) fn token_id(&self) -> Option<TokenId> {
        match self {
            Caller::Anyone => None,
            Caller::Token { id, .. } => Some(*id),
        }
    }

    /// Whether the session (if it exists) belongs to the caller. Knowing a session id grants
    /// nothing: acquire, release, campaign, resign and keepalive need the owning token. A missing
    /// session passes, so that the handler answers `session_not_found` as it would without auth.
    ///
    /// # Errors
    /// `permission_denied` for a session of another token (or one made while auth was off).
    pub(crate) fn owns(&self, state: &CoreState, session: SessionId) -> Result<(), ApiError> {
        let Caller::Token { id, .. } = self else { return Ok(()) };
        match state.session(session) {
            Some(found) if found.owner != Some(*id) => Err(ApiError::new(
                ErrorCode::PermissionDenied,
                "the session belongs to another token; only the token that created it may use it",
            )),
            _ => Ok(()),
        }
    }

    /// Like [`Caller::owns`], or `access` to sessions of the session's name (an admin closing
    /// or inspecting someone else's session).
    ///
    /// # Errors
    /// `permission_denied`.
    pub(crate) fn owns_or(
        &self,
        state: &CoreState,
        session: SessionId,
        access: Access,
    ) -> Result<(), ApiError> {
        let owned = self.owns(state, session);
        let name = state.session(session).and_then(|s| s.name.as_deref()).unwrap_or("");
        if owned.is_err() && self.can(Resource::Session, name, access) {
            return Ok(());
        }
        owned
    }
}

impl Caller {
    /// The token an object this caller creates is recorded under, with its cap
    /// (`--objects-per-token-max`); `None` with auth off.
    pub(crate) fn creator(&self, node: &Node) -> Option<Creator> {
        self.token_id().map(|token| Creator { token, objects_max: node.config.objects_per_token_max })
    }

    /// Refuses, after [`PER_TOKEN_REFUSAL_DELAY`], a request that would create `key` when the
    /// caller's token has created its cap of objects already: a flood at the cap costs no log
    /// write. `apply` decides the close cases (concurrent creations) alike on every replica.
    ///
    /// # Errors
    /// `limit_exceeded`.
    pub(crate) async fn check_objects_cap(&self, node: &Node, key: &Key) -> Result<(), ApiError> {
        let Some(creator) = self.creator(node) else { return Ok(()) };
        let capped = {
            let replica = node.replica().read();
            replica.state.object(key).is_none()
                && replica.state.objects_created_by(creator.token) >= creator.objects_max
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
    pub(crate) fn check_owns(&self, node: &Node, session: SessionId) -> Result<(), ApiError> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Token { .. } => self.owns(&node.replica().read().state, session),
        }
    }

    /// A place for one long-poll of this caller on `node` (see [`LongPolls`]); a refusal is
    /// answered after [`PER_TOKEN_REFUSAL_DELAY`].
    ///
    /// # Errors
    /// `limit_exceeded`.
    pub(crate) async fn long_poll(&self, node: &Node) -> Result<LongPoll, ApiError> {
        crate::api::mark_long_poll();
        match node.long_polls.enter(self, node.config.long_polls_per_token_max) {
            Ok(poll) => Ok(poll),
            Err(refusal) => Err(slowly(refusal).await),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| ApiError::internal("no caller"))
    }
}

/// How long a refusal for a per-token cap waits before it is answered. A client that floods
/// (retrying at once in a loop) then makes at most a few requests per second per connection, so
/// the CPU it costs stays small and other tokens keep their latency; a well-behaved client waits
/// for `Retry-After` anyway.
const PER_TOKEN_REFUSAL_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// The answer to a creation over the caller's cap of objects (429 `limit_exceeded`).
pub(crate) fn objects_cap_refusal() -> ApiError {
    let mut error: ApiError = permit_core::Refusal::LimitExceeded(permit_core::Limit::ObjectsPerToken).into();
    error.message.push_str(
        " (--objects-per-token-max): delete semaphores it no longer needs, or ask for a higher cap",
    );
    error
}

/// Returns `refusal` after [`PER_TOKEN_REFUSAL_DELAY`].
pub(crate) async fn slowly(refusal: ApiError) -> ApiError {
    tokio::time::sleep(PER_TOKEN_REFUSAL_DELAY).await;
    refusal
}

/// The hash of a secret as a token stores it: HMAC-SHA256 keyed with the cluster's token salt,
/// or, without a salt (a token stored before its cluster had one), the plain SHA-256.
///
/// The salt sits in the replicated state beside the hashes, so it is no secret from whoever
/// reads a data dir or a backup: it makes precomputed tables useless and the hashes of one
/// secret differ from cluster to cluster. Server-drawn secrets (256 random bits) need no more;
/// an operator's root secret is as strong as its entropy.
pub fn secret_hash(salt: Option<&[u8; 32]>, secret: &str) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    match salt {
        Some(salt) => {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(salt).expect("HMAC takes keys of any length");
            mac.update(secret.as_bytes());
            mac.finalize().into_bytes().into()
        }
        None => Sha256::digest(secret.as_bytes()).into(),
    }
}

/// The token whose secret is `secret` in `state`: looked up under the cluster's salt, then (for
/// a token stored before the cluster had a salt) under the plain SHA-256. Two O(log n) lookups
/// at most.
fn token_of_secret<'a>(state: &'a CoreState, secret: &str) -> Option<(TokenId, &'a Token)> {
    let salted = state.token_salt().and_then(|salt| state.token_by_secret(&secret_hash(Some(salt), secret)));
    salted.or_else(|| state.token_by_secret(&secret_hash(None, secret)))
}

/// A new secret: 256 bits from the OS's CSPRNG, as 64 hex digits.
pub(crate) fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Shortest secret the server accepts for the root token, in bytes.
const ROOT_SECRET_BYTES_MIN: usize = 16;

/// Middleware: finds the caller and checks the route's [`Need`].
pub(crate) async fn authenticate(
    State(node): State<Arc<Node>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(route) = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()) else {
        return next.run(request).await; // unmatched: the fallback answers 404 / 405
    };
    let caller = match check(&node, &mut request, &route).await {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

async fn check(node: &Node, request: &mut Request, route: &str) -> Result<Caller, ApiError> {
    let config = &node.config;
    let Some(need) = need(request.method(), route, config.metrics_public) else {
        return Err(ApiError::new(ErrorCode::PermissionDenied, "this route has no access rule"));
    };
    if !config.auth || need == Need::Open {
        return Ok(Caller::Anyone);
    }
    if let Some(refusal) = out_of_contact(node) {
        return Err(refusal);
    }
    let caller = identify(node, request.headers())?;
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

/// The refusal of every token-checked route on a node that does not apply the cluster's log
/// now (`raft::contact`): removed and left running, or cut off from its leader (or quorum) for
/// longer than the election bound. Its state no longer learns of deleted tokens, so it would
/// serve them, even to `?stale=true` reads; the client goes to another node instead. `None`
/// while the node is in contact.
fn out_of_contact(node: &Node) -> Option<ApiError> {
    let why = match node.contact.standing() {
        Standing::InContact => return None,
        Standing::Removed => "this node was removed from the cluster",
        Standing::OutOfContact => "this node has not heard from a leader (or, leading, from a quorum) lately",
    };
    let message =
        format!("{why}: it serves no authenticated request; nothing was done, retry on another node");
    Some(ApiError::new(ErrorCode::LeaderUnreachable, message))
}

impl Caller {
    /// Whether the caller's token still exists in `state` (always, without auth). The root
    /// secret a node was configured with counts until the bootstrap has created the root token.
    fn valid_in(&self, state: &CoreState) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token { id, .. } => {
                state.token(*id).is_some() || (*id == permit_core::ROOT_TOKEN_ID && !state.root_created())
            }
        }
    }

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
        node: &Node,
        read: bool,
        poll: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        if matches!(self, Caller::Anyone) {
            return poll.await;
        }
        tokio::select! {
            biased;
            cut = self.cut_off(node, read) => Err(cut),
            answer = poll => answer,
        }
    }

    /// Resolves when this caller's long-polls must end (see [`Caller::unless_cut_off`]), with
    /// the error that ends them; never without auth.
    pub(crate) async fn cut_off(&self, node: &Node, read: bool) -> ApiError {
        let Caller::Token { id, .. } = self else { return std::future::pending().await };
        let revocation = node.notifier.on_revocation(*id);
        let mut standing = node.contact.changes();
        loop {
            // Enabled before the check, so that a deletion applied in between is not missed.
            let revoked = revocation.notify().notified();
            tokio::pin!(revoked);
            revoked.as_mut().enable();
            if !self.valid_in(&node.replica().read().state) {
                return ApiError::new(ErrorCode::Unauthenticated, "the token was deleted");
            }
            if read {
                if let Some(refusal) = out_of_contact(node) {
                    return refusal;
                }
            }
            tokio::select! {
                () = &mut revoked => {}
                changed = standing.changed(), if read => {
                    if changed.is_err() {
                        // The watcher stopped with the Raft core; fail-stop ends the node.
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
pub(crate) fn identify(node: &Node, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
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
    let replica = node.replica().read();
    if let Some((id, token)) = token_of_secret(&replica.state, secret) {
        return Ok(Caller::Token { id, token: token.clone() });
    }
    // Before the bootstrap has committed the root token (a `--join` node waiting for
    // `POST /v1/cluster/init`, or the first moments of a new cluster), the root secret this node
    // was given already acts as root: it is the secret the bootstrap will install.
    let hash = secret_hash(None, secret);
    let configured = node.config.root_token.as_deref().map(|secret| secret_hash(None, secret));
    if !replica.state.root_created() && configured == Some(hash) {
        let token = Token { name: "root".to_owned(), secret_hash: hash, rules: permit_core::root_rules() };
        return Ok(Caller::Token { id: permit_core::ROOT_TOKEN_ID, token });
    }
    Err(unauthenticated("unknown or deleted token"))
}

/// Counts each token's open long-polls, to cap them (`--long-polls-per-token-max`).
#[derive(Debug, Default)]
pub(crate) struct LongPolls {
    open: Mutex<HashMap<TokenId, u32>>,
}

/// One open long-poll; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct LongPoll {
    polls: Option<(Arc<LongPolls>, TokenId)>,
}

impl LongPolls {
    /// Takes a place for one long-poll of `caller`, or refuses when its token has `max` open.
    ///
    /// # Errors
    /// `limit_exceeded` (429 with `Retry-After`).
    pub(crate) fn enter(self: &Arc<LongPolls>, caller: &Caller, max: u32) -> Result<LongPoll, ApiError> {
        let Some(id) = caller.token_id() else { return Ok(LongPoll { polls: None }) };
        let mut open = self.open.lock().expect("long-poll counts lock");
        let count = open.entry(id).or_default();
        if *count >= max {
            return Err(ApiError::new(
                ErrorCode::LimitExceeded,
                format!("this token has {max} long-polls open already (--long-polls-per-token-max)"),
            ));
        }
        *count += 1;
        Ok(LongPoll { polls: Some((self.clone(), id)) })
    }
}

impl Drop for LongPoll {
    fn drop(&mut self) {
        if let Some((polls, id)) = self.polls.take() {
            let mut open = polls.open.lock().expect("long-poll counts lock");
            if let Some(count) = open.get_mut(&id) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&id);
                }
            }
        }
    }
}

/// Name of the file in the data dir that holds a generated root secret.
const ROOT_TOKEN_FILE: &str = "root-token";

/// Creates the cluster's token salt and, with it, the root token, once per cluster: when this node
/// leads and the replicated state has never had them. The secret is the configured one
/// (`PERMIT_ROOT_TOKEN`, `--root-token-file`) or one generated into `DATA_DIR/root-token`
/// (mode 0600). A cluster made before salts gets its salt from its first leader that has this
/// code; its tokens made before keep their plain SHA-256. Ends when both exist.
pub(crate) async fn bootstrap_root(node: Arc<Node>) {
    let mut leading = node.consensus.leading().clone();
    let mut shutdown = node.shutdown.clone();
    loop {
        let done = {
            let state = &node.replica().read().state;
            state.root_created() && state.token_salt().is_some()
        };
        if done || *shutdown.borrow() {
            return;
        }
        if leading.borrow_and_update().is_some() {
            // Done once applied (the loop's check); a command another leader's beat changed
            // nothing, and the next look decides what is still missing.
            if let Err(error) = propose_root(&node).await {
                tracing::warn!(%error, "root token not created yet; will retry");
            }
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

async fn propose_root(node: &Node) -> anyhow::Result<()> {
    let (salt, root_created) = {
        let state = &node.replica().read().state;
        (state.token_salt().copied(), state.root_created())
    };
    // A new cluster draws its salt (256 bits from the OS's CSPRNG) and creates the root token
    // under it in one command; one made before salts gets a salt alone. A concurrent leader's
    // command may win: then this one changes nothing and the caller's loop looks again.
    let (salt, new_salt) = match salt {
        Some(salt) => (salt, false),
        None => (rand::random(), true),
    };
    let (root, file) = if root_created {
        (None, None)
    } else {
        let (secret, file) = match &node.config.root_token {
            Some(secret) => (secret.clone(), None),
            None => {
                let path = node.config.data_dir.join(ROOT_TOKEN_FILE);
                (read_or_create_secret(&path)?, Some(path))
            }
        };
        let token = Token {
            name: "root".to_owned(),
            secret_hash: secret_hash(Some(&salt), &secret),
            rules: permit_core::root_rules(),
        };
        (Some(token), file)
    };
    let command = match (new_salt, root) {
        (true, root) => permit_core::Command::SetTokenSalt { salt, root },
        (false, Some(token)) => permit_core::Command::CreateToken { id: permit_core::ROOT_TOKEN_ID, token },
        (false, None) => return Ok(()),
    };
    match node.propose(command).await.map_err(|e| anyhow::anyhow!("{e:?}"))? {
        permit_core::Outcome::TokenSaltSet | permit_core::Outcome::TokenCreated => {
            if new_salt {
                tracing::info!("token salt created");
            }
            match (root_created, file) {
                (true, _) => {}
                (false, Some(path)) => {
                    tracing::info!(path = %path.display(), "root token created; its secret is in this file")
                }
                (false, None) => tracing::info!("root token created from the configured secret"),
            }
        }
        permit_core::Outcome::Refused(permit_core::Refusal::TokenExists) => {}
        other => anyhow::bail!("unexpected outcome {other:?}"),
    }
    Ok(())
}

/// The secret in `path`, or a new one written there (mode 0600, fsynced) if it does not exist.
fn read_or_create_secret(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(secret) if secret.trim().len() >= ROOT_SECRET_BYTES_MIN => return Ok(secret.trim().to_owned()),
        Ok(_) => {
            anyhow::bail!("{} holds no secret of at least {ROOT_SECRET_BYTES_MIN} bytes", path.display())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    }
    let secret = new_secret();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    file.write_all(format!("{secret}\n").as_bytes())?;
    file.sync_all()?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use permit_core::{root_rules, Batch, Command, Outcome, State, Token, TokenId};

    use super::{secret_hash, token_of_secret};

    fn create(id: u8, secret_hash: [u8; 32]) -> Command {
        let token = Token { name: format!("t{id}"), secret_hash, rules: root_rules() };
        Command::CreateToken { id: TokenId::from_bytes([id; 16]), token }
    }

    /// A token stored before its cluster had a salt keeps authenticating by its plain SHA-256
    /// once the salt exists; one stored after is found only under the salt.
    #[test]
    fn secrets_are_found_under_the_salt_and_old_tokens_under_their_plain_hash() {
        let mut state = State::default();
        let salt = [7; 32];
        let commands = vec![
            create(1, secret_hash(None, "old-secret")),
            Command::SetTokenSalt { salt, root: None },
            create(2, secret_hash(Some(&salt), "new-secret")),
        ];
        let outcomes = state.apply(1, 1, &Batch { now_ms: 0, commands }, &mut Vec::new());
        assert_eq!(outcomes, [Outcome::TokenCreated, Outcome::TokenSaltSet, Outcome::TokenCreated]);
        let id = |secret| token_of_secret(&state, secret).map(|(id, _)| id);
        assert_eq!(id("old-secret"), Some(TokenId::from_bytes([1; 16])));
        assert_eq!(id("new-secret"), Some(TokenId::from_bytes([2; 16])));
        assert_eq!(id("other"), None);
        assert_ne!(secret_hash(Some(&salt), "new-secret"), secret_hash(None, "new-secret"));
        assert_ne!(secret_hash(Some(&salt), "new-secret"), secret_hash(Some(&[8; 32]), "new-secret"));
        // A stored salted hash is no plain hash: the plain lookup never finds a salted token.
        let salted_only = state.token_by_secret(&secret_hash(None, "new-secret"));
        assert!(salted_only.is_none());
    }
}
