//! Whether the request being served long-polls: its duration then goes to the long-poll
//! histogram, not the request latency one. The edge middleware scopes the flag around each
//! request; whatever takes a long-poll place, or forwards one, sets it.

tokio::task_local! {
    /// Set while serving a request that long-polls (it took a long-poll place, or was forwarded
    /// as one).
    pub(super) static LONG_POLL: std::cell::Cell<bool>;
}

/// Marks the request being served as a long-poll (see [`LONG_POLL`]).
pub(crate) fn mark_long_poll() {
    let _ = LONG_POLL.try_with(|flag| flag.set(true));
}
