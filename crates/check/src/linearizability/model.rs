//! The sequential model of one semaphore with try-acquires, long-lived sessions and tokens.

/// A session, interned to a small number per partition.
pub(crate) type SessionIndex = u32;

/// What an op asked, in model terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Acquire { session: SessionIndex, permits: u64 },
    Release { session: SessionIndex },
    Close { session: SessionIndex },
    Describe,
    Validate { token: u64 },
}

/// What an op answered, in model terms. Ops whose answer constrains nothing and changes
/// nothing (failed reads, failed releases, acquires refused for another reason than
/// `unavailable`) never reach the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Return {
    /// No answer: the op may take effect, or not.
    Unknown,
    Granted {
        token: u64,
    },
    Unavailable,
    Released {
        permits: Option<u64>,
    },
    Closed,
    /// Sorted by session.
    Holders(Vec<(SessionIndex, u64, u64)>),
    Valid(bool),
}

/// One op of a partition, ready for the search.
#[derive(Clone, Debug)]
pub(crate) struct ModelOp {
    pub invoke_ns: u64,
    /// `None` for an op that never answered: it may linearize any time after its invoke, or
    /// never.
    pub complete_ns: Option<u64>,
    pub call: Call,
    pub ret: Return,
}

/// One holder. An unknown acquire that linearizes as a grant holds an unknown token (`None`),
/// which the first describe or validate that shows it pins down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Hold {
    pub session: SessionIndex,
    pub permits: u64,
    pub token: Option<u64>,
}

/// The semaphore's state: its holds sorted by session, and the largest token granted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub holds: Vec<Hold>,
    pub max_token: u64,
}

impl State {
    fn position(&self, session: SessionIndex) -> Result<usize, usize> {
        self.holds.binary_search_by_key(&session, |hold| hold.session)
    }

    fn free(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.holds.iter().map(|hold| hold.permits).sum())
    }

    fn with_hold(&self, at: usize, hold: Hold) -> State {
        let mut next = self.clone();
        next.holds.insert(at, hold);
        next.max_token = next.max_token.max(hold.token.unwrap_or(0));
        next
    }

    fn without_hold(&self, at: usize) -> State {
        let mut next = self.clone();
        next.holds.remove(at);
        next
    }

    fn with_token(&self, at: usize, token: u64) -> State {
        let mut next = self.clone();
        next.holds[at].token = Some(token);
        next.max_token = next.max_token.max(token);
        next
    }
}

/// Every state `op` can lead to from `state`: empty when it cannot linearize here; more than
/// one only when an unknown token may be pinned down in several ways.
pub(crate) fn step(capacity: u64, state: &State, op: &ModelOp) -> Vec<State> {
    match (&op.call, &op.ret) {
        (&Call::Acquire { session, permits }, ret) => acquire(capacity, state, session, permits, ret),
        (Call::Release { session } | Call::Close { session }, ret) => release(state, *session, ret),
        (Call::Describe, Return::Holders(holders)) => describe(state, holders).into_iter().collect(),
        (&Call::Validate { token }, &Return::Valid(valid)) => validate(state, token, valid),
        _ => Vec::new(),
    }
}

fn acquire(capacity: u64, state: &State, session: SessionIndex, permits: u64, ret: &Return) -> Vec<State> {
    let held = state.position(session);
    let fits = state.free(capacity) >= permits;
    let next = match (ret, held) {
        // An idempotent repeat answers the existing grant.
        (&Return::Granted { token }, Ok(at)) if state.holds[at].permits == permits => {
            match state.holds[at].token {
                Some(held_token) => (held_token == token).then(|| state.clone()),
                None => pinned(state, at, token),
            }
        }
        (&Return::Granted { token }, Err(at)) if fits && token > state.max_token => {
            Some(state.with_hold(at, Hold { session, permits, token: Some(token) }))
        }
        (Return::Unavailable, Err(_)) if !fits => Some(state.clone()),
        // An unknown acquire matters only when it grants; not granting is not linearizing it.
        (Return::Unknown, Err(at)) if fits => {
            Some(state.with_hold(at, Hold { session, permits, token: None }))
        }
        _ => None,
    };
    next.into_iter().collect()
}

fn release(state: &State, session: SessionIndex, ret: &Return) -> Vec<State> {
    let held = state.position(session);
    let next = match (ret, held) {
        (Return::Released { permits }, Ok(at)) => {
            permits.is_none_or(|permits| permits == state.holds[at].permits).then(|| state.without_hold(at))
        }
        (Return::Released { permits }, Err(_)) => {
            permits.is_none_or(|permits| permits == 0).then(|| state.clone())
        }
        (Return::Closed | Return::Unknown, Ok(at)) => Some(state.without_hold(at)),
        (Return::Closed, Err(_)) => Some(state.clone()),
        _ => None,
    };
    next.into_iter().collect()
}

fn describe(state: &State, holders: &[(SessionIndex, u64, u64)]) -> Option<State> {
    if holders.len() != state.holds.len() {
        return None;
    }
    let mut next = state.clone();
    for (at, &(session, permits, token)) in holders.iter().enumerate() {
        let hold = state.holds[at];
        if hold.session != session || hold.permits != permits || hold.token.is_some_and(|held| held != token)
        {
            return None;
        }
        if hold.token.is_none() {
            next = pinned(&next, at, token)?;
        }
    }
    Some(next)
}

fn validate(state: &State, token: u64, valid: bool) -> Vec<State> {
    let known = state.holds.iter().any(|hold| hold.token == Some(token));
    match (valid, known) {
        (true, true) | (false, false) => vec![state.clone()],
        (false, true) => Vec::new(),
        (true, false) => (0..state.holds.len())
            .filter(|&at| state.holds[at].token.is_none())
            .filter_map(|at| pinned(state, at, token))
            .collect(),
    }
}

/// Pins an unknown token down, unless another hold already carries it.
fn pinned(state: &State, at: usize, token: u64) -> Option<State> {
    let taken = state.holds.iter().any(|hold| hold.token == Some(token));
    (!taken).then(|| state.with_token(at, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Call, ret: Return) -> ModelOp {
        ModelOp { invoke_ns: 0, complete_ns: Some(1), call, ret }
    }

    #[test]
    fn grants_only_what_fits_with_a_larger_token() {
        let empty = State::default();
        let grant = op(Call::Acquire { session: 0, permits: 2 }, Return::Granted { token: 5 });
        let held = step(2, &empty, &grant);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].max_token, 5);
        let other = op(Call::Acquire { session: 1, permits: 1 }, Return::Granted { token: 6 });
        assert!(step(2, &held[0], &other).is_empty(), "over capacity");
        let stale = op(Call::Acquire { session: 1, permits: 1 }, Return::Granted { token: 4 });
        assert!(step(3, &held[0], &stale).is_empty(), "token not above the largest");
        let refused = op(Call::Acquire { session: 1, permits: 1 }, Return::Unavailable);
        assert_eq!(step(2, &held[0], &refused), vec![held[0].clone()]);
        assert!(step(3, &held[0], &refused).is_empty(), "refused although it fits");
        assert_eq!(step(2, &held[0], &grant), vec![held[0].clone()], "idempotent repeat");
    }

    #[test]
    fn an_unknown_grant_is_pinned_by_the_first_read_that_shows_it() {
        let unknown = op(Call::Acquire { session: 0, permits: 1 }, Return::Unknown);
        let held = step(1, &State::default(), &unknown).remove(0);
        assert_eq!(held.holds[0].token, None);
        let read = op(Call::Describe, Return::Holders(vec![(0, 1, 9)]));
        let pinned = step(1, &held, &read).remove(0);
        assert_eq!((pinned.holds[0].token, pinned.max_token), (Some(9), 9));
        let check = op(Call::Validate { token: 9 }, Return::Valid(true));
        assert_eq!(step(1, &held, &check), vec![pinned.clone()]);
        let release = op(Call::Release { session: 0 }, Return::Released { permits: Some(1) });
        assert!(step(1, &pinned, &release)[0].holds.is_empty());
    }
}
