//! The Rust client (`permit-client`) against a real `permit serve` process.

mod common;

use std::future::Future;
use std::time::Duration;

use permit_client::{AcquireOptions, Client, Error, ErrorCode, SessionState};
use tokio::time::Instant;

use crate::common::Server;

/// Longest any single test step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test if it takes longer than `STEP_TIMEOUT`.
async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP_TIMEOUT, future).await.unwrap_or_else(|_| panic!("{what}: timed out"))
}

fn client(server: &Server) -> Client {
    Client::new(&server.url).expect("client")
}

/// Permits held and waiters queued on `name`.
async fn occupancy(client: &Client, name: &str) -> (u64, usize) {
    let view = client.get_semaphore(name).await.expect("semaphore view");
    (view.held, view.waiters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_keeps_a_short_ttl_session_alive() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_millis(300)).await.unwrap();
    let mut state = session.watch_state();
    let started = Instant::now();
    // Outlive the TTL several times over; the state must never leave Alive for Expired.
    while started.elapsed() < Duration::from_millis(1200) {
        tokio::select! {
            changed = state.changed() => changed.expect("keepalive task alive"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert_ne!(*state.borrow(), SessionState::Expired, "expired after {:?}", started.elapsed());
    }
    assert_eq!(session.state(), SessionState::Alive);
    client.get_session(session.id()).await.expect("the server still knows the session");
    assert!(session.deadline() > Instant::now(), "the conservative deadline is in the future");
    assert!(session.deadline() <= Instant::now() + Duration::from_millis(300), "and at most one TTL away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_acquire_hands_over_between_sessions() {
    let server = Server::start();
    let client = client(&server);
    client.put_semaphore("handover", 1).await.unwrap();
    let first = client.session(Duration::from_secs(10)).await.unwrap();
    let second = client.session(Duration::from_secs(10)).await.unwrap();
    let held = bounded("first acquire", first.acquire("handover", 1)).await.unwrap();

    let waiting = tokio::spawn(async move { second.acquire("handover", 1).await });
    let queued =
        common::eventually(STEP_TIMEOUT, async || occupancy(&client, "handover").await == (1, 1)).await;
    assert!(queued, "the second session queues behind the first");
    assert!(!waiting.is_finished(), "and does not get the permit while the first holds it");

    let first_token = held.token();
    held.release().await.unwrap();
    let granted = bounded("second acquire", waiting).await.unwrap().unwrap();
    assert!(granted.token() > first_token, "tokens increase: {} then {}", first_token, granted.token());
    let view = client.get_semaphore("handover").await.unwrap();
    assert_eq!(view.holders.len(), 1);
    assert_eq!(view.holders[0].session, granted.session().id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_returns_none_when_full() {
    let server = Server::start();
    let client = client(&server);
    let first = client.session(Duration::from_secs(10)).await.unwrap();
    let second = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions { capacity: Some(3), ..AcquireOptions::default() };
    let _held = first.acquire_with("full", 2, &options).await.unwrap().expect("granted");

    assert!(second.try_acquire("full", 2).await.unwrap().is_none(), "2 of the 1 free permits");
    assert_eq!(occupancy(&client, "full").await, (2, 0), "a failed try queues nothing");
    let one = second.try_acquire("full", 1).await.unwrap().expect("1 permit is free");
    assert_eq!(one.permits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_cancels_the_wait() {
    let server = Server::start();
    let client = client(&server);
    client.put_semaphore("busy", 1).await.unwrap();
    let holder = client.session(Duration::from_secs(10)).await.unwrap();
    let waiter = client.session(Duration::from_secs(10)).await.unwrap();
    let _held = holder.acquire("busy", 1).await.unwrap();

    let started = Instant::now();
    let answer =
        bounded("acquire_timeout", waiter.acquire_timeout("busy", 1, Duration::from_millis(300))).await;
    assert!(answer.unwrap().is_none(), "timed out");
    assert!(started.elapsed() >= Duration::from_millis(300), "waited the whole timeout");
    assert_eq!(occupancy(&client, "busy").await, (1, 0), "no waiter is left behind");
    assert!(client.get_session(waiter.id()).await.unwrap().waits.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_acquire_future_gives_up_the_queue_place() {
    let server = Server::start();
    let client = client(&server);
    client.put_semaphore("abandoned", 1).await.unwrap();
    let holder = client.session(Duration::from_secs(10)).await.unwrap();
    let waiter = client.session(Duration::from_secs(10)).await.unwrap();
    let _held = holder.acquire("abandoned", 1).await.unwrap();

    let mut acquire = Box::pin(waiter.acquire("abandoned", 1));
    let queued = tokio::select! {
        _ = &mut acquire => panic!("granted while held"),
        queued = common::eventually(STEP_TIMEOUT, async || occupancy(&client, "abandoned").await == (1, 1)) => queued,
    };
    assert!(queued, "the waiter queued");
    drop(acquire);
    let left =
        common::eventually(STEP_TIMEOUT, async || occupancy(&client, "abandoned").await == (1, 0)).await;
    assert!(left, "dropping the future cancelled the wait on the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_permit_releases_it() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    // Kept, so that its occupancy can be read after the release.
    let options = AcquireOptions { capacity: Some(2), ephemeral: false, ..AcquireOptions::default() };
    let permit = session.acquire_with("dropped", 2, &options).await.unwrap().expect("granted");
    assert_eq!(occupancy(&client, "dropped").await, (2, 0));
    drop(permit);
    let released =
        common::eventually(STEP_TIMEOUT, async || occupancy(&client, "dropped").await == (0, 0)).await;
    assert!(released, "the drop released the permits in the background");
    assert_eq!(session.state(), SessionState::Alive, "the session outlives the permit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_server_forgets_the_session() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_millis(300)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let permit = session.acquire_with("forgotten", 1, &options).await.unwrap().expect("granted");
    assert!(permit.is_valid_locally());

    // Another client closes the session: the next keepalive is answered session_not_found.
    Client::new(&server.url).unwrap().close_session(session.id()).await.unwrap();
    bounded("lost", permit.lost()).await;
    assert_eq!(session.state(), SessionState::Expired);
    assert!(!permit.is_valid_locally());
    let error = session.acquire("forgotten", 1).await.unwrap_err();
    assert!(matches!(error, Error::SessionExpired), "{error:?}");
    assert_eq!(error.code(), Some(ErrorCode::SessionNotFound));
    permit.release().await.expect("releasing a hold gone with its session is not an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expires_locally_by_its_conservative_deadline_when_the_server_is_unreachable() {
    let mut server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_millis(400)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let permit = session.acquire_with("paused", 1, &options).await.unwrap().expect("granted");
    let mut state = session.watch_state();

    server.pause();
    let jeopardy = bounded("jeopardy", state.wait_for(|s| *s != SessionState::Alive)).await.map(|s| *s);
    assert_eq!(jeopardy.unwrap(), SessionState::Jeopardy, "a failed keepalive puts the session in jeopardy");
    // No keepalive can be acknowledged from here on, so the deadline no longer moves.
    let deadline = permit.deadline();
    bounded("lost", permit.lost()).await;
    let lost_at = Instant::now();
    server.resume();
    assert!(lost_at >= deadline, "lost no earlier than the deadline known when the server stopped");
    assert!(
        lost_at < deadline + Duration::from_millis(300),
        "and promptly after it: {:?} late",
        lost_at - deadline
    );
    assert_eq!(session.state(), SessionState::Expired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_max_hold_passes() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions {
        capacity: Some(1),
        max_hold: Some(Duration::from_millis(300)),
        ephemeral: false,
        ..AcquireOptions::default()
    };
    let sent = Instant::now();
    let permit = session.acquire_with("capped", 1, &options).await.unwrap().expect("granted");
    let granted = Instant::now();
    assert!(permit.deadline() >= sent + Duration::from_millis(300));
    assert!(permit.deadline() <= granted + Duration::from_millis(300), "counted from before the grant");
    bounded("lost", permit.lost()).await;
    assert!(!permit.is_valid_locally());
    let freed = common::eventually(STEP_TIMEOUT, async || occupancy(&client, "capped").await.0 == 0).await;
    assert!(freed, "the server released the hold after max_hold");
    assert_eq!(session.state(), SessionState::Alive, "the session lives on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_releases_its_holds() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ephemeral: false, ..AcquireOptions::default() };
    let permit = session.acquire_with("closed", 1, &options).await.unwrap().expect("granted");
    let id = session.id().to_owned();
    session.clone().close().await.unwrap();
    assert_eq!(session.state(), SessionState::Expired);
    bounded("lost", permit.lost()).await;
    assert_eq!(occupancy(&client, "closed").await, (0, 0));
    let error = client.get_session(&id).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::SessionNotFound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_session_handle_closes_it() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(60)).await.unwrap();
    let id = session.id().to_owned();
    drop(session);
    let closed = common::eventually(STEP_TIMEOUT, async || {
        matches!(client.get_session(&id).await, Err(error) if error.code() == Some(ErrorCode::SessionNotFound))
    })
    .await;
    assert!(closed, "the session was closed long before its 60 s TTL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_campaign_resign_and_observe() {
    let server = Server::start();
    let client = client(&server);
    assert_eq!(client.leader("scheduler").await.unwrap(), None, "nobody leads a new election");
    let first = client.session(Duration::from_secs(10)).await.unwrap();
    let second = client.session(Duration::from_secs(10)).await.unwrap();
    let leading = bounded("first campaign", first.campaign("scheduler", "node-a")).await.unwrap();
    let leader = client.leader("scheduler").await.unwrap().expect("a leader");
    assert_eq!((leader.value.as_str(), leader.token), ("node-a", leading.token()));
    assert_eq!(leader.session, first.id());

    let none = second.campaign_timeout("scheduler", "node-b", Duration::ZERO).await.unwrap();
    assert!(none.is_none(), "a try while someone leads");
    let campaign = tokio::spawn(async move { second.campaign("scheduler", "node-b").await });
    let queued = common::eventually(STEP_TIMEOUT, async || {
        client.get_election("scheduler").await.unwrap().candidates == 1
    })
    .await;
    assert!(queued, "the second candidate waits");

    let watched_from = client.get_election("scheduler").await.unwrap().index;
    let watch = client.watch_election("scheduler", watched_from, Duration::from_secs(10));
    let first_token = leading.token();
    leading.resign().await.unwrap();
    let changed = bounded("watch", watch).await.unwrap();
    assert!(changed.index > watched_from, "the watch returns on the change");
    let next = bounded("second campaign", campaign).await.unwrap().unwrap();
    assert!(next.token() > first_token);
    let leader = client.leader("scheduler").await.unwrap().expect("a leader");
    assert_eq!((leader.value.as_str(), leader.token), ("node-b", next.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_accepts_only_the_current_holders_token() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let permit = session.acquire_with("fenced", 1, &options).await.unwrap().expect("granted");
    let token = permit.token();
    let valid = client.validate("fenced", token).await.unwrap();
    assert!(valid.valid);
    assert_eq!(valid.session.as_deref(), Some(session.id()));
    permit.release().await.unwrap();
    assert!(!client.validate("fenced", token).await.unwrap().valid, "a released token is stale");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_semaphore_returns_when_it_changes() {
    let server = Server::start();
    let client = client(&server);
    let view = client.put_semaphore("watched", 2).await.unwrap();
    let watcher = client.clone();
    // The longest wait there is, past STEP_TIMEOUT: only the change can end it in time.
    let wait = Duration::from_millis(permit_wire::WAIT_MS_MAX);
    let watch = tokio::spawn(async move { watcher.watch_semaphore("watched", view.index, wait).await });
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let _permit = session.acquire("watched", 1).await.unwrap();
    let changed =
        bounded("watch (returned on the change, not at the end of the wait)", watch).await.unwrap().unwrap();
    assert!(changed.index > view.index);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refusals_are_typed_errors() {
    let server = Server::start();
    let client = client(&server);
    fn code<T: std::fmt::Debug>(result: Result<T, Error>) -> Option<ErrorCode> {
        result.unwrap_err().code()
    }
    assert_eq!(code(client.get_semaphore("missing").await), Some(ErrorCode::SemaphoreNotFound));
    assert_eq!(code(client.get_semaphore("bad/name").await), Some(ErrorCode::InvalidName));
    assert_eq!(code(client.put_semaphore("zero", 0).await), Some(ErrorCode::InvalidArgument));
    assert_eq!(code(client.keepalive(&"0".repeat(32)).await), Some(ErrorCode::SessionNotFound));

    let session = client.session(Duration::from_secs(10)).await.unwrap();
    client.put_semaphore("small", 2).await.unwrap();
    assert_eq!(code(session.acquire("small", 3).await), Some(ErrorCode::PermitsExceedCapacity));
    let _held = session.acquire("small", 1).await.unwrap();
    assert_eq!(code(client.delete_semaphore("small").await), Some(ErrorCode::SemaphoreBusy));
    let error = client.delete_semaphore("small").await.unwrap_err();
    assert!(matches!(&error, Error::Api { status: 409, .. }), "{error:?}");
    assert!(!error.is_outcome_unknown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_over_to_a_reachable_endpoint() {
    let server = Server::start();
    // A port that refuses connections: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let client = Client::with_endpoints([format!("http://{closed}"), server.url.clone()]).unwrap();
    let session = bounded("session", client.session(Duration::from_secs(10))).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let permit = bounded("acquire", session.acquire_with("failover", 1, &options)).await.unwrap();
    assert!(permit.is_some());
    assert_eq!(client.health().await.unwrap().status, "ok");

    let unreachable = Client::new(&format!("http://{closed}")).unwrap();
    let error = bounded("unreachable", unreachable.health()).await.unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_endpoints_are_refused_before_sending() {
    for url in ["ftp://127.0.0.1:7376", "http://127.0.0.1:7376/v1", "http://", ""] {
        let error = Client::new(url).unwrap_err();
        assert!(matches!(error, Error::InvalidEndpoint { .. }), "{url:?}: {error:?}");
    }
    assert!(Client::with_endpoints(Vec::<String>::new()).is_err());
    assert_eq!(Client::new("127.0.0.1:7376").unwrap().endpoints(), ["http://127.0.0.1:7376"]);
}

/// The sum of the series of `/metrics` whose line starts with `prefix` and contains `filter`.
async fn metric_sum(url: &str, prefix: &str, filter: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|line| line.starts_with(prefix) && line.contains(filter))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_of_one_client_share_their_keepalive_requests() {
    let server = Server::start();
    let client = client(&server);
    let ttl = Duration::from_millis(300);
    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(bounded("session", client.session(ttl)).await.unwrap());
    }
    // A session nobody keeps alive, as the control.
    let request = permit_client::wire::CreateSessionRequest { ttl_ms: Some(300), name: None };
    let control = client.create_session(&request).await.unwrap();
    let mut states: Vec<_> = sessions.iter().map(|session| session.watch_state()).collect();
    let started = Instant::now();
    while started.elapsed() < ttl * 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for (state, session) in states.iter_mut().zip(&sessions) {
            assert_eq!(
                *state.borrow_and_update(),
                SessionState::Alive,
                "{} after {:?}",
                session.id(),
                started.elapsed()
            );
        }
    }
    let elapsed = started.elapsed();
    for session in &sessions {
        client.get_session(session.id()).await.expect("the server still knows the session");
        assert!(session.deadline() > Instant::now());
    }
    let gone = client.get_session(&control.id).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::SessionNotFound), "the unrenewed control session expired");
    let requests = metric_sum(&server.url, "permit_http_requests_total{", "keepalive\"").await;
    let renewed = metric_sum(&server.url, "permit_session_keepalives_total", "").await;
    // Alone, each session would have sent one request per third of a TTL.
    let periods = (elapsed.as_secs_f64() / (ttl.as_secs_f64() / 3.0)).floor();
    let alone = periods * sessions.len() as f64;
    assert!(renewed >= alone / 2.0, "{renewed} renewals in {periods} periods: keepalives were not sent");
    assert!(
        requests > 0.0 && requests * 2.0 < alone,
        "{requests} keepalive requests for {alone} session periods"
    );
    assert!(renewed >= 2.0 * requests, "{renewed} renewals in {requests} requests: not coalesced");
    let single =
        metric_sum(&server.url, "permit_http_requests_total{", "/v1/sessions/{id}/keepalive\"").await;
    assert_eq!(single, 0.0, "every keepalive went through the batch route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_fall_back_to_one_keepalive_each_on_a_server_without_the_batch_route() {
    let dir = tempfile::tempdir().unwrap();
    // The server answers the batch route 405, as servers older than it do.
    let server = Server::start_with_env(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[],
        &[("PERMIT_INJECT_BUG", "no_keepalive_batch")],
    );
    let client = client(&server);
    let ttl = Duration::from_millis(300);
    let (a, b) = (client.session(ttl).await.unwrap(), client.session(ttl).await.unwrap());
    let started = Instant::now();
    while started.elapsed() < ttl * 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            (a.state(), b.state()),
            (SessionState::Alive, SessionState::Alive),
            "after {:?}",
            started.elapsed()
        );
    }
    client.get_session(a.id()).await.expect("a lives");
    client.get_session(b.id()).await.expect("b lives");
    let single =
        metric_sum(&server.url, "permit_http_requests_total{", "/v1/sessions/{id}/keepalive\"").await;
    let batched = metric_sum(&server.url, "permit_http_requests_total{", "/v1/sessions/keepalive\"").await;
    assert!(single >= 8.0, "{single} single keepalives for 2 sessions over 4 TTLs");
    assert!(
        (1.0..=2.0).contains(&batched),
        "{batched} batch requests: the client gave the route up after its 405"
    );
}

/// Finding (issue 29): the server answers a repeated acquire with the grant the session has, so
/// a client that made a second guard for it let the inner guard's release end the hold the outer
/// one still guarded, and another session took the lock. A second acquire (or campaign) of a
/// name the session holds, or is acquiring, now fails at once; the outer hold is never freed by
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_acquire_of_a_held_name_fails_and_never_frees_the_outer_hold() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let other = client.session(Duration::from_secs(10)).await.unwrap();
    for name in ["lock.reentry", "lock.queued"] {
        client.put_semaphore(name, 1).await.unwrap();
    }
    let outer = bounded("outer acquire", session.acquire("lock.reentry", 1)).await.unwrap();
    for attempt in [
        bounded("inner acquire", session.acquire("lock.reentry", 1)).await.map(|_| ()),
        bounded("inner try", session.try_acquire("lock.reentry", 1)).await.map(|_| ()),
    ] {
        assert!(
            matches!(attempt, Err(Error::AlreadyHeld { ref name, .. }) if name == "lock.reentry"),
            "{attempt:?}"
        );
    }
    // The outer hold is intact: nobody else gets the lock, and its token is still current.
    assert!(bounded("other try", other.try_acquire("lock.reentry", 1)).await.unwrap().is_none());
    assert_eq!(occupancy(&client, "lock.reentry").await.0, 1);
    // An acquire in flight claims the name too: a concurrent second one fails at once.
    let blocker = bounded("blocker", other.acquire("lock.queued", 1)).await.unwrap();
    let queued = {
        let session = session.clone();
        tokio::spawn(async move { session.acquire("lock.queued", 1).await.map(|permit| permit.token()) })
    };
    let deadline = Instant::now() + STEP_TIMEOUT;
    while occupancy(&client, "lock.queued").await.1 == 0 {
        assert!(Instant::now() < deadline, "the first acquire queues");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = bounded("second while queued", session.try_acquire("lock.queued", 1)).await;
    assert!(matches!(second, Err(Error::AlreadyHeld { .. })), "{second:?}");
    blocker.release().await.unwrap();
    let token = bounded("queued grant", queued).await.unwrap().unwrap();
    assert!(token > 0);
    // Elections too.
    let leading = bounded("campaign", session.campaign("lead.reentry", "a")).await.unwrap();
    let again = bounded("campaign again", session.campaign("lead.reentry", "b")).await;
    assert!(matches!(again, Err(Error::AlreadyHeld { .. })), "{again:?}");
    drop(leading);
    // Once the outer guard is released, the name can be acquired again on the session.
    outer.release().await.unwrap();
    let next = bounded("acquire after release", session.acquire("lock.reentry", 1)).await.unwrap();
    next.release().await.unwrap();
}

/// Issue 29, "clients that agree": `AcquireOptions::default()` makes the semaphore that
/// `capacity` creates ephemeral, as the CLI (`--capacity` without `--keep`) and the Python client
/// do: gone once its holder releases; `ephemeral: false` keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_makes_an_ephemeral_semaphore_by_default_and_ephemeral_false_keeps_it() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions { capacity: Some(2), ..AcquireOptions::default() };
    let permit = session.acquire_with("made.on.the.fly", 1, &options).await.unwrap().expect("granted");
    assert!(client.get_semaphore("made.on.the.fly").await.unwrap().ephemeral);
    permit.release().await.unwrap();
    let gone = client.get_semaphore("made.on.the.fly").await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::SemaphoreNotFound), "{gone}");

    let kept = AcquireOptions { capacity: Some(2), ephemeral: false, ..AcquireOptions::default() };
    let permit = session.acquire_with("kept", 1, &kept).await.unwrap().expect("granted");
    permit.release().await.unwrap();
    assert_eq!(client.get_semaphore("kept").await.unwrap().capacity, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_proclaims_a_new_value_that_readers_and_watchers_see_and_a_deposed_one_cannot() {
    let server = Server::start();
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let mut leadership = bounded("campaign", session.campaign("scheduler", "node-a:1")).await.unwrap();
    let token = leadership.token();
    let from = client.get_election("scheduler").await.unwrap().index;
    let watch = client.watch_election("scheduler", from, Duration::from_secs(10));

    leadership.proclaim("node-a:2").await.unwrap();
    assert_eq!((leadership.value(), leadership.token()), ("node-a:2", token));
    let changed = bounded("watch", watch).await.unwrap();
    let leader = changed.leader.expect("still a leader");
    assert_eq!(
        (leader.value.as_str(), leader.token, leader.session.as_str()),
        ("node-a:2", token, session.id())
    );
    assert_eq!(client.leader("scheduler").await.unwrap().unwrap().value, "node-a:2");

    let too_long = "v".repeat(4097);
    let refused = leadership.proclaim(&too_long).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidArgument), "{refused}");
    assert_eq!(leadership.value(), "node-a:2", "the value the server confirmed");

    // Deposed by an admin's revoke: the proclaim is refused and changes nothing.
    client.revoke_election("scheduler", session.id()).await.unwrap();
    let deposed = leadership.proclaim("node-a:3").await.unwrap_err();
    assert_eq!(deposed.code(), Some(ErrorCode::NotLeader), "{deposed}");
    assert_eq!(leadership.value(), "node-a:2");
    assert_eq!(client.leader("scheduler").await.unwrap(), None);
}

/// Waits until the server's cluster runs feature version 4 (queues): a new node starts at
/// version 1 and raises it once its leader has probed the members, a moment after it starts.
async fn queues_ready(server: &Server) {
    let client = Client::new(&server.url).unwrap();
    let ready = common::eventually(STEP_TIMEOUT, async || {
        client.cluster().await.is_ok_and(|view| view.feature_version.is_some_and(|v| v >= 4))
    })
    .await;
    assert!(ready, "the cluster did not reach feature version 4");
}

/// The queue view's counts: (pending, claimed, delayed).
async fn queue_counts(client: &Client, name: &str) -> (u64, u64, u64) {
    let view = client.get_queue(name).await.expect("queue view");
    (view.pending, view.claimed, view.delayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_items_go_from_push_to_claim_to_ack_or_nack() {
    use permit_client::wire::ItemState;
    use permit_client::PushOptions;
    let server = Server::start();
    queues_ready(&server).await;
    let client = client(&server);
    // Payloads come back byte for byte: key order, spacing-free number forms.
    let payload: Box<serde_json::value::RawValue> =
        serde_json::value::RawValue::from_string(r#"{"b":1.50,"a":[true,null]}"#.into()).unwrap();
    let first = client.push("jobs", &payload).await.unwrap();
    let second = client
        .push_with("jobs", &"second", &PushOptions { key: Some("k2".into()), delay: None })
        .await
        .unwrap();
    assert!(second.seq > first.seq, "seq grows: {} then {}", first.seq, second.seq);
    let again = client
        .push_with("jobs", &"again", &PushOptions { key: Some("k2".into()), delay: None })
        .await
        .unwrap();
    assert!(again.duplicate && again.id == second.id, "a pushed key answers its item: {again:?}");
    assert_eq!(queue_counts(&client, "jobs").await, (2, 0, 0));

    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let item = bounded("claim", session.claim("jobs")).await.unwrap();
    assert_eq!((item.id(), item.payload(), item.attempt()), (first.id.as_str(), payload.get(), 1));
    assert_eq!(item.payload_as::<serde_json::Value>().unwrap()["a"][0], true);
    assert_eq!(queue_counts(&client, "jobs").await, (1, 1, 0));
    item.ack().await.unwrap();
    assert_eq!(queue_counts(&client, "jobs").await, (1, 0, 0));

    // A nack with a delay keeps the item out of claims; a try finds nothing due.
    let item = session.try_claim("jobs").await.unwrap().expect("the second item is due");
    let token = item.token();
    let state = item.nack(Duration::from_secs(60), Some("upstream 503")).await.unwrap();
    assert_eq!(state, ItemState::Delayed);
    assert_eq!(queue_counts(&client, "jobs").await, (0, 0, 1));
    assert!(session.try_claim("jobs").await.unwrap().is_none(), "a delayed item is not claimed");
    let listed = client.list_items("jobs", Some(ItemState::Delayed), None, 10).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].last_error.as_deref(), Some("upstream 503"));

    // A guard dropped without ack or nack gives its item back.
    client.remove_item("jobs", &second.id).await.unwrap();
    client.push("jobs", &3).await.unwrap();
    let dropped = session.try_claim("jobs").await.unwrap().expect("due");
    assert!(dropped.token() > token, "tokens grow");
    drop(dropped);
    let back =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&client, "jobs").await == (1, 0, 0)).await;
    assert!(back, "the dropped item is pending again");
    let retried = session.try_claim("jobs").await.unwrap().expect("due again");
    assert_eq!(retried.attempt(), 2);
    retried.ack().await.unwrap();
    assert_eq!(queue_counts(&client, "jobs").await, (0, 0, 0));
    client.delete_queue("jobs").await.unwrap();
    let gone = client.get_queue("jobs").await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::QueueNotFound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_claim_is_answered_when_an_item_arrives() {
    let server = Server::start();
    queues_ready(&server).await;
    let client = client(&server);
    client.put_queue("arrivals", &Default::default()).await.unwrap();
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let nothing =
        bounded("claim timeout", session.claim_timeout("arrivals", Duration::from_millis(200))).await;
    assert!(nothing.unwrap().is_none(), "nothing came within the timeout");
    assert_eq!(client.get_queue("arrivals").await.unwrap().claimers, 0, "and no claim is left waiting");

    let claimer = session.clone();
    let waiting = tokio::spawn(async move { claimer.claim("arrivals").await });
    let blocked = common::eventually(STEP_TIMEOUT, async || {
        client.get_queue("arrivals").await.is_ok_and(|view| view.claimers == 1)
    })
    .await;
    assert!(blocked, "the claim waits on the server");
    let pushed = client.push("arrivals", &"now").await.unwrap();
    let item = bounded("blocked claim", waiting).await.unwrap().unwrap();
    assert_eq!(item.id(), pushed.id);
    item.ack().await.unwrap();
}

/// A worker's loop in one request per item: the ack claims the next, waits for one to arrive,
/// and answers `None` when none came in time, the last item acked all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_claims_the_next_item_in_the_same_request() {
    let server = Server::start();
    let client = client(&server);
    let ready = common::eventually(STEP_TIMEOUT, async || {
        client.cluster().await.is_ok_and(|view| view.feature_version.is_some_and(|v| v >= 6))
    })
    .await;
    assert!(ready, "the cluster did not reach feature version 6");
    for n in 1..=2 {
        client.push("loop", &n).await.unwrap();
    }
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let first = bounded("claim", session.claim("loop")).await.unwrap();
    let second = bounded("ack and claim", first.ack_and_claim(Duration::from_secs(5))).await.unwrap();
    let second = second.expect("the second item was due");
    assert_eq!(second.payload(), "2");
    assert_eq!(queue_counts(&client, "loop").await, (0, 1, 0), "the first acked, the second claimed");

    let worker = tokio::spawn(async move { second.ack_and_claim(Duration::from_secs(20)).await });
    let waiting = common::eventually(STEP_TIMEOUT, async || {
        client.get_queue("loop").await.is_ok_and(|view| view.claimers == 1 && view.claimed == 0)
    })
    .await;
    assert!(waiting, "the second item is acked and the next claim waits on the server");
    let pushed = client.push("loop", &3).await.unwrap();
    let third =
        bounded("a waiting ack and claim", worker).await.unwrap().unwrap().expect("served by the push");
    assert_eq!(third.id(), pushed.id);

    let last = bounded("ack and claim timeout", third.ack_and_claim(Duration::from_millis(200))).await;
    assert!(last.unwrap().is_none(), "nothing came within the timeout");
    let view = client.get_queue("loop").await.unwrap();
    assert_eq!((view.pending, view.claimed, view.claimers), (0, 0, 0), "all acked, no claim left waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_item_is_lost_with_its_session() {
    let server = Server::start();
    queues_ready(&server).await;
    let client = client(&server);
    client.push("fragile", &1).await.unwrap();
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let item = session.claim("fragile").await.unwrap();
    let lost = item.lost();
    client.close_session(session.id()).await.unwrap();
    bounded("lost", lost).await;
    assert_eq!(queue_counts(&client, "fragile").await, (1, 0, 0), "the item is pending again");
    let error = item.ack().await.unwrap_err();
    assert!(
        matches!(error, Error::SessionExpired) || error.code() == Some(ErrorCode::ClaimLost),
        "{error:?}"
    );
    let other = client.session(Duration::from_secs(10)).await.unwrap();
    let again = other.claim("fragile").await.unwrap();
    assert_eq!(again.attempt(), 2);
}

/// A claim whose answer is lost (the server dies mid long-poll) is asked again with its
/// `request_id`: it gets the claim the server kept, and no item stays claimed unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_repeated_after_a_lost_answer_takes_no_more_items() {
    let mut server = Server::start();
    queues_ready(&server).await;
    let client = client(&server);
    client.put_queue("restarts", &Default::default()).await.unwrap();
    let session = client.session(Duration::from_secs(15)).await.unwrap();
    let claimer = session.clone();
    let waiting = tokio::spawn(async move { claimer.claim("restarts").await });
    let blocked = common::eventually(STEP_TIMEOUT, async || {
        client.get_queue("restarts").await.is_ok_and(|view| view.claimers == 1)
    })
    .await;
    assert!(blocked, "the claim waits on the server");
    server.restart();
    // The claimer is replicated state: after the restart it waits again, under the same id.
    let rejoined = common::eventually(STEP_TIMEOUT, async || {
        client.get_queue("restarts").await.is_ok_and(|view| view.claimers == 1)
    })
    .await;
    assert!(rejoined, "one claim waits after the restart");
    let items = (0..2).map(|n| permit_client::PushOptions::default().item(&n).unwrap());
    client.push_many("restarts", items).await.unwrap();
    let item = bounded("claim across a restart", waiting).await.unwrap().unwrap();
    assert_eq!(item.payload(), "0");
    assert_eq!(queue_counts(&client, "restarts").await, (1, 1, 0), "one claimed, one still pending");
    item.ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_many_splits_into_requests_in_order() {
    let server = Server::start();
    queues_ready(&server).await;
    let client = client(&server);
    let items = (0..2500).map(|n| permit_client::PushOptions::default().item(&n).unwrap());
    let pushed = client.push_many("bulk", items).await.unwrap();
    assert_eq!(pushed.len(), 2500);
    assert!(pushed.windows(2).all(|pair| pair[0].seq < pair[1].seq), "in order");
    assert_eq!(queue_counts(&client, "bulk").await, (2500, 0, 0));
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let options = permit_client::ClaimOptions { max: 1000, timeout: Some(Duration::ZERO) };
    let batch = session.claim_with("bulk", &options).await.unwrap();
    assert_eq!(batch.len(), 1000);
    assert_eq!(batch[0].payload(), "0");
    assert_eq!(batch[999].payload(), "999");
    let list = client.all_queues().await.unwrap();
    assert_eq!(list.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(), ["bulk"]);
}

/// `Client::take` returns increasing tokens while the rate has room, then
/// `Error::RateLimited` with how long until it has; with a wait it is served when the rate
/// allows; a semaphore without a rate always takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_returns_tokens_within_the_rate_and_rate_limited_with_retry_after() {
    use permit_client::wire::{PutSemaphoreRequest, Rate};
    let server = Server::start();
    let client = client(&server);
    // 2 a minute, 2 at once: the third take is 30 s away.
    let rate = Rate { permits: 2, per_ms: 60_000, burst: Some(2) };
    let request =
        PutSemaphoreRequest { capacity: 1, rate: Some(Some(rate)), ..PutSemaphoreRequest::default() };
    let view = client.put_semaphore_with("quota", &request).await.unwrap();
    let shown = view.rate.expect("the rate");
    assert_eq!((shown.permits, shown.per_ms, shown.burst), (2, 60_000, 2));
    let first = client.take("quota", 1, Duration::ZERO).await.unwrap();
    let second = client.take("quota", 1, Duration::ZERO).await.unwrap();
    assert!(second > first, "tokens increase: {first} then {second}");
    match client.take("quota", 1, Duration::ZERO).await {
        Err(error @ Error::RateLimited { retry_after, .. }) => {
            assert_eq!(error.code(), Some(ErrorCode::RateLimited));
            assert!(
                retry_after > Duration::ZERO && retry_after <= Duration::from_secs(30),
                "{retry_after:?}"
            );
        }
        other => panic!("a third take within the minute: {other:?}"),
    }
    let over = client.take("quota", 3, Duration::ZERO).await.unwrap_err();
    assert_eq!(over.code(), Some(ErrorCode::PermitsExceedCapacity), "{over}");

    // 10 a second, 1 at once: a take that waits is served about 100 ms after the last.
    let rate = Rate { permits: 10, per_ms: 1_000, burst: Some(1) };
    let request =
        PutSemaphoreRequest { capacity: 1, rate: Some(Some(rate)), ..PutSemaphoreRequest::default() };
    client.put_semaphore_with("fast", &request).await.unwrap();
    let last = client.take("fast", 1, Duration::ZERO).await.unwrap();
    let asked = Instant::now();
    let next = bounded("a waiting take", client.take("fast", 1, Duration::from_secs(5))).await.unwrap();
    assert!(next > last);
    assert!(asked.elapsed() >= Duration::from_millis(50), "served after {:?}", asked.elapsed());

    // Removing the rate keeps the capacity and lets every take through.
    let request = PutSemaphoreRequest { capacity: 1, rate: Some(None), ..PutSemaphoreRequest::default() };
    assert!(client.put_semaphore_with("quota", &request).await.unwrap().rate.is_none());
    for _ in 0..5 {
        client.take("quota", 1, Duration::ZERO).await.unwrap();
    }
}

/// Acquires with `AcquireOptions::group` count against `group_max`: a group at its cap gets
/// nothing while the semaphore has room, another group does, and the view shows the groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_acquires_are_capped_per_group() {
    use permit_client::wire::PutSemaphoreRequest;
    let server = Server::start();
    let client = client(&server);
    let request =
        PutSemaphoreRequest { capacity: 4, group_max: Some(Some(2)), ..PutSemaphoreRequest::default() };
    assert_eq!(client.put_semaphore_with("slots", &request).await.unwrap().group_max, Some(2));
    let team_a = AcquireOptions::default().group("team-a").timeout(Duration::ZERO);
    let mut held = Vec::new();
    for _ in 0..2 {
        let session = client.session(Duration::from_secs(10)).await.unwrap();
        held.push(session.acquire_with("slots", 1, &team_a).await.unwrap().expect("within the cap"));
    }
    let third = client.session(Duration::from_secs(10)).await.unwrap();
    assert!(third.acquire_with("slots", 1, &team_a).await.unwrap().is_none(), "team-a is at its cap");
    let team_b = AcquireOptions::default().group("team-b").timeout(Duration::ZERO);
    let other = third.acquire_with("slots", 1, &team_b).await.unwrap().expect("another group");
    let view = client.get_semaphore("slots").await.unwrap();
    assert_eq!(view.held, 3);
    let groups: Vec<(&str, u64, u64)> =
        view.groups.iter().map(|g| (g.group.as_str(), g.held, g.holders)).collect();
    assert_eq!(groups, [("team-a", 2, 2), ("team-b", 1, 1)]);
    assert_eq!(view.holders.iter().filter(|h| h.group.as_deref() == Some("team-a")).count(), 2);
    // A group name the server refuses.
    let bad = AcquireOptions::default().group("no spaces").timeout(Duration::ZERO);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let refused = session.acquire_with("slots", 1, &bad).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidArgument), "{refused}");
    // Released, team-a has room again.
    held.pop().unwrap().release().await.unwrap();
    assert!(session.acquire_with("slots", 1, &team_a).await.unwrap().is_some());
    other.release().await.unwrap();
}
