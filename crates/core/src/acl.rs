//! Access control: tokens, their rules, and the question "may this token do that to this name?".
//!
//! Tokens live in the replicated [`crate::State`], so every node agrees on them and a change needs
//! no restart. A token stores only the SHA-256 of its secret: secrets are 256 random bits drawn
//! by the server (or given by the operator for the root token), so a plain hash is enough. The
//! hashing itself happens in the shell; this module only compares hashes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::limits::{NAME_BYTES_MAX, TOKENS_MAX, TOKEN_NAME_BYTES_MAX, TOKEN_RULES_MAX};
use crate::outcome::{Effect, Field, Limit, Outcome, Refusal};
use crate::{SessionId, State};

/// A token's public id: 128 bits chosen by the server, text form 32 lowercase hex digits. The
/// id names a token in the API (list, delete); it is not a credential.
///
/// # Examples
/// ```
/// use permit_core::TokenId;
/// let id = TokenId::from_bytes([9; 16]);
/// assert_eq!(id.to_string().parse::<TokenId>(), Ok(id));
/// assert_eq!(permit_core::ROOT_TOKEN_ID.to_string(), "0".repeat(32));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TokenId([u8; 16]);

/// The root token's id: all zeros. It is created once, when a cluster with auth first elects a
/// leader, and never again (even if it is deleted later).
pub const ROOT_TOKEN_ID: TokenId = TokenId([0; 16]);

/// Why a string is not a token id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a token id is 32 lowercase hex digits")]
pub struct InvalidTokenId;

impl TokenId {
    /// The token id made of these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> TokenId {
        TokenId(bytes)
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::hex::write(f, &self.0)
    }
}

impl fmt::Debug for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenId({self})")
    }
}

impl FromStr for TokenId {
    type Err = InvalidTokenId;
    fn from_str(text: &str) -> Result<TokenId, InvalidTokenId> {
        crate::hex::parse(text).map(TokenId).ok_or(InvalidTokenId)
    }
}

/// The kinds of thing a rule grants access to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Resource {
    /// Semaphores, by name.
    Semaphore,
    /// Elections, by name.
    Election,
    /// Sessions, by the session's name (`""` for a session without one).
    Session,
    /// Tokens and their rules (the name is always `""`).
    Acl,
    /// Membership, cluster status, debug routes, metrics and backups (the name is always `""`).
    Cluster,
}

impl Resource {
    /// Every resource, in a fixed order.
    pub const ALL: [Resource; 5] =
        [Resource::Semaphore, Resource::Election, Resource::Session, Resource::Acl, Resource::Cluster];

    /// The resource's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Semaphore => "semaphore",
            Resource::Election => "election",
            Resource::Session => "session",
            Resource::Acl => "acl",
            Resource::Cluster => "cluster",
        }
    }
}

/// How much a rule grants; each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Look: GET, watch, validate.
    Read,
    /// Use: acquire, release, campaign, resign with the token's own sessions; create on acquire.
    Write,
    /// Manage: set capacity, delete, revoke another session's hold.
    Admin,
}

impl Access {
    /// The access level's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Admin => "admin",
        }
    }
}

/// One grant: `access` to every name of `resource` that starts with `prefix`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// What kind of thing.
    pub resource: Resource,
    /// Names that start with this; `""` matches every name.
    pub prefix: String,
    /// How much.
    pub access: Access,
}

/// A token as the state machine keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// A name for humans (`ci`, `scheduler-hosts`).
    pub name: String,
    /// SHA-256 of the secret.
    pub secret_sha256: [u8; 32],
    /// The grants. For a resource and name, the rule with the longest matching prefix decides
    /// (as Consul's policies do); no matching rule means no access.
    pub rules: Vec<Rule>,
}

impl Token {
    /// The access this token has to `name` of `resource`: the access of the matching rule with
    /// the longest prefix, or `None`.
    ///
    /// # Examples
    /// ```
    /// use permit_core::{Access, Resource, Rule, Token};
    /// let rule = |prefix: &str, access| Rule { resource: Resource::Semaphore, prefix: prefix.into(), access };
    /// let token = Token {
    ///     name: "ci".into(),
    ///     secret_sha256: [0; 32],
    ///     rules: vec![rule("db.", Access::Write), rule("db.prod.", Access::Read)],
    /// };
    /// assert_eq!(token.access(Resource::Semaphore, "db.orders"), Some(Access::Write));
    /// assert_eq!(token.access(Resource::Semaphore, "db.prod.orders"), Some(Access::Read));
    /// assert_eq!(token.access(Resource::Semaphore, "gpu"), None);
    /// assert_eq!(token.access(Resource::Election, "db.orders"), None);
    /// ```
    pub fn access(&self, resource: Resource, name: &str) -> Option<Access> {
        self.rules
            .iter()
            .filter(|rule| rule.resource == resource && name.starts_with(rule.prefix.as_str()))
            .max_by(|a, b| a.prefix.len().cmp(&b.prefix.len()).then(a.access.cmp(&b.access)))
            .map(|rule| rule.access)
    }

    /// Whether this token has at least `needed` access to `name` of `resource`.
    pub fn allows(&self, resource: Resource, name: &str, needed: Access) -> bool {
        self.access(resource, name).is_some_and(|access| access >= needed)
    }
}

/// The root token's rules: admin on every name of every resource.
pub fn root_rules() -> Vec<Rule> {
    Resource::ALL
        .iter()
        .map(|&resource| Rule { resource, prefix: String::new(), access: Access::Admin })
        .collect()
}

/// Checks a token's name and rules against the limits.
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_token(name: &str, rules: &[Rule]) -> Result<(), Refusal> {
    let invalid = |field, reason: String| Err(Refusal::InvalidArgument { field, reason });
    if name.is_empty() || name.len() > TOKEN_NAME_BYTES_MAX || name.chars().any(char::is_control) {
        return invalid(
            Field::TokenName,
            format!("a token name is 1-{TOKEN_NAME_BYTES_MAX} bytes without control characters"),
        );
    }
    if rules.len() > TOKEN_RULES_MAX {
        return invalid(Field::Rules, format!("a token has at most {TOKEN_RULES_MAX} rules"));
    }
    if let Some(rule) = rules.iter().find(|rule| rule.prefix.len() > NAME_BYTES_MAX) {
        return invalid(
            Field::Rules,
            format!("prefix of {} bytes; prefixes are at most {NAME_BYTES_MAX} bytes", rule.prefix.len()),
        );
    }
    Ok(())
}

/// Applying token commands, and read access to tokens.
impl State {
    /// Refuses a session for `owner` when the token is gone or has `max` live sessions already.
    pub(crate) fn check_owner(&self, owner: TokenId, max: u64) -> Result<(), Refusal> {
        if !self.tokens.contains_key(&owner) {
            return Err(Refusal::TokenNotFound);
        }
        if self.sessions_per_owner.get(&owner).copied().unwrap_or(0) >= max {
            return Err(Refusal::LimitExceeded(Limit::SessionsPerToken));
        }
        Ok(())
    }

    pub(crate) fn create_token(&mut self, id: TokenId, token: &Token) -> Result<Outcome, Refusal> {
        validate_token(&token.name, &token.rules)?;
        let root_again = id == ROOT_TOKEN_ID && self.root_created;
        if root_again
            || self.tokens.contains_key(&id)
            || self.token_ids_by_secret.contains_key(&token.secret_sha256)
        {
            return Err(Refusal::TokenExists);
        }
        if self.tokens.len() >= TOKENS_MAX {
            return Err(Refusal::LimitExceeded(Limit::Tokens));
        }
        self.root_created |= id == ROOT_TOKEN_ID;
        self.token_ids_by_secret.insert(token.secret_sha256, id);
        self.tokens.insert(id, token.clone());
        Ok(Outcome::TokenCreated)
    }

    /// Deletes the token, then closes its sessions: their holds are released and their waits
    /// cancelled as if each session had been closed by its client.
    pub(crate) fn delete_token(
        &mut self,
        index: u64,
        id: TokenId,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let token = self.tokens.remove(&id).ok_or(Refusal::TokenNotFound)?;
        self.token_ids_by_secret.remove(&token.secret_sha256);
        let owned: Vec<SessionId> = if self.sessions_per_owner.contains_key(&id) {
            self.sessions.iter().filter(|(_, s)| s.owner == Some(id)).map(|(sid, _)| *sid).collect()
        } else {
            Vec::new()
        };
        for session in &owned {
            self.remove_session(index, *session, false, effects);
        }
        Ok(Outcome::TokenDeleted { sessions_closed: owned.len() as u64 })
    }

    /// The token with this id.
    pub fn token(&self, id: TokenId) -> Option<&Token> {
        self.tokens.get(&id)
    }

    /// The token whose secret has this SHA-256, with its id.
    pub fn token_by_secret(&self, secret_sha256: &[u8; 32]) -> Option<(TokenId, &Token)> {
        let id = *self.token_ids_by_secret.get(secret_sha256)?;
        Some((id, self.tokens.get(&id).expect("the secret index names live tokens")))
    }

    /// Every token, ordered by id.
    pub fn tokens(&self) -> impl ExactSizeIterator<Item = (&TokenId, &Token)> {
        self.tokens.iter()
    }

    /// Whether the root token was ever created.
    pub fn root_created(&self) -> bool {
        self.root_created
    }

    /// Live sessions created by this token.
    pub fn sessions_of(&self, owner: TokenId) -> u64 {
        self.sessions_per_owner.get(&owner).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(rules: Vec<Rule>) -> Token {
        Token { name: "t".into(), secret_sha256: [1; 32], rules }
    }

    #[test]
    fn the_longest_prefix_decides_even_when_it_grants_less() {
        let t = token(vec![
            Rule { resource: Resource::Semaphore, prefix: "".into(), access: Access::Admin },
            Rule { resource: Resource::Semaphore, prefix: "locked.".into(), access: Access::Read },
        ]);
        assert!(t.allows(Resource::Semaphore, "gpu", Access::Admin));
        assert!(t.allows(Resource::Semaphore, "locked.x", Access::Read));
        assert!(!t.allows(Resource::Semaphore, "locked.x", Access::Write));
    }

    use crate::test_support::{acquire_one, apply_next as apply};

    fn owned_session(id: u8, owner: TokenId, max: u64) -> crate::Command {
        crate::Command::CreateOwnedSession {
            id: SessionId::from_bytes([id; 16]),
            ttl_ms: 10_000,
            name: None,
            owner,
            owner_sessions_max: max,
        }
    }

    #[test]
    fn deleting_a_token_closes_its_sessions_and_frees_their_permits() {
        use crate::{Command, Key, Name};
        let mut state = State::default();
        let (alice, bob) = (TokenId::from_bytes([1; 16]), TokenId::from_bytes([2; 16]));
        let mut bob_token = token(root_rules());
        bob_token.secret_sha256 = [2; 32];
        let key = Key::semaphore(Name::new("db").unwrap());
        let acquire = |session: u8| Command::Acquire(acquire_one(&key, session));
        let outcomes = apply(
            &mut state,
            vec![
                Command::CreateToken { id: alice, token: token(root_rules()) },
                Command::CreateToken { id: bob, token: bob_token },
                owned_session(1, alice, 10),
                owned_session(2, bob, 10),
                acquire(1),
                acquire(2),
            ],
        );
        assert_eq!(outcomes[5], Outcome::Waiting { position: 1 });
        assert_eq!(state.sessions_of(alice), 1);
        let outcomes = apply(&mut state, vec![Command::DeleteToken { id: alice }]);
        assert_eq!(outcomes[0], Outcome::TokenDeleted { sessions_closed: 1 });
        assert_eq!(state.sessions_of(alice), 0);
        assert!(state.token_by_secret(&[1; 32]).is_none());
        let holder = state.object(&key).unwrap().holders.keys().next().copied();
        assert_eq!(holder, Some(SessionId::from_bytes([2; 16])), "bob was granted the freed permit");
        let outcomes = apply(&mut state, vec![owned_session(3, alice, 10)]);
        assert_eq!(outcomes[0], Outcome::Refused(Refusal::TokenNotFound));
        let decoded = State::decode_snapshot(&state.encode_snapshot()).unwrap();
        assert_eq!(decoded, state);
    }

    #[test]
    fn a_token_gets_at_most_its_cap_of_sessions_and_root_is_created_once() {
        let mut state = State::default();
        let outcomes = apply(
            &mut state,
            vec![
                crate::Command::CreateToken { id: ROOT_TOKEN_ID, token: token(root_rules()) },
                owned_session(1, ROOT_TOKEN_ID, 2),
                owned_session(2, ROOT_TOKEN_ID, 2),
                owned_session(3, ROOT_TOKEN_ID, 2),
            ],
        );
        assert_eq!(outcomes[2], Outcome::SessionCreated);
        assert_eq!(outcomes[3], Outcome::Refused(Refusal::LimitExceeded(Limit::SessionsPerToken)));
        apply(&mut state, vec![crate::Command::DeleteToken { id: ROOT_TOKEN_ID }]);
        let mut again = token(root_rules());
        again.secret_sha256 = [9; 32];
        let outcomes =
            apply(&mut state, vec![crate::Command::CreateToken { id: ROOT_TOKEN_ID, token: again }]);
        assert_eq!(outcomes[0], Outcome::Refused(Refusal::TokenExists));
        assert!(state.root_created());
    }

    #[test]
    fn root_is_admin_of_everything() {
        let root = token(root_rules());
        for resource in Resource::ALL {
            assert!(root.allows(resource, "", Access::Admin));
            assert!(root.allows(resource, "any.name", Access::Admin));
        }
    }

    #[test]
    fn names_and_rules_are_bounded() {
        assert!(validate_token("ci", &root_rules()).is_ok());
        assert!(validate_token("", &[]).is_err());
        assert!(validate_token(&"x".repeat(TOKEN_NAME_BYTES_MAX + 1), &[]).is_err());
        assert!(validate_token("a\nb", &[]).is_err());
        let rule = Rule {
            resource: Resource::Session,
            prefix: "p".repeat(NAME_BYTES_MAX + 1),
            access: Access::Read,
        };
        assert!(validate_token("ci", &[rule]).is_err());
        let many = vec![root_rules()[0].clone(); TOKEN_RULES_MAX + 1];
        assert!(validate_token("ci", &many).is_err());
    }
}
