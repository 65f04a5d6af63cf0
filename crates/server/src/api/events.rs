//! `GET /v1/events`: the node's applied events as Server-Sent Events, from the ring in
//! `observe.rs`. Every node serves it from its own applied state (it is never forwarded); a
//! client resumes with `Last-Event-ID`. The stream takes one of the caller's long-poll places.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use permit_core::EventKind;
use permit_wire::ErrorCode;
use serde::Deserialize;

use super::app::App;
use super::extract::Query;
use crate::auth::{Access, Caller, LongPoll, Resource};
use crate::error::ApiError;
use crate::fanout::{Sight, Subscription};
use crate::observe::Recorded;

/// How often an idle stream sends `: keepalive`.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// Query parameters of the event stream.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsParams {
    /// Only object events whose name starts with this (session events pass only when it is
    /// empty).
    pub(crate) prefix: Option<String>,
    /// Comma-separated kinds to send (default: all): `session_created`, `session_expired`,
    /// `session_closed`, `queued`, `granted`, `released`, `wait_ended`, `expired`, `revoked`,
    /// `capacity_changed`, `leader_changed`, `proclaimed`.
    pub(crate) kinds: Option<String>,
    /// Close the stream after this many milliseconds (default: keep it open until the client or
    /// the node goes away), for clients that read in rounds; resume with `Last-Event-ID`.
    pub(crate) wait_ms: Option<u64>,
}

/// Which events one stream sends.
struct Filter {
    prefix: String,
    kinds: [bool; EventKind::ALL.len()],
    caller: Caller,
}

impl Filter {
    fn parse(params: EventsParams, caller: Caller) -> Result<Filter, ApiError> {
        let mut kinds = [params.kinds.is_none(); EventKind::ALL.len()];
        for name in params.kinds.iter().flat_map(|kinds| kinds.split(',')).filter(|k| !k.is_empty()) {
            let Some(kind) = EventKind::parse(name.trim()) else {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("unknown event kind {name:?}; kinds are {}", kind_names()),
                ));
            };
            kinds[kind_slot(kind)] = true;
        }
        Ok(Filter { prefix: params.prefix.unwrap_or_default(), kinds, caller })
    }

    fn passes(&self, event: &Recorded) -> bool {
        if !self.kinds[kind_slot(event.kind())] {
            return false;
        }
        match (event.key(), event.session_name()) {
            (Some(key), _) => key.name.as_str().starts_with(&self.prefix) && self.caller.reads(key),
            // A session's events, as its listing: to its own token, or with `session` admin.
            (None, name) => self.prefix.is_empty() && self.caller.sees_session(event.session_owner(), name),
        }
    }
}

impl Filter {
    /// What the stream may be sent, for the fan-out index: a superset of what
    /// [`Filter::passes`] lets through, so that a stream is woken for every event it sends
    /// and, as far as its rules tell, for no other.
    fn sight(&self) -> Sight {
        let mut sight = Sight::default();
        let kinds = EventKind::ALL.into_iter().filter(|kind| self.kinds[kind_slot(*kind)]);
        for kind in kinds {
            if kind.is_session() {
                // Session events pass only an empty prefix; then the token's own sessions, and
                // those its `session` admin rules name.
                if !self.prefix.is_empty() {
                    continue;
                }
                match &self.caller {
                    Caller::Anyone => sight.prefixes.push((kind, Resource::Session, String::new())),
                    Caller::Token { id, token } => {
                        sight.owned.push((kind, *id));
                        let admin = token.rules.iter().filter(|rule| {
                            rule.resource == Resource::Session && rule.access == Access::Admin
                        });
                        sight
                            .prefixes
                            .extend(admin.map(|rule| (kind, Resource::Session, rule.prefix.clone())));
                    }
                }
                continue;
            }
            for resource in [Resource::Semaphore, Resource::Election, Resource::Queue] {
                match &self.caller {
                    Caller::Anyone => sight.prefixes.push((kind, resource, self.prefix.clone())),
                    // The root token reads everything, also resources newer than its rules.
                    Caller::Token { id, .. } if *id == permit_core::ROOT_TOKEN_ID => {
                        sight.prefixes.push((kind, resource, self.prefix.clone()))
                    }
                    Caller::Token { token, .. } => {
                        // Every rule grants at least read. A name must start with the stream's
                        // prefix and the rule's: with the longer one, when it extends the other.
                        for rule in token.rules.iter().filter(|rule| rule.resource == resource) {
                            let narrower = if rule.prefix.starts_with(&self.prefix) {
                                &rule.prefix
                            } else if self.prefix.starts_with(&rule.prefix) {
                                &self.prefix
                            } else {
                                continue;
                            };
                            sight.prefixes.push((kind, resource, narrower.clone()));
                        }
                    }
                }
            }
        }
        sight
    }
}

fn kind_slot(kind: EventKind) -> usize {
    EventKind::ALL.iter().position(|k| *k == kind).expect("every kind is in ALL")
}

fn kind_names() -> String {
    EventKind::ALL.map(EventKind::as_str).join(", ")
}

/// The state of one stream between frames.
struct Stream {
    app: Arc<App>,
    filter: Filter,
    /// Seq of the last event taken from the ring.
    last: u64,
    /// Whether the next read takes every event after `last` from the ring (the first one);
    /// later reads start at the first event the stream was woken for.
    catch_up: bool,
    /// Taken, not yet sent.
    pending: VecDeque<Arc<Recorded>>,
    /// A `missed` frame to send first.
    missed: Option<(u64, u64)>,
    /// When the stream ends (`wait_ms`); `None`: never.
    deadline: Option<tokio::time::Instant>,
    /// Where this stream is woken: for the events it may see only (see `fanout`).
    subscription: Subscription,
    /// The caller's long-poll place, held while the stream is open.
    _poll: LongPoll,
}

impl Stream {
    /// The next chunk to send; `None` ends the stream (the node shuts down, or `wait_ms` passed).
    async fn next(&mut self) -> Option<Bytes> {
        if self.deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
            return None;
        }
        if let Some((requested, first)) = self.missed.take() {
            let data = serde_json::json!({ "requested": requested, "first_available": first });
            return Some(Bytes::from(format!("event: missed\ndata: {data}\n\n")));
        }
        let mut shutdown = self.app.shutdown.clone();
        loop {
            while let Some(event) = self.pending.pop_front() {
                if self.filter.passes(&event) {
                    let kind = event.kind().as_str();
                    return Some(Bytes::from(format!(
                        "id: {}\nevent: {kind}\ndata: {}\n\n",
                        event.seq,
                        event.json()
                    )));
                }
            }
            // Nothing before the first event this stream was woken for can pass its filter
            // (streams are woken in seq order, see `fanout::Inbox`): the read starts there, and
            // a stream that was not woken reads nothing. So an idle stream costs no work per
            // event it may not see, and a `missed` frame reports only events it lost.
            let first_unread = self.subscription.inbox().take_first_unread();
            let start = if std::mem::take(&mut self.catch_up) {
                Some(self.last)
            } else {
                (first_unread > 0).then(|| self.last.max(first_unread - 1))
            };
            if let Some(start) = start {
                let since = self.app.observer.ring.since(start, true);
                if let Some(last) = since.events.last() {
                    self.last = last.seq;
                }
                self.pending.extend(since.events);
                if let Some((requested, first)) = since.missed {
                    // A reader too slow for the ring: it is told, as a resuming client would be.
                    let data = serde_json::json!({ "requested": requested, "first_available": first });
                    return Some(Bytes::from(format!("event: missed\ndata: {data}\n\n")));
                }
                if !self.pending.is_empty() {
                    continue;
                }
            }
            if *shutdown.borrow() {
                return None;
            }
            let deadline = self.deadline;
            // The inbox keeps a wake-up that came before this wait.
            let woken = self.subscription.inbox().notify.notified();
            tokio::select! {
                biased;
                () = woken => {}
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => return None,
                () = tokio::time::sleep(KEEPALIVE_INTERVAL) => return Some(Bytes::from_static(b": keepalive\n\n")),
                _ = shutdown.wait_for(|stopping| *stopping) => return None,
            }
        }
    }
}

/// One frame of `GET /v1/events` as an SSE parser reads it (the spec's per-event schema; the
/// server builds frames as text, so this type only documents them).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct EventFrame {
    /// The event's `seq`: resume after it with `Last-Event-ID`.
    id: Option<String>,
    /// The event's kind (`granted`, `released`, ...), or `missed`.
    event: Option<String>,
    /// One line of JSON: the event (`seq`, `index`, `now_ms`, `kind` and the fields that apply),
    /// or `{"requested","first_available"}` in a `missed` frame.
    data: String,
    /// Reconnection delay; never sent by Permit.
    retry: Option<u64>,
}

/// Server-Sent Events of this node's applied state changes (see `docs/observability.md`).
/// Served by every node from its own applied state, never forwarded. Resume with
/// `Last-Event-ID: N`: every event after N still in the ring (the last 10 000), or first an
/// `event: missed` frame `{"requested":N+1,"first_available":M}`. Without it, new events only.
/// Each frame is `id: SEQ`, `event: KIND`, `data: {"seq","index","now_ms","kind",...}`;
/// `: keepalive` comments every 15 s. Takes one of the token's long-poll places. With `--auth`
/// the stream ends when the node applies the token's deletion, or falls out of contact with
/// the cluster.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsParams,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event")),
    responses((status = 200, content_type = "text/event-stream", body = EventFrame,
            description = "An endless stream of `id:`/`event:`/`data:` frames; the schema is one frame's"),
        (status = 400, body = permit_wire::ErrorBody, description = "`invalid_argument`: an unknown kind")))]
pub(crate) async fn events(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    Query(params): Query<EventsParams>,
) -> Result<Response, ApiError> {
    // A wait too long to add to the clock is no deadline at all.
    let deadline =
        params.wait_ms.and_then(|ms| tokio::time::Instant::now().checked_add(Duration::from_millis(ms)));
    let filter = Filter::parse(params, caller.clone())?;
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(value) => {
            Some(value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()).ok_or_else(|| {
                ApiError::new(ErrorCode::InvalidArgument, "Last-Event-ID must be an event's seq (a number)")
            })?)
        }
    };
    let poll = caller.long_poll(&app).await?;
    let ring = &app.observer.ring;
    // Registered before `last` is read: every event after it wakes the stream if it may see it.
    let subscription = ring.fanout.subscribe(filter.sight());
    let (last, missed) = match resume {
        None => (ring.last_seq(), None),
        Some(last) => match ring.since(last, true).missed {
            // Stream the ring from its first event, after the `missed` frame.
            Some((requested, first)) => (first.saturating_sub(1), Some((requested, first))),
            None => (last, None),
        },
    };
    let cut_off = {
        let app = app.clone();
        async move { caller.cut_off(&app, true).await }
    };
    let stream = Stream {
        app,
        filter,
        last,
        catch_up: true,
        pending: VecDeque::new(),
        missed,
        deadline,
        subscription,
        _poll: poll,
    };
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), stream))
    });
    // The stream closes as soon as this node applies the deletion of its token, or falls out of
    // contact with the cluster (then it no longer learns of deletions).
    let body = futures::StreamExt::take_until(body, cut_off);
    let mut response = Body::from_stream(body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use permit_core::{Event, Key, Kind, Name, Rule, SessionId, Token, TokenId};

    use super::*;
    use crate::fanout::Fanout;

    fn token(id: u8, rules: &[(Resource, &str, Access)]) -> Caller {
        let rules = rules
            .iter()
            .map(|(resource, prefix, access)| Rule {
                resource: *resource,
                prefix: (*prefix).into(),
                access: *access,
            })
            .collect();
        let token = Token { name: format!("t{id}"), secret_hash: [id; 32], rules };
        Caller::Token { id: TokenId::from_bytes([id; 16]), token }
    }

    /// Every event of each kind on a few names, and session events of a few names and owners.
    fn events() -> Vec<Event> {
        let mut events = Vec::new();
        for kind in EventKind::ALL {
            if kind.is_session() {
                for name in [None, Some("a.w"), Some("b.w")] {
                    for owner in [None, Some(1), Some(2), Some(3)] {
                        events.push(Event {
                            session: Some(SessionId::from_bytes([9; 16])),
                            session_name: name.map(str::to_owned),
                            session_owner: owner.map(|id| TokenId::from_bytes([id; 16])),
                            ..Event::new(kind)
                        });
                    }
                }
                continue;
            }
            for object in [Kind::Semaphore, Kind::Election] {
                for name in ["a", "a.x", "a.xy", "ab", "b.y"] {
                    let key = Key { kind: object, name: Name::new(name).expect("a valid name") };
                    events.push(Event { key: Some(key), ..Event::new(kind) });
                }
            }
        }
        events
    }

    /// A stream must be woken for every event its filter lets through, or it would never send
    /// it: the fan-out index is a superset of the filter, for every kind of caller and filter.
    #[test]
    fn a_stream_is_woken_for_every_event_its_filter_passes() {
        use Access::{Admin, Read, Write};
        use Resource::{Election, Semaphore, Session};
        let callers = [
            Caller::Anyone,
            token(1, &[(Semaphore, "a.", Read)]),
            token(2, &[(Semaphore, "", Write), (Election, "a", Admin), (Session, "a.", Admin)]),
            token(3, &[(Session, "", Write)]),
            token(
                4,
                &[
                    (Semaphore, "a.x", Read),
                    (Semaphore, "a.", Write),
                    (Session, "", Admin),
                    (Session, "b", Write),
                ],
            ),
        ];
        let fanout = Arc::new(Fanout::default());
        let events = events();
        let mut checked = 0;
        for caller in &callers {
            for prefix in ["", "a", "a.x", "b"] {
                for kinds in [None, Some("granted"), Some("session_created,leader_changed,session_closed")] {
                    let params = EventsParams {
                        prefix: Some(prefix.into()),
                        kinds: kinds.map(Into::into),
                        wait_ms: None,
                    };
                    let filter = Filter::parse(params, caller.clone()).expect("a valid filter");
                    let subscription = fanout.subscribe(filter.sight());
                    for (seq, event) in (1..).zip(&events) {
                        let before = subscription.inbox().wakeups();
                        fanout.deliver(seq, event);
                        let woken = subscription.inbox().wakeups() > before;
                        let passes = filter.passes(&Recorded::for_test(seq, event.clone()));
                        assert!(
                            woken || !passes,
                            "{caller:?} prefix {prefix:?} kinds {kinds:?}: not woken for {event:?}"
                        );
                        checked += usize::from(passes);
                    }
                }
            }
        }
        assert!(checked > 500, "the filters let through {checked} events");
        assert!(fanout.is_empty(), "every stream unregistered");
    }
}
