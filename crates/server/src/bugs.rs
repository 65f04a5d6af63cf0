//! Known bugs that the fault suite's self-test injects, to prove that its checkers catch them.
//!
//! Compiled in only with the `bug-injection` feature (test builds); a bug is chosen at start by
//! `PERMIT_INJECT_BUG=<name>`. Without the feature [`active`] is always `None` and every hook
//! compiles away. `crates/permit/tests/tidy.rs` checks that a normal build of `permit` never
//! enables the feature, and that a release binary (`PERMIT_RELEASE_BIN`) names none of the bugs.

/// An injectable bug.
/// Without the feature no bug is ever active: the variants are only matched, never built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "bug-injection"), allow(dead_code))]
pub(crate) enum Bug {
    /// Answer an acquire as granted before its command is committed.
    AckBeforeCommit,
    /// Never expire sessions: a crashed holder's permits never come back.
    IgnoreTtl,
    /// Answer tokens that do not grow.
    NonMonotonicToken,
    /// Expire sessions at half their TTL.
    EarlyExpiry,
    /// Serve reads and validations from local state without confirming leadership, and never
    /// forward them.
    StaleReads,
    /// Answer a queue item's ack as done without proposing it: the item stays claimed, and is
    /// handed out again when its session ends.
    LostAck,
    /// Not a bug: every snapshot's encoding takes [`SLOW_SNAPSHOT_ENCODE`] longer, so that a test
    /// can show that writes keep flowing while a snapshot is encoded.
    SlowSnapshotEncode,
    /// Not a bug: `POST /v1/sessions/keepalive` answers 405 `method_not_allowed`, as servers
    /// older than the route do, so that a test can show the client falling back to one
    /// keepalive per session.
    NoKeepaliveBatch,
    /// Not a bug: the node speaks feature version 1, as builds from before versioning do, so
    /// that tests can run a mixed-version cluster and a downgrade without an older build.
    SpeaksVersion1,
}

/// How much longer a snapshot's encoding takes under [`Bug::SlowSnapshotEncode`].
pub(crate) const SLOW_SNAPSHOT_ENCODE: std::time::Duration = std::time::Duration::from_secs(2);

impl Bug {
    /// Every bug, with its name in `PERMIT_INJECT_BUG`.
    #[cfg(feature = "bug-injection")]
    const ALL: [(&'static str, Bug); 9] = [
        ("ack_before_commit", Bug::AckBeforeCommit),
        ("ignore_ttl", Bug::IgnoreTtl),
        ("non_monotonic_token", Bug::NonMonotonicToken),
        ("early_expiry", Bug::EarlyExpiry),
        ("stale_reads", Bug::StaleReads),
        ("slow_snapshot_encode", Bug::SlowSnapshotEncode),
        ("no_keepalive_batch", Bug::NoKeepaliveBatch),
        ("speaks_version_1", Bug::SpeaksVersion1),
        ("lost_ack", Bug::LostAck),
    ];
}

/// The bug injected into this process, if any.
#[cfg(feature = "bug-injection")]
pub(crate) fn active() -> Option<Bug> {
    static ACTIVE: std::sync::OnceLock<Option<Bug>> = std::sync::OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let name = std::env::var("PERMIT_INJECT_BUG").ok()?;
        let bug = Bug::ALL.iter().find(|(n, _)| *n == name).map(|(_, bug)| *bug);
        match bug {
            Some(bug) => tracing::warn!(?bug, "BUG INJECTED for a fault-suite self-test"),
            None => panic!("PERMIT_INJECT_BUG={name} is not a known bug"),
        }
        bug
    })
}

/// The bug injected into this process, if any.
#[cfg(not(feature = "bug-injection"))]
pub(crate) const fn active() -> Option<Bug> {
    None
}

/// Whether `bug` is injected.
pub(crate) fn is(bug: Bug) -> bool {
    active() == Some(bug)
}
