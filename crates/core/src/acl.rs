//! Access control: tokens, their rules, and the question "may this token do that to this name?".
//!
//! Tokens live in the replicated [`crate::State`], so every node agrees on them and a change needs
//! no restart. A token stores only a hash of its secret: HMAC-SHA256 keyed with the cluster's
//! token salt ([`crate::Command::SetTokenSalt`], drawn once per cluster), so that the stored
//! hashes in a data dir or a backup match no precomputed table and no other cluster's. Tokens
//! created before their cluster had a salt keep the plain SHA-256 they were stored with (the
//! secret is not known afterwards to rehash it); the shell looks a secret up under both. The
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
    /// Work queues, by name.
    Queue,
}

impl Resource {
    /// Every resource, in a fixed order.
    pub const ALL: [Resource; 6] = [
        Resource::Semaphore,
        Resource::Election,
        Resource::Session,
        Resource::Acl,
        Resource::Cluster,
        Resource::Queue,
    ];

    /// The cluster feature version in which the resource appeared: a token with a rule on it
    /// can be written only from that version on.
    pub fn feature_version(self) -> u32 {
        match self {
            Resource::Semaphore
            | Resource::Election
            | Resource::Session
            | Resource::Acl
            | Resource::Cluster => 1,
            Resource::Queue => 4,
        }
    }

    /// The resource's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Semaphore => "semaphore",
            Resource::Election => "election",
            Resource::Session => "session",
            Resource::Acl => "acl",
            Resource::Cluster => "cluster",
            Resource::Queue => "queue",
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
    /// The hash of the secret: HMAC-SHA256 keyed with the cluster's token salt, or, for a token
    /// created before the cluster had a salt, the plain SHA-256 of the secret.
    pub secret_hash: [u8; 32],
    /// The grants. For a resource and name, the rule with the longest matching prefix decides
    /// (as Consul's policies do); no matching rule means no access.
    pub rules: Vec<Rule>,
}

impl Token {
    /// The cluster feature version a command carrying this token needs: the newest resource
    /// its rules name (1 for none).
    pub fn feature_version(&self) -> u32 {
        self.rules.iter().map(|rule| rule.resource.feature_version()).max().unwrap_or(1)
    }

    /// The access this token has to `name` of `resource`: the access of the matching rule with
    /// the longest prefix, or `None`.
    ///
    /// # Examples
    /// ```
    /// use permit_core::{Access, Resource, Rule, Token};
    /// let rule = |prefix: &str, access| Rule { resource: Resource::Semaphore, prefix: prefix.into(), access };
    /// let token = Token {
    ///     name: "ci".into(),
    ///     secret_hash: [0; 32],
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

/// The rules stored with the root token: admin on every name of every resource of feature
/// version 1. The root token is allowed everything by its id, also on resources added later, so
/// that a root made before them needs no new rule, and its bootstrap stays a command that every
/// build decodes.
pub fn root_rules() -> Vec<Rule> {
    Resource::ALL
        .iter()
        .filter(|resource| resource.feature_version() == 1)
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
            || self.token_ids_by_secret.contains_key(&token.secret_hash)
        {
            return Err(Refusal::TokenExists);
        }
        if self.tokens.len() >= TOKENS_MAX {
            return Err(Refusal::LimitExceeded(Limit::Tokens));
        }
        self.root_created |= id == ROOT_TOKEN_ID;
        self.token_ids_by_secret.insert(token.secret_hash, id);
        self.tokens.insert(id, token.clone());
        Ok(Outcome::TokenCreated)
    }

    /// Deletes the token, then closes its sessions: their holds are released and their waits
    /// cancelled as if each session had been closed by its client. Then the objects it created
    /// that nobody holds or waits on any more are deleted; those still in use stay, and no
    /// longer count against any token (they belong to whoever uses them, as objects created
    /// with auth off do).
    pub(crate) fn delete_token(
        &mut self,
        index: u64,
        id: TokenId,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let token = self.tokens.remove(&id).ok_or(Refusal::TokenNotFound)?;
        self.token_ids_by_secret.remove(&token.secret_hash);
        let owned: Vec<SessionId> = if self.sessions_per_owner.contains_key(&id) {
            self.sessions.iter().filter(|(_, s)| s.owner == Some(id)).map(|(sid, _)| *sid).collect()
        } else {
            Vec::new()
        };
        for session in &owned {
            self.remove_session(index, *session, crate::state::SessionEnd::TokenDeleted, effects);
        }
        // The sessions closed above may have removed some of its objects already (idle
        // elections and ephemeral semaphores), which took them out of this index.
        for key in self.created_by.remove(&id).unwrap_or_default() {
            self.creators.remove(&key);
            if self.objects.get(&key).is_some_and(|object| object.is_idle()) {
                self.remove_object(&key, effects);
            }
        }
        Ok(Outcome::TokenDeleted { sessions_closed: owned.len() as u64 })
    }

    /// Sets the token salt of a state that has none, as [`crate::Command::SetTokenSalt`] would
    /// (without a root); false if it has one. Not a command: only for a state that starts a new
    /// cluster (`permit serve --restore` of a backup made before salts, so that the configured
    /// root secret is stored salted), before any replica shares it.
    pub fn install_token_salt(&mut self, salt: [u8; 32]) -> bool {
        self.token_salt.is_none() && self.set_token_salt(salt, None).is_ok()
    }

    /// Makes `secret_hash` the root token's secret: the root token keeps its place with this
    /// secret, or is made again (with the root's rules) if the state has none. Not a command:
    /// only for a state that starts a new cluster (`permit serve --restore` applying the
    /// configured root secret to a backup), before any replica shares it.
    ///
    /// # Errors
    /// [`Refusal::TokenExists`] when another token has this secret; [`Refusal::LimitExceeded`]
    /// when the root must be made again and the state has as many tokens as it may.
    pub fn install_root_secret(&mut self, secret_hash: [u8; 32]) -> Result<(), Refusal> {
        match self.token_ids_by_secret.get(&secret_hash) {
            Some(id) if *id != ROOT_TOKEN_ID => return Err(Refusal::TokenExists),
            _ => {}
        }
        let root = match self.tokens.get(&ROOT_TOKEN_ID) {
            Some(root) => {
                self.token_ids_by_secret.remove(&root.secret_hash);
                Token { secret_hash, ..root.clone() }
            }
            None if self.tokens.len() >= TOKENS_MAX => return Err(Refusal::LimitExceeded(Limit::Tokens)),
            None => Token { name: "root".to_owned(), secret_hash, rules: root_rules() },
        };
        self.token_ids_by_secret.insert(secret_hash, ROOT_TOKEN_ID);
        self.tokens.insert(ROOT_TOKEN_ID, root);
        self.root_created = true;
        Ok(())
    }

    /// The token with this id.
    pub fn token(&self, id: TokenId) -> Option<&Token> {
        self.tokens.get(&id)
    }

    /// The token whose stored secret hash is this, with its id.
    pub fn token_by_secret(&self, secret_hash: &[u8; 32]) -> Option<(TokenId, &Token)> {
        let id = *self.token_ids_by_secret.get(secret_hash)?;
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
        Token { name: "t".into(), secret_hash: [1; 32], rules }
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
        bob_token.secret_hash = [2; 32];
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
        again.secret_hash = [9; 32];
        let outcomes =
            apply(&mut state, vec![crate::Command::CreateToken { id: ROOT_TOKEN_ID, token: again }]);
        assert_eq!(outcomes[0], Outcome::Refused(Refusal::TokenExists));
        assert!(state.root_created());
    }

    #[test]
    fn root_rules_are_admin_of_every_resource_of_version_1() {
        // Resources added later are the root's by its id (the server's authorization), not
        // by a stored rule that older builds could not decode.
        let root = token(root_rules());
        for resource in Resource::ALL.into_iter().filter(|resource| resource.feature_version() == 1) {
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

    #[test]
    fn a_token_creates_at_most_its_cap_of_objects_and_its_deletion_frees_the_unused_ones() {
        use crate::{Command, Creator, Key, Name};
        let mut state = State::default();
        let (alice, bob) = (TokenId::from_bytes([1; 16]), TokenId::from_bytes([2; 16]));
        let mut bob_token = token(root_rules());
        bob_token.secret_hash = [2; 32];
        let name = |text: &str| Name::new(text).unwrap();
        let by = |token, objects_max| Creator { token, objects_max };
        let put = |text: &str, creator| Command::PutSemaphoreBy { name: name(text), capacity: 1, creator };
        let acquire = |key: Key, session: u8, creator, ephemeral| Command::AcquireBy {
            acquire: acquire_one(&key, session),
            ephemeral,
            creator,
        };
        let sem = |text: &str| Key::semaphore(name(text));
        let outcomes = apply(
            &mut state,
            vec![
                Command::CreateToken { id: alice, token: token(root_rules()) },
                Command::CreateToken { id: bob, token: bob_token },
                owned_session(1, alice, 10),
                owned_session(2, bob, 10),
                put("a1", by(alice, 3)),
                put("a2", by(alice, 3)),
                acquire(sem("a3"), 1, by(alice, 3), false),
                // The cap is reached: a fourth creation of any kind is refused...
                put("a4", by(alice, 3)),
                acquire(sem("a4"), 1, by(alice, 3), true),
                acquire(Key::election(name("e")), 1, by(alice, 3), false),
                // ...but using objects that exist is not a creation, nor is setting a capacity.
                put("a1", by(alice, 3)),
                acquire(sem("a1"), 1, by(alice, 3), false),
                // Another token has a cap of its own.
                put("b1", by(bob, 3)),
                acquire(sem("a1"), 2, by(bob, 3), true),
                acquire(sem("a2"), 2, by(bob, 3), true),
            ],
        );
        let limit = Outcome::Refused(Refusal::LimitExceeded(Limit::ObjectsPerToken));
        assert_eq!(outcomes[4..6], [Outcome::SemaphoreCreated, Outcome::SemaphoreCreated]);
        assert!(matches!(outcomes[6], Outcome::Acquired { .. }), "{:?}", outcomes[6]);
        assert_eq!(outcomes[7..10], [limit.clone(), limit.clone(), limit.clone()]);
        assert_eq!(outcomes[10], Outcome::SemaphoreUpdated);
        assert!(matches!(outcomes[11], Outcome::Acquired { .. }));
        assert_eq!(outcomes[12], Outcome::SemaphoreCreated);
        assert!(state.object(&Key::election(name("e"))).is_none() && state.object(&sem("a4")).is_none());
        assert_eq!((state.objects_created_by(alice), state.objects_created_by(bob)), (3, 1));
        // A cap smaller than what the token has: refused too (the flag was lowered).
        let outcomes = apply(&mut state, vec![put("a5", by(alice, 1))]);
        assert_eq!(outcomes[0], limit);
        // Deleting one of its objects frees a place.
        apply(&mut state, vec![Command::Release { key: sem("a2"), session: SessionId::from_bytes([2; 16]) }]);
        let outcomes =
            apply(&mut state, vec![Command::DeleteSemaphore { name: name("a2") }, put("a4", by(alice, 3))]);
        assert_eq!(outcomes, [Outcome::SemaphoreDeleted, Outcome::SemaphoreCreated]);
        let bytes = state.encode_snapshot();
        assert_eq!(State::decode_snapshot(&bytes).unwrap(), state, "creators survive a snapshot");

        // Alice goes: her session's holds end (a3 and a1 held by session 1), then what she made
        // that nobody uses goes (a3, a4); a1, which bob's session holds (granted from the queue
        // when alice's hold ended), stays and counts against nobody.
        let outcomes = apply(&mut state, vec![Command::DeleteToken { id: alice }]);
        assert_eq!(outcomes[0], Outcome::TokenDeleted { sessions_closed: 1 });
        assert!(state.object(&sem("a3")).is_none() && state.object(&sem("a4")).is_none());
        let a1 = state.object(&sem("a1")).expect("in use: kept");
        assert!(a1.holders.contains_key(&SessionId::from_bytes([2; 16])));
        assert_eq!((state.creator_of(&sem("a1")), state.creator_of(&sem("b1"))), (None, Some(bob)));
        assert_eq!((state.objects_created_by(alice), state.objects_created_by(bob)), (0, 1));
        // A deleted token creates nothing.
        assert_eq!(
            apply(&mut state, vec![put("a9", by(alice, 3))])[0],
            Outcome::Refused(Refusal::TokenNotFound)
        );
        state.verify().unwrap();
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
    }

    #[test]
    fn the_token_salt_is_set_once_with_the_root_token_or_not_at_all() {
        use crate::{Command, Creator, Name};
        let mut state = State::default();
        let mut clash = token(vec![]);
        clash.secret_hash = [6; 32];
        let mut root = token(root_rules());
        root.secret_hash = [6; 32];
        let salt = |salt, root| Command::SetTokenSalt { salt, root };
        let by_root = Creator { token: ROOT_TOKEN_ID, objects_max: 1 };
        let put = |name: &str| Command::PutSemaphoreBy {
            name: Name::new(name).unwrap(),
            capacity: 1,
            creator: by_root,
        };
        let outcomes = apply(
            &mut state,
            vec![
                // Before the bootstrap the configured root creates freely, counted against nobody.
                put("early.1"),
                put("early.2"),
                Command::CreateToken { id: TokenId::from_bytes([5; 16]), token: clash },
                // The root cannot be created (its secret is taken): the salt is not set either.
                salt([9; 32], Some(root.clone())),
            ],
        );
        assert_eq!(outcomes[..2], [Outcome::SemaphoreCreated, Outcome::SemaphoreCreated]);
        assert_eq!(outcomes[3], Outcome::Refused(Refusal::TokenExists));
        assert_eq!((state.token_salt(), state.root_created()), (None, false));
        assert_eq!(state.objects_created_by(ROOT_TOKEN_ID), 0);
        root.secret_hash = [4; 32];
        let outcomes = apply(
            &mut state,
            vec![salt([7; 32], Some(root)), salt([8; 32], None), put("late.1"), put("late.2")],
        );
        let limit = Outcome::Refused(Refusal::LimitExceeded(Limit::ObjectsPerToken));
        assert_eq!(
            outcomes,
            [Outcome::TokenSaltSet, Outcome::Refused(Refusal::TokenExists), Outcome::SemaphoreCreated, limit]
        );
        assert_eq!(state.token_salt(), Some(&[7; 32]));
        assert_eq!(state.token_by_secret(&[4; 32]).map(|(id, _)| id), Some(ROOT_TOKEN_ID));
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
        // A cluster with a root but no salt (made before salts) gets one without a root.
        let mut old = State::default();
        let outcomes = apply(
            &mut old,
            vec![Command::CreateToken { id: ROOT_TOKEN_ID, token: token(root_rules()) }, salt([3; 32], None)],
        );
        assert_eq!(outcomes, [Outcome::TokenCreated, Outcome::TokenSaltSet]);
    }

    #[test]
    fn a_restore_installs_the_root_secret_in_place_or_makes_the_root_again() {
        let mut state = State::default();
        let other = TokenId::from_bytes([3; 16]);
        let mut other_token = token(vec![]);
        other_token.secret_hash = [3; 32];
        apply(
            &mut state,
            vec![
                crate::Command::CreateToken { id: ROOT_TOKEN_ID, token: token(root_rules()) },
                crate::Command::CreateToken { id: other, token: other_token },
            ],
        );
        assert!(state.install_token_salt([8; 32]));
        assert!(!state.install_token_salt([9; 32]), "a salt is set once");
        assert_eq!(state.token_salt(), Some(&[8; 32]));
        state.install_root_secret([4; 32]).unwrap();
        assert!(state.token_by_secret(&[1; 32]).is_none(), "the backup's root secret no longer works");
        assert_eq!(state.token_by_secret(&[4; 32]).map(|(id, _)| id), Some(ROOT_TOKEN_ID));
        assert_eq!(state.install_root_secret([3; 32]), Err(Refusal::TokenExists), "another token's secret");
        apply(&mut state, vec![crate::Command::DeleteToken { id: ROOT_TOKEN_ID }]);
        state.install_root_secret([5; 32]).unwrap();
        let (_, root) = state.token_by_secret(&[5; 32]).unwrap();
        assert_eq!(root.rules, root_rules());
        state.verify().unwrap();
    }
}
