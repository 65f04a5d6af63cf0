//! A recording client: every call goes into the history with its invoke and completion times,
//! the node and term that answered, and an outcome of ok, fail (an error answer that proves
//! nothing happened) or unknown (no answer, or an answer that leaves the effect open).

use std::sync::Arc;
use std::time::Duration;

use permit_check::{Completion, Holder, Invocation, Recorder};
use serde_json::{json, Value};

/// Timeout of every call; long enough for a commit during a failover, short enough to move on.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// One harness client: a number, a preferred node, and a connection pool of its own.
#[derive(Clone)]
pub struct Client {
    /// Client number in the history.
    pub id: u32,
    urls: Vec<String>,
    /// Index of the node it talks to; moves on after an unknown outcome.
    pub node: usize,
    http: reqwest::Client,
    recorder: Arc<Recorder>,
    /// Whether the last call's outcome was unknown.
    last_unknown: bool,
}

/// Why a call has no answer.
enum CallError {
    /// The connection was refused: nothing was sent.
    NotSent,
    /// Sent, but the answer was lost (timeout, reset): the effect is unknown.
    Lost(String),
}

/// What an answer said.
struct Answer {
    status: u16,
    body: Value,
    node: Option<u64>,
    term: Option<u64>,
}

impl Client {
    /// A client of the nodes at `urls`, starting with node `node`.
    pub fn new(id: u32, urls: Vec<String>, node: usize, recorder: Arc<Recorder>) -> Client {
        crate::install_crypto_provider();
        let http =
            reqwest::Client::builder().no_proxy().timeout(CALL_TIMEOUT).build().expect("client builds");
        Client { id, urls, node, http, recorder, last_unknown: false }
    }

    /// Sticks to node `node` (clients on one side of a partition).
    pub fn pin(mut self, node: usize) -> Client {
        self.node = node;
        self
    }

    async fn call(&mut self, method: &str, path: &str, body: Value) -> Result<Answer, CallError> {
        let url = format!("{}{path}", self.urls[self.node % self.urls.len()]);
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let result = self.http.request(method, url).json(&body).send().await;
        // A refused connection sent nothing: the call provably had no effect.
        let response = result.map_err(|e| {
            if e.is_connect() {
                CallError::NotSent
            } else {
                CallError::Lost(e.to_string())
            }
        })?;
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()?.parse().ok());
        let (node, term) = (header("permit-node"), header("permit-raft-term"));
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| CallError::Lost(format!("answer cut off: {e}")))?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer { status, body, node, term })
    }

    /// Turns an answer into a completion: 2xx ok, 503 and transport errors unknown, other
    /// errors fail with their code.
    fn complete(
        &mut self,
        answer: Result<Answer, CallError>,
        ok: impl FnOnce(&Value) -> Completion,
    ) -> Completion {
        let completion = self.completion(answer, ok);
        self.last_unknown = completion.outcome == permit_check::Outcome::Unknown;
        completion
    }

    fn completion(
        &mut self,
        answer: Result<Answer, CallError>,
        ok: impl FnOnce(&Value) -> Completion,
    ) -> Completion {
        match answer {
            Err(CallError::NotSent) => {
                self.node += 1;
                Completion::fail("unreachable")
            }
            Err(CallError::Lost(note)) => {
                self.node += 1;
                Completion::unknown(note)
            }
            Ok(answer) => {
                let mut completion = match answer.status {
                    200..=299 => ok(&answer.body),
                    // The node proved that nothing was done.
                    503 if answer.body["error"]["code"] == "leader_unreachable" => {
                        self.node += 1;
                        Completion::fail("leader_unreachable")
                    }
                    503 => {
                        self.node += 1;
                        Completion::unknown(answer.body["error"]["code"].as_str().unwrap_or("503").to_owned())
                    }
                    _ => {
                        Completion::fail(answer.body["error"]["code"].as_str().unwrap_or("error").to_owned())
                    }
                };
                completion.node = answer.node;
                completion.raft_term = answer.term;
                completion
            }
        }
    }

    /// Whether the last call's outcome was unknown.
    pub fn last_was_unknown(&self) -> bool {
        self.last_unknown
    }

    /// Polls the current node's health (not recorded) until it knows a leader, moving to the
    /// next node on every failed poll; gives up after `limit`. A client that backs off like this
    /// after an unknown outcome leaves one open op per failover in the history, not one per
    /// retry: each open op multiplies the linearizability search.
    pub async fn wait_for_leader(&mut self, limit: Duration) -> bool {
        const POLL_EVERY: Duration = Duration::from_millis(50);
        let polls = (limit.as_millis() / POLL_EVERY.as_millis()).max(1);
        for _ in 0..polls {
            let url = format!("{}/v1/health", self.urls[self.node % self.urls.len()]);
            let answer = self.http.get(url).timeout(Duration::from_millis(500)).send().await;
            if answer.is_ok_and(|answer| answer.status().is_success()) {
                return true;
            }
            self.node += 1;
            tokio::time::sleep(POLL_EVERY).await;
        }
        false
    }

    /// Opens a session; `None` unless it is known to exist.
    pub async fn create_session(&mut self, ttl_ms: u64) -> Option<String> {
        let handle = self.recorder.invoke(Invocation::create_session(self.id, ttl_ms));
        let answer = self.call("POST", "/v1/sessions", json!({ "ttl_ms": ttl_ms })).await;
        let completion = self.complete(answer, |body| Completion {
            session: body["id"].as_str().map(str::to_owned),
            ..Completion::ok()
        });
        let session = completion.session.clone().filter(|_| completion.outcome == permit_check::Outcome::Ok);
        handle.complete(completion);
        session
    }

    /// Keeps a session alive: `Some(true)` acknowledged, `Some(false)` refused (the session is
    /// gone), `None` unknown.
    pub async fn keepalive(&mut self, session: &str) -> Option<bool> {
        let handle = self.recorder.invoke(Invocation::keepalive(self.id, session));
        let answer = self.call("POST", &format!("/v1/sessions/{session}/keepalive"), Value::Null).await;
        let completion = self.complete(answer, |_| Completion::ok());
        let result = match completion.outcome {
            permit_check::Outcome::Ok => Some(true),
            permit_check::Outcome::Fail => Some(false),
            permit_check::Outcome::Unknown => None,
        };
        handle.complete(completion);
        result
    }

    /// Try-acquire (`wait_ms` 0) of `permits`; the token when granted.
    pub async fn acquire(&mut self, session: &str, semaphore: &str, permits: u64) -> Option<u64> {
        let handle = self.recorder.invoke(Invocation::acquire(self.id, session, semaphore, permits));
        let body = json!({ "session": session, "permits": permits });
        let answer = self.call("POST", &format!("/v1/semaphores/{semaphore}/acquire"), body).await;
        let completion = self.complete(answer, |body| match body["status"].as_str() {
            Some("acquired") => Completion { token: body["token"].as_u64(), ..Completion::ok() },
            // A 202 means queued: this workload never waits, so it cannot happen.
            _ => Completion::unknown("unexpected answer"),
        });
        let token = completion.token.filter(|_| completion.outcome == permit_check::Outcome::Ok);
        handle.complete(completion);
        token
    }

    /// Releases; the permits released when acknowledged.
    pub async fn release(&mut self, session: &str, semaphore: &str) -> Option<u64> {
        let handle = self.recorder.invoke(Invocation::release(self.id, session, semaphore));
        let body = json!({ "session": session });
        let answer = self.call("POST", &format!("/v1/semaphores/{semaphore}/release"), body).await;
        let completion = self
            .complete(answer, |body| Completion { released: body["released"].as_u64(), ..Completion::ok() });
        let released = completion.released.filter(|_| completion.outcome == permit_check::Outcome::Ok);
        handle.complete(completion);
        released
    }

    /// A linearizable read of the holders.
    pub async fn describe(&mut self, semaphore: &str) -> Option<Vec<Holder>> {
        let handle = self.recorder.invoke(Invocation::describe(self.id, semaphore));
        let answer = self.call("GET", &format!("/v1/semaphores/{semaphore}"), Value::Null).await;
        let completion =
            self.complete(answer, |body| Completion { holders: holders(body), ..Completion::ok() });
        let read = (completion.outcome == permit_check::Outcome::Ok).then(|| completion.holders.clone());
        handle.complete(completion);
        read
    }

    /// Validates a token.
    pub async fn validate(&mut self, semaphore: &str, token: u64) -> Option<bool> {
        let handle = self.recorder.invoke(Invocation::validate(self.id, semaphore, token));
        let body = json!({ "token": token });
        let answer = self.call("POST", &format!("/v1/semaphores/{semaphore}/validate"), body).await;
        let completion =
            self.complete(answer, |body| Completion { valid: body["valid"].as_bool(), ..Completion::ok() });
        let valid = completion.valid.filter(|_| completion.outcome == permit_check::Outcome::Ok);
        handle.complete(completion);
        valid
    }

    /// Closes a session.
    pub async fn close_session(&mut self, session: &str) -> bool {
        let handle = self.recorder.invoke(Invocation::close_session(self.id, session));
        let answer = self.call("DELETE", &format!("/v1/sessions/{session}"), Value::Null).await;
        let completion = self.complete(answer, |_| Completion::ok());
        let ok = completion.outcome == permit_check::Outcome::Ok;
        handle.complete(completion);
        ok
    }

    /// Pushes one item with `payload` (JSON text) to `queue`; the item's id when acknowledged.
    pub async fn push(&mut self, queue: &str, payload: &str) -> Option<String> {
        let handle = self.recorder.invoke(Invocation::push(self.id, queue, payload));
        let value: Value = serde_json::from_str(payload).expect("the harness pushes JSON");
        let answer =
            self.call("POST", &format!("/v1/queues/{queue}/items"), json!({ "payload": value })).await;
        let completion = self.complete(answer, |body| match body["items"][0]["id"].as_str() {
            Some(id) => Completion { item: Some(id.to_owned()), ..Completion::ok() },
            None => Completion::unknown("push answered no item"),
        });
        let item = completion.item.clone().filter(|_| completion.outcome == permit_check::Outcome::Ok);
        handle.complete(completion);
        item
    }

    /// Claims at most one item of `queue` for `session`, waiting up to `wait_ms`, as the claim
    /// `request_id` (a retry sends the same). `Some(None)`: nothing was due; `None`: refused or
    /// unknown.
    pub async fn claim(
        &mut self,
        session: &str,
        queue: &str,
        request_id: u64,
        wait_ms: u64,
    ) -> Option<Option<Claimed>> {
        let handle = self.recorder.invoke(Invocation::claim(self.id, session, queue, request_id));
        let body = json!({ "session": session, "max": 1, "wait_ms": wait_ms, "request_id": request_id });
        let answer = self.call("POST", &format!("/v1/queues/{queue}/claim"), body).await;
        let completion = self.complete(answer, claim_completion);
        let claimed = claimed(&completion);
        handle.complete(completion);
        claimed
    }

    /// Acks a claimed item and claims the session's next item of `queue` in the same request
    /// (`"claim"` on the ack), waiting up to `wait_ms`, as the claim `request_id` (a retry sends
    /// the same): recorded as an ack and a claim, with the request's times and answer (both or
    /// neither apply). As [`Client::claim`]: `Some(None)` acked and nothing was due; `None`
    /// refused or unknown.
    pub async fn ack_and_claim(
        &mut self,
        session: &str,
        queue: &str,
        item: &Claimed,
        request_id: u64,
        wait_ms: u64,
    ) -> Option<Option<Claimed>> {
        let ack = self.recorder.invoke(Invocation::ack(self.id, session, queue, &item.id, item.token));
        let claim = self.recorder.invoke(Invocation::claim(self.id, session, queue, request_id));
        let next = json!({ "max": 1, "wait_ms": wait_ms, "request_id": request_id });
        let body = json!({ "session": session, "token": item.token, "claim": next });
        let answer = self.call("POST", &format!("/v1/queues/{queue}/items/{}/ack", item.id), body).await;
        let completion = self.complete(answer, claim_completion);
        ack.complete(Completion {
            outcome: completion.outcome,
            node: completion.node,
            raft_term: completion.raft_term,
            detail: completion.detail.clone(),
            ..Completion::ok()
        });
        let claimed = claimed(&completion);
        claim.complete(completion);
        claimed
    }

    /// Acks a claimed item: `Some(true)` done, `Some(false)` refused (`claim_lost`), `None`
    /// unknown.
    pub async fn ack(&mut self, session: &str, queue: &str, item: &Claimed) -> Option<bool> {
        let handle = self.recorder.invoke(Invocation::ack(self.id, session, queue, &item.id, item.token));
        let body = json!({ "session": session, "token": item.token });
        let answer = self.call("POST", &format!("/v1/queues/{queue}/items/{}/ack", item.id), body).await;
        self.settled(handle, answer)
    }

    /// Nacks a claimed item (pending again at once, or dead-lettered): as [`Client::ack`].
    pub async fn nack(&mut self, session: &str, queue: &str, item: &Claimed) -> Option<bool> {
        let handle = self.recorder.invoke(Invocation::nack(self.id, session, queue, &item.id, item.token));
        let body = json!({ "session": session, "token": item.token, "error": "harness nack" });
        let answer = self.call("POST", &format!("/v1/queues/{queue}/items/{}/nack", item.id), body).await;
        self.settled(handle, answer)
    }

    fn settled(&mut self, handle: permit_check::OpHandle, answer: Result<Answer, CallError>) -> Option<bool> {
        let completion = self.complete(answer, |_| Completion::ok());
        let result = match completion.outcome {
            permit_check::Outcome::Ok => Some(true),
            permit_check::Outcome::Fail => Some(false),
            permit_check::Outcome::Unknown => None,
        };
        handle.complete(completion);
        result
    }

    /// The recorder this client writes to.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }
}

/// An item a claim took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The item's id.
    pub id: String,
    /// The claim's fencing token.
    pub token: u64,
    /// The payload, as [`payload_text`] writes it.
    pub payload: String,
}

/// A claim's answer (`items`, at most one) as a completion.
fn claim_completion(body: &Value) -> Completion {
    match body["items"].as_array().map(Vec::as_slice) {
        Some([]) => Completion::ok(),
        Some([item]) => Completion {
            item: item["id"].as_str().map(str::to_owned),
            payload: Some(payload_text(&item["payload"])),
            token: item["token"].as_u64(),
            attempt: item["attempt"].as_u64().and_then(|a| u32::try_from(a).ok()),
            ..Completion::ok()
        },
        _ => Completion::unknown("claim answered more items than asked for"),
    }
}

/// What a claim's completion took: `Some(None)` nothing, `None` refused or unknown.
fn claimed(completion: &Completion) -> Option<Option<Claimed>> {
    (completion.outcome == permit_check::Outcome::Ok).then(|| {
        Some(Claimed {
            id: completion.item.clone()?,
            token: completion.token?,
            payload: completion.payload.clone()?,
        })
    })
}

/// A payload as the history records it: compact JSON text, whatever spacing the server kept.
pub fn payload_text(payload: &Value) -> String {
    payload.to_string()
}

/// The holders listed in a semaphore view.
pub fn holders(body: &Value) -> Vec<Holder> {
    body["holders"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|h| Holder {
                    session: h["session"].as_str().unwrap_or_default().to_owned(),
                    permits: h["permits"].as_u64().unwrap_or(0),
                    token: h["token"].as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default()
}
