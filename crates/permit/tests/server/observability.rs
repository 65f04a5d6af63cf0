//! Metrics move as the documented events happen, and `GET /v1/events` streams them: against
//! real `permit serve` processes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{eventually, Cluster, Server};
use crate::Api;

/// One SSE frame: `id`, `event` and the parsed `data`.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) id: Option<u64>,
    pub(crate) event: String,
    pub(crate) data: Value,
}

/// A Server-Sent Events reader over a streaming response.
pub(crate) struct Sse {
    response: reqwest::Response,
    buffer: String,
}

impl Sse {
    pub(crate) async fn open(api: &Api, path: &str, last_event_id: Option<u64>) -> Sse {
        let mut request = api.http.get(format!("{}{path}", api.url));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.expect("stream opened");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert_eq!(content_type, "text/event-stream");
        Sse { response, buffer: String::new() }
    }

    /// The next frame (comments skipped), or `None` if none came within `timeout`.
    pub(crate) async fn next(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame { id: None, event: String::new(), data: Value::Null };
                for line in block.lines() {
                    if let Some(id) = line.strip_prefix("id: ") {
                        frame.id = Some(id.parse().expect("numeric id"));
                    } else if let Some(event) = line.strip_prefix("event: ") {
                        frame.event = event.to_owned();
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        frame.data = serde_json::from_str(data).expect("JSON data");
                    }
                }
                if frame.event.is_empty() {
                    continue; // a comment (keepalive)
                }
                return Some(frame);
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk()).await.ok()?;
            let chunk = chunk.expect("stream readable")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// Whether the server ends the stream within `timeout` (frames before the end are read and
    /// dropped).
    pub(crate) async fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return false,
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None) | Err(_)) => return true,
            }
        }
    }

    /// Frames until one of `kind` (inclusive), within `timeout`.
    pub(crate) async fn until(&mut self, kind: &str, timeout: Duration) -> Vec<Frame> {
        let deadline = Instant::now() + timeout;
        let mut frames = Vec::new();
        while let Some(frame) = self.next(deadline.saturating_duration_since(Instant::now())).await {
            let done = frame.event == kind;
            frames.push(frame);
            if done {
                return frames;
            }
        }
        panic!("no {kind} frame within {timeout:?}; got {frames:?}");
    }
}

/// The value of the sample `series` (name with labels, exactly as exposed) in `/metrics`.
pub(crate) async fn sample(api: &Api, series: &str) -> Option<f64> {
    let text = api.http.get(format!("{}/metrics", api.url)).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn metric(api: &Api, series: &str) -> f64 {
    sample(api, series).await.unwrap_or_else(|| panic!("no series {series} in /metrics"))
}

#[tokio::test]
async fn a_200_ms_wait_lands_in_the_right_bucket_and_grants_and_hold_ends_are_counted() {
    let server = Server::start();
    let api = Api::new(&server);
    let holder = api.session(30_000).await;
    let waiter = api.session(30_000).await;
    assert_eq!(api.acquire("gpu", json!({ "session": holder, "capacity": 1 })).await.status, 200);
    let api2 = api.clone();
    let waiter2 = waiter.clone();
    let waiting =
        tokio::spawn(
            async move { api2.acquire("gpu", json!({ "session": waiter2, "wait_ms": 10_000 })).await },
        );
    assert!(
        eventually(Duration::from_secs(5), async || {
            sample(&api, "permit_semaphore_waiters{semaphore=\"gpu\"}").await == Some(1.0)
        })
        .await
    );
    let queued_at = Instant::now();
    // The oldest waiter's age grows while it waits.
    assert!(
        eventually(Duration::from_secs(5), async || {
            sample(&api, "permit_semaphore_oldest_waiter_seconds{semaphore=\"gpu\"}").await.unwrap_or(0.0)
                >= 0.05
        })
        .await
    );
    // Release ~180 ms after the waiter was seen queued: a wait of 180 ms plus the latencies.
    while queued_at.elapsed() < Duration::from_millis(180) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(api.release("gpu", &holder).await.status, 200);
    assert_eq!(waiting.await.unwrap().status, 200);
    let wait = |le: &str| format!("permit_semaphore_wait_seconds_bucket{{le=\"{le}\",semaphore=\"gpu\"}}");
    assert_eq!(metric(&api, "permit_semaphore_wait_seconds_count{semaphore=\"gpu\"}").await, 2.0);
    assert_eq!(metric(&api, &wait("0.1")).await, 1.0, "only the immediate grant is under 100 ms");
    assert_eq!(metric(&api, &wait("0.25")).await, 2.0, "the ~200 ms wait is under 250 ms");
    assert_eq!(metric(&api, "permit_semaphore_grants_total{semaphore=\"gpu\"}").await, 2.0);
    assert_eq!(metric(&api, "permit_semaphore_waiters{semaphore=\"gpu\"}").await, 0.0);
    assert_eq!(metric(&api, "permit_semaphore_held{semaphore=\"gpu\"}").await, 1.0);
    assert_eq!(metric(&api, "permit_semaphore_oldest_waiter_seconds{semaphore=\"gpu\"}").await, 0.0);
    let hold =
        |ended: &str| format!("permit_semaphore_hold_seconds_count{{semaphore=\"gpu\",ended=\"{ended}\"}}");
    assert_eq!(metric(&api, &hold("released")).await, 1.0);
    // A revoke is labelled as one.
    let revoked = api.post("/v1/semaphores/gpu/revoke", json!({ "session": waiter })).await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    assert_eq!(metric(&api, &hold("revoked")).await, 1.0);
    assert_eq!(metric(&api, &hold("released")).await, 1.0);
    assert_eq!(metric(&api, "permit_semaphore_held{semaphore=\"gpu\"}").await, 0.0);
    // A try-acquire refused is counted.
    assert_eq!(api.acquire("gpu", json!({ "session": holder })).await.status, 200);
    assert_eq!(api.acquire("gpu", json!({ "session": waiter })).await.status, 409);
    assert_eq!(metric(&api, "permit_semaphore_try_acquire_refusals_total{semaphore=\"gpu\"}").await, 1.0);
    // Long-polls are in their own histogram, not in the request latency one.
    let long_polls = "permit_http_long_poll_duration_seconds_count{route=\"/v1/semaphores/{name}/acquire\"}";
    assert_eq!(metric(&api, long_polls).await, 1.0);
    let requests = "permit_http_request_duration_seconds_count{route=\"/v1/semaphores/{name}/acquire\"}";
    assert_eq!(metric(&api, requests).await, 3.0, "the three acquires that did not wait");
    assert_eq!(metric(&api, "permit_build_info{version=\"0.1.0\"}").await, 1.0);
    assert!(metric(&api, "process_resident_memory_bytes").await > 0.0);
}

/// Waits until `name` has `count` waiters (its waiters gauge).
async fn queued(api: &Api, name: &str, count: f64) {
    let series = format!("permit_semaphore_waiters{{semaphore=\"{name}\"}}");
    assert!(eventually(Duration::from_secs(5), async || sample(api, &series).await == Some(count)).await);
}

#[tokio::test]
async fn the_proposer_waits_for_a_granted_waiters_next_command_and_counts_one_that_sends_none() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(30_000).await, api.session(30_000).await);
    assert_eq!(api.acquire("lock", json!({ "session": a, "capacity": 1 })).await.status, 200);
    let long_poll = |session: String| {
        let api = api.clone();
        tokio::spawn(
            async move { api.acquire("lock", json!({ "session": session, "wait_ms": 10_000 })).await },
        )
    };
    let waiting = long_poll(b.clone());
    queued(&api, "lock", 1.0).await;
    // A's release grants B (woken); B then sends nothing, so the next batch (another session's
    // creation) waits for it in vain, at most one write.
    assert_eq!(api.release("lock", &a).await.status, 200);
    assert_eq!(waiting.await.unwrap().status, 200);
    api.session(30_000).await;
    assert_eq!(metric(&api, "permit_proposal_handoff_waited_total").await, 1.0);
    assert_eq!(metric(&api, "permit_proposal_handoff_missed_total").await, 1.0);
    // B's release grants A (woken), whose release is the next command: waited for, not missed.
    let waiting = long_poll(a.clone());
    queued(&api, "lock", 1.0).await;
    assert_eq!(api.release("lock", &b).await.status, 200);
    assert_eq!(waiting.await.unwrap().status, 200);
    assert_eq!(api.release("lock", &a).await.status, 200);
    assert_eq!(metric(&api, "permit_proposal_handoff_waited_total").await, 2.0);
    assert_eq!(metric(&api, "permit_proposal_handoff_missed_total").await, 1.0);
}

#[tokio::test]
async fn an_expiry_counts_once_and_ends_the_hold_as_expired() {
    let server = Server::start();
    let api = Api::new(&server);
    let session = api.session(300).await;
    assert_eq!(api.acquire("db", json!({ "session": session, "capacity": 2 })).await.status, 200);
    assert_eq!(metric(&api, "permit_sessions_created_total").await, 1.0);
    assert!(
        eventually(Duration::from_secs(5), async || {
            sample(&api, "permit_sessions_expired_total").await == Some(1.0)
        })
        .await
    );
    let expired = "permit_semaphore_hold_seconds_count{semaphore=\"db\",ended=\"expired\"}";
    assert_eq!(metric(&api, expired).await, 1.0);
    assert_eq!(metric(&api, "permit_semaphore_expirations_total{semaphore=\"db\"}").await, 1.0);
    assert_eq!(metric(&api, "permit_sessions").await, 0.0);
    // Nothing counts it again later.
    let session = api.session(30_000).await;
    api.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await;
    assert_eq!(metric(&api, "permit_sessions_expired_total").await, 1.0);
    assert_eq!(metric(&api, "permit_session_keepalives_total").await, 1.0);
}

#[tokio::test]
async fn requests_are_counted_by_route_and_status_and_unknown_methods_share_one_label() {
    let server = Server::start();
    let api = Api::new(&server);
    for method in ["FOO", "BAR", "BAZ"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for path in ["/v1/nope", "/v1/health"] {
            let answer = api.http.request(method.clone(), format!("{}{path}", api.url)).send().await.unwrap();
            assert!(answer.status().is_client_error(), "{method} {path}: {}", answer.status());
        }
    }
    for _ in 0..2 {
        assert_eq!(api.http.get(format!("{}/v1/health", api.url)).send().await.unwrap().status(), 200);
    }
    let text = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap().text().await.unwrap();
    for method in ["FOO", "BAR", "BAZ"] {
        assert!(!text.contains(&format!("method=\"{method}\"")), "{method} has a series of its own");
    }
    let count = |route: &str, method: &str, status: u16| {
        let series = format!(
            "permit_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}}"
        );
        text.lines().find_map(|line| line.strip_prefix(series.as_str())?.trim().parse::<f64>().ok())
    };
    assert_eq!(count("unmatched", "OTHER", 404), Some(3.0), "{text}");
    assert_eq!(count("/v1/health", "OTHER", 405), Some(3.0), "{text}");
    assert!(count("/v1/health", "GET", 200).is_some_and(|n| n >= 2.0), "{text}");
    let health_seconds = "permit_http_request_duration_seconds_count{route=\"/v1/health\"}";
    assert!(text.lines().any(|line| line.starts_with(health_seconds)), "{text}");
}

#[tokio::test]
async fn names_past_the_cap_are_summed_under_one_label() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_in(dir.path(), "127.0.0.1:0", &["--metrics-names-max", "2"]);
    let api = Api::new(&server);
    for (name, capacity) in [("a", 1), ("b", 2), ("c", 3), ("d", 4)] {
        api.semaphore(name, capacity).await;
    }
    assert_eq!(metric(&api, "permit_semaphore_capacity{semaphore=\"a\"}").await, 1.0);
    assert_eq!(metric(&api, "permit_semaphore_capacity{semaphore=\"b\"}").await, 2.0);
    assert!(sample(&api, "permit_semaphore_capacity{semaphore=\"c\"}").await.is_none());
    assert_eq!(metric(&api, "permit_semaphore_capacity{semaphore=\"_other\"}").await, 7.0);
    assert_eq!(metric(&api, "permit_semaphores").await, 4.0);
    assert!(api.send("DELETE", "/v1/semaphores/c", None).await.status < 300);
    assert_eq!(metric(&api, "permit_semaphore_capacity{semaphore=\"_other\"}").await, 4.0);
    assert_eq!(metric(&api, "permit_semaphores").await, 3.0);
}

#[tokio::test]
async fn a_semaphore_history_holds_what_the_node_saw_for_names_under_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_in(dir.path(), "127.0.0.1:0", &["--metrics-names-max", "1"]);
    let api = Api::new(&server);
    api.semaphore("kept", 2).await;
    api.semaphore("past-cap", 1).await;
    let (one, two, three) = (api.session(30_000).await, api.session(30_000).await, api.session(30_000).await);
    for session in [&one, &two] {
        assert_eq!(api.acquire("kept", json!({ "session": session })).await.status, 200);
    }
    let queued = api.acquire("kept", json!({ "session": three, "wait_ms": 10 })).await;
    assert_eq!(queued.body["status"], "waiting", "{queued:?}");
    // Each sample's values are those at the end of its second; the last one's are now.
    let last = |body: &Value| -> (u64, u64, u64, u64) {
        let samples = body["samples"].as_array().unwrap();
        let last = &samples[samples.len() - 1];
        let grants = samples.iter().map(|s| s["grants"].as_u64().unwrap()).sum();
        let value = |field: &str| last[field].as_u64().unwrap();
        (value("held"), value("capacity"), value("waiters"), grants)
    };
    let before = api.get("/v1/semaphores/kept/history").await.body;
    assert_eq!(last(&before), (2, 2, 1, 2), "two hold, three waits: {before}");
    // One's release grants three.
    assert_eq!(api.release("kept", &one).await.status, 200);

    let history = api.get("/v1/semaphores/kept/history").await;
    assert_eq!(history.status, 200, "{history:?}");
    let body = &history.body;
    assert_eq!(
        (&body["name"], &body["kept"], &body["interval_ms"]),
        (&json!("kept"), &json!(true), &json!(1000))
    );
    let samples = body["samples"].as_array().unwrap();
    assert!(!samples.is_empty() && samples.len() <= 900, "{body}");
    let at: Vec<u64> = samples.iter().map(|s| s["at_ms"].as_u64().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[1] == w[0] + 1000), "one sample a second: {at:?}");
    let now_ms = body["now_ms"].as_u64().unwrap();
    assert!(at[at.len() - 1] <= now_ms && now_ms - at[at.len() - 1] < 1000, "the last is now: {body}");
    assert_eq!(last(body), (2, 2, 0, 3), "{body}");
    assert!(samples.iter().all(|s| s["held_max"].as_u64() <= Some(2)), "{body}");

    // The newest seconds only, as asked.
    let newest = api.get("/v1/semaphores/kept/history?seconds=1").await.body;
    assert_eq!(newest["samples"].as_array().map(Vec::len), Some(1), "{newest}");
    assert_eq!(newest["samples"][0]["at_ms"].as_u64(), at.last().copied(), "{newest}");
    for bad in ["0", "901", "x"] {
        let answer = api.get(&format!("/v1/semaphores/kept/history?seconds={bad}")).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"), "{bad}: {answer:?}");
    }

    // Past the cap: the semaphore exists, without a history.
    let none = api.get("/v1/semaphores/past-cap/history").await;
    assert_eq!((none.status, &none.body["kept"], &none.body["samples"]), (200, &json!(false), &json!([])));
    let unknown = api.get("/v1/semaphores/nope/history").await;
    assert_eq!((unknown.status, unknown.code()), (404, "semaphore_not_found"), "{unknown:?}");
    let bad = api.get("/v1/semaphores/bad%20name/history").await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_name"), "{bad:?}");
}

#[tokio::test]
async fn the_event_stream_delivers_frames_filters_and_resumes() {
    let server = Server::start();
    let api = Api::new(&server);
    let mut all = Sse::open(&api, "/v1/events", None).await;
    let mut gpu = Sse::open(&api, "/v1/events?prefix=gp&kinds=granted,released", None).await;
    let bad = api.get("/v1/events?kinds=granted,nope").await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_argument"), "{bad:?}");
    let session = api.session(30_000).await;
    api.acquire("gpu", json!({ "session": session, "capacity": 4, "permits": 2 })).await;
    api.acquire("other", json!({ "session": session, "capacity": 1 })).await;
    api.release("gpu", &session).await;
    let frames = all.until("released", Duration::from_secs(5)).await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(
        kinds,
        ["session_created", "capacity_changed", "granted", "capacity_changed", "granted", "released"]
    );
    for pair in frames.windows(2) {
        assert!(pair[0].id < pair[1].id, "seqs grow: {frames:?}");
    }
    let granted = &frames[2].data;
    assert_eq!(granted["kind"], "granted");
    assert_eq!(granted["object_kind"], "semaphore");
    assert_eq!(granted["name"], "gpu");
    assert_eq!(granted["session"], session.as_str());
    assert_eq!(granted["permits"], 2);
    assert_eq!(granted["token"], 1);
    assert_eq!(granted["seq"].as_u64(), frames[2].id);
    assert!(granted["index"].as_u64().unwrap() > 0 && granted["now_ms"].as_u64().is_some());
    assert_eq!(frames[1].data["capacity"], 4);
    // The filtered stream saw only gpu's grant and release.
    let filtered = gpu.until("released", Duration::from_secs(5)).await;
    let names: Vec<(&str, &str)> =
        filtered.iter().map(|f| (f.event.as_str(), f.data["name"].as_str().unwrap())).collect();
    assert_eq!(names, [("granted", "gpu"), ("released", "gpu")]);
    // Resume after the first grant: every later event, again.
    let first_grant = frames[2].id.unwrap();
    let mut resumed = Sse::open(&api, "/v1/events", Some(first_grant)).await;
    let again = resumed.until("released", Duration::from_secs(5)).await;
    let ids: Vec<Option<u64>> = again.iter().map(|f| f.id).collect();
    let expected: Vec<Option<u64>> = frames[3..].iter().map(|f| f.id).collect();
    assert_eq!(ids, expected);
    // Resuming from a seq the node never had is reported as missed, then the ring follows.
    let mut lost = Sse::open(&api, "/v1/events", Some(1_000_000)).await;
    let missed = lost.next(Duration::from_secs(5)).await.expect("a missed frame");
    assert_eq!(missed.event, "missed");
    assert_eq!(missed.data, json!({ "requested": 1_000_001, "first_available": 1 }));
    let first = lost.next(Duration::from_secs(5)).await.expect("the ring");
    assert_eq!((first.id, first.event.as_str()), (Some(1), "session_created"));
    // Queued, wait_ended and leader changes.
    let other = api.session(30_000).await;
    api.acquire("gpu", json!({ "session": session, "permits": 4 })).await;
    let waiting = api.acquire("gpu", json!({ "session": other, "wait_ms": 10 })).await;
    assert_eq!(waiting.status, 202);
    api.release("gpu", &other).await;
    let frames = all.until("wait_ended", Duration::from_secs(5)).await;
    let ended = frames.last().unwrap();
    assert_eq!(ended.data["reason"], "cancelled");
    assert!(frames.iter().any(|f| f.event == "queued" && f.data["session"] == other.as_str()));
    api.post("/v1/elections/boss/campaign", json!({ "session": other, "value": "me" })).await;
    let frames = all.until("leader_changed", Duration::from_secs(5)).await;
    let leader = &frames.last().unwrap().data;
    assert_eq!((leader["name"].as_str(), leader["value"].as_str()), (Some("boss"), Some("me")));
    assert_eq!(leader["session"], other.as_str());
    api.send("DELETE", &format!("/v1/sessions/{other}"), None).await;
    let frames = all.until("session_closed", Duration::from_secs(5)).await;
    let vacated = frames.iter().find(|f| f.event == "leader_changed").expect("the leader left");
    assert!(vacated.data.get("session").is_none(), "{vacated:?}");
}

#[tokio::test]
async fn a_resume_past_the_ring_is_told_what_it_missed() {
    let server = Server::start();
    let api = Api::new(&server);
    // 10 001 events: a session, then 5 000 acquire and release pairs.
    let session = api.session(60_000).await;
    let mut handles = Vec::new();
    for worker in 0..8 {
        let api = api.clone();
        let session = session.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..625 {
                let name = format!("r{worker}-{}", i % 4);
                let answer = api.acquire(&name, json!({ "session": session, "capacity": 1 })).await;
                assert_eq!(answer.status, 200, "{answer:?}");
                api.release(&name, &session).await;
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let mut stream = Sse::open(&api, "/v1/events", Some(0)).await;
    let missed = stream.next(Duration::from_secs(5)).await.expect("a missed frame");
    assert_eq!(missed.event, "missed");
    assert_eq!(missed.data["requested"], 1);
    let first = missed.data["first_available"].as_u64().unwrap();
    assert!(first > 1, "{missed:?}");
    let next = stream.next(Duration::from_secs(5)).await.expect("the ring's first event");
    assert_eq!(next.id, Some(first));
}

/// `wait_ms` ends the stream after that long, having sent what it had; a wait too long for the
/// clock keeps it open (and panics nothing).
#[tokio::test]
async fn wait_ms_ends_the_stream_and_a_huge_one_keeps_it_open() {
    let server = Server::start();
    let api = Api::new(&server);
    let session = api.session(60_000).await;
    let mut stream = Sse::open(&api, "/v1/events?wait_ms=300", Some(0)).await;
    let first = stream.next(Duration::from_secs(5)).await.expect("the resumed events first");
    assert_eq!(first.event, "session_created");
    assert_eq!(first.data["session"], session.as_str());
    let started = Instant::now();
    assert!(stream.next(Duration::from_secs(10)).await.is_none(), "no frame after the session's");
    assert!(
        tokio::time::timeout(Duration::from_secs(5), stream.response.chunk())
            .await
            .expect("ended")
            .unwrap()
            .is_none(),
        "the stream ended"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "ended after {:?}", started.elapsed());

    let mut open = Sse::open(&api, &format!("/v1/events?wait_ms={}", u64::MAX), Some(0)).await;
    assert_eq!(open.next(Duration::from_secs(5)).await.expect("a frame").event, "session_created");
    api.session(60_000).await;
    let next = open.next(Duration::from_secs(5)).await.expect("still open for a new event");
    assert_eq!(next.event, "session_created");
}

#[tokio::test]
async fn a_follower_serves_the_event_stream_from_its_own_state() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.unwrap();
    let follower = (leader + 1) % 3;
    let on_follower = Api::at(&cluster.nodes[follower].url);
    let mut stream = Sse::open(&on_follower, "/v1/events?kinds=granted", None).await;
    let session = on_follower.session(30_000).await;
    let answer = on_follower.acquire("f", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let frames = stream.until("granted", Duration::from_secs(10)).await;
    assert_eq!(frames.last().unwrap().data["name"], "f");
    // Its own metrics moved too: the follower applied the grant.
    assert!(
        eventually(Duration::from_secs(5), async || {
            sample(&on_follower, "permit_semaphore_grants_total{semaphore=\"f\"}").await == Some(1.0)
        })
        .await
    );
    // And its own history, answered by itself (not forwarded to the leader).
    let response =
        on_follower.http.get(format!("{}/v1/semaphores/f/history", on_follower.url)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let health = on_follower.get("/v1/health").await.body;
    let answered_by = response.headers().get("permit-node").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(answered_by, Some(health["node_id"].to_string()), "served by the follower itself");
    let history: serde_json::Value = response.json().await.unwrap();
    let samples = history["samples"].as_array().unwrap();
    let grants: u64 = samples.iter().map(|s| s["grants"].as_u64().unwrap()).sum();
    assert_eq!((grants, &samples[samples.len() - 1]["held"]), (1, &json!(1)), "{history}");
}

#[tokio::test]
async fn a_restart_from_a_snapshot_rebuilds_the_gauges_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(&dir.path().join("d"), "127.0.0.1:0", &["--snapshot-logs", "10"]);
    let api = Api::new(&server);
    let holder = api.session(60_000).await;
    let waiter = api.session(60_000).await;
    assert_eq!(
        api.acquire("gpu", json!({ "session": holder, "capacity": 3, "permits": 2 })).await.status,
        200
    );
    assert_eq!(
        api.acquire("gpu", json!({ "session": waiter, "permits": 2, "wait_ms": 10 })).await.status,
        202
    );
    // Enough entries for a snapshot, so that the restart loads one and replays the rest.
    for i in 0..15 {
        api.semaphore(&format!("x{i}"), 1).await;
    }
    server.restart();
    let api = Api::new(&server);
    assert!(
        eventually(Duration::from_secs(10), async || sample(&api, "permit_semaphores").await == Some(16.0))
            .await
    );
    assert_eq!(metric(&api, "permit_semaphore_held{semaphore=\"gpu\"}").await, 2.0);
    assert_eq!(metric(&api, "permit_semaphore_capacity{semaphore=\"gpu\"}").await, 3.0);
    assert_eq!(metric(&api, "permit_semaphore_waiters{semaphore=\"gpu\"}").await, 1.0);
    assert_eq!(metric(&api, "permit_holds").await, 1.0);
    assert_eq!(metric(&api, "permit_waiters").await, 1.0);
    assert_eq!(metric(&api, "permit_sessions").await, 2.0);
    // And they keep moving from there.
    assert_eq!(api.release("gpu", &holder).await.status, 200);
    assert_eq!(metric(&api, "permit_semaphore_waiters{semaphore=\"gpu\"}").await, 0.0);
    assert_eq!(metric(&api, "permit_semaphore_held{semaphore=\"gpu\"}").await, 2.0);
    assert_eq!(metric(&api, "permit_waiters").await, 0.0);
}

/// Scrapes render on the blocking pool one at a time: many at once are all answered, each a
/// whole exposition with the gauges set at scrape time.
#[tokio::test]
async fn concurrent_scrapes_are_each_answered_whole() {
    let server = Server::start();
    let api = Api::new(&server);
    let scrape = || async {
        let response = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    };
    let texts = futures::future::join_all((0..16).map(|_| scrape())).await;
    for text in &texts {
        assert!(text.trim_end().ends_with("# EOF"), "a whole exposition");
        assert!(text.contains("permit_raft_applied_index "), "with the scrape-time gauges");
    }
}
