//! Who is asking, and may they: authentication and authorisation of client requests.
//!
//! With `--auth`, every client request carries `Authorization: Bearer SECRET`. The edge
//! (`api/caller.rs`, `authenticated`) hashes the secret ([`secret_hash`]), finds the token in the replicated state
//! (`token_of_secret`), checks the route's [`Need`] (from [`need`], the one table of every
//! route's permission) and hands the handler a `Caller`. Handlers then check what only they can
//! see: that a session named in the request belongs to the caller's token. Without `--auth` every
//! request is `Caller::Anyone`.
//!
//! Authorisation runs on the node that executes the request: a follower forwards writes to the
//! leader with the `Authorization` header, and the leader decides on its own state.
//!
//! This file holds the rules alone, over `permit-core`'s state: it uses neither the HTTP layer
//! nor the node, so that both the handlers and the state machine (which hashes secrets) can use it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::Method;
pub(crate) use permit_core::{Access, Resource};
use permit_core::{Key, Kind, SessionId, State as CoreState, Token, TokenId};
use permit_wire::ErrorCode;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

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
    /// This access to a name the request body carries (a new session's name): the edge
    /// only authenticates, the handler checks the name.
    InBody(Resource, Access),
}

/// The permission each route needs. `None` for a route and method missing from this table: it
/// is not served (`405`, deny by default), and the route-matrix test fails, so a new route cannot
/// skip authorisation silently.
pub fn need(method: &Method, route: &str, metrics_public: bool) -> Option<Need> {
    use Access::{Admin, Read, Write};
    use Need::{Authenticated, Global, InBody, Named, Open};
    use Resource::{Acl, Cluster, Election, Queue, Semaphore};
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
        (
            "POST",
            "/v1/semaphores/{name}/acquire" | "/v1/semaphores/{name}/release" | "/v1/semaphores/{name}/take",
        ) => Named(Semaphore, Write),
        ("POST", "/v1/semaphores/{name}/validate") => Named(Semaphore, Read),
        ("POST", "/v1/semaphores/{name}/revoke") => Named(Semaphore, Admin),
        ("GET", "/v1/elections") => Authenticated,
        ("GET", "/v1/elections/{name}") => Named(Election, Read),
        (
            "POST",
            "/v1/elections/{name}/campaign" | "/v1/elections/{name}/proclaim" | "/v1/elections/{name}/resign",
        ) => Named(Election, Write),
        ("POST", "/v1/elections/{name}/revoke") => Named(Election, Admin),
        ("GET", "/v1/queues") => Authenticated,
        ("GET", "/v1/queues/{name}" | "/v1/queues/{name}/items") => Named(Queue, Read),
        ("PUT" | "DELETE", "/v1/queues/{name}") => Named(Queue, Admin),
        (
            "POST",
            "/v1/queues/{name}/items"
            | "/v1/queues/{name}/claim"
            | "/v1/queues/{name}/claim/cancel"
            | "/v1/queues/{name}/items/{id}/ack"
            | "/v1/queues/{name}/items/{id}/nack",
        ) => Named(Queue, Write),
        ("DELETE", "/v1/queues/{name}/items/{id}") => Named(Queue, Admin),
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

/// The ACL resource that governs objects of `kind`.
pub(crate) fn resource_of(kind: Kind) -> Resource {
    match kind {
        Kind::Semaphore => Resource::Semaphore,
        Kind::Election => Resource::Election,
        Kind::Queue => Resource::Queue,
    }
}

impl Caller {
    /// Whether the caller has `access` to `name` of `resource`.
    pub(crate) fn can(&self, resource: Resource, name: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            // The root token may do everything, also on resources newer than its stored rules
            // (`permit_core::root_rules`).
            Caller::Token { id, token } => {
                *id == permit_core::ROOT_TOKEN_ID || token.allows(resource, name, access)
            }
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

    /// Whether the caller may read the object `key` (semaphore, election or queue read access).
    pub(crate) fn reads(&self, key: &Key) -> bool {
        self.can(resource_of(key.kind), key.name.as_str(), Access::Read)
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
    /// Whether the caller's token still exists in `state` (always, without auth). The root
    /// secret a node was configured with counts until the bootstrap has created the root token.
    pub(crate) fn valid_in(&self, state: &CoreState) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token { id, .. } => {
                state.token(*id).is_some() || (*id == permit_core::ROOT_TOKEN_ID && !state.root_created())
            }
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
pub(crate) const PER_TOKEN_REFUSAL_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

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
pub(crate) fn token_of_secret<'a>(state: &'a CoreState, secret: &str) -> Option<(TokenId, &'a Token)> {
    let salted = state.token_salt().and_then(|salt| state.token_by_secret(&secret_hash(Some(salt), secret)));
    salted.or_else(|| state.token_by_secret(&secret_hash(None, secret)))
}

/// A new secret: 256 bits from the OS's CSPRNG, as 64 hex digits.
pub(crate) fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
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
