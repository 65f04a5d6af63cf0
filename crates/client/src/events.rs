//! `GET /v1/events`: a node's applied state changes as Server-Sent Events, read frame by frame,
//! reconnecting with `Last-Event-ID` when the connection drops.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::Client;

/// Pause before reconnecting a dropped stream; doubles up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// Reconnections in a row (without a frame between) before the stream gives up.
const RECONNECTS_MAX: u32 = 8;

/// One frame of the event stream.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamEvent {
    /// The event's seq on the node that sent it (absent on a `missed` frame).
    pub id: Option<u64>,
    /// The kind (`granted`, `released`, ..., or `missed`).
    pub kind: String,
    /// The `data:` JSON: `seq`, `index`, `now_ms`, `kind` and the fields that apply
    /// (`docs/observability.md`); for `missed`, `requested` and `first_available`.
    pub data: serde_json::Value,
}

/// What [`Client::events`] streams.
#[derive(Clone, Debug, Default)]
pub struct EventsOptions {
    /// Only object events whose name starts with this (session events pass only when empty).
    pub prefix: Option<String>,
    /// Only these kinds (all when empty).
    pub kinds: Vec<String>,
    /// Resume after this event seq (`Last-Event-ID`); `None` streams new events only.
    pub after: Option<u64>,
}

/// An open event stream; [`EventStream::next`] yields frames as they come.
pub struct EventStream {
    client: Client,
    options: EventsOptions,
    response: Option<reqwest::Response>,
    endpoint: String,
    buffer: Vec<u8>,
    /// Seq of the last event received, for resuming.
    last: Option<u64>,
}

impl Client {
    /// `GET /v1/events`: opens the event stream of the node this client reaches.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let options = permit_client::EventsOptions { prefix: Some("gpu".into()), ..Default::default() };
    /// let mut events = client.events(options).await?;
    /// while let Some(event) = events.next().await? {
    ///     println!("{} {}", event.kind, event.data);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for an unknown kind, `permission_denied`, and transport errors.
    pub async fn events(&self, options: EventsOptions) -> Result<EventStream> {
        let mut stream = EventStream {
            client: self.clone(),
            last: options.after,
            options,
            response: None,
            endpoint: String::new(),
            buffer: Vec::new(),
        };
        stream.connect().await?;
        Ok(stream)
    }
}

impl EventStream {
    async fn connect(&mut self) -> Result<()> {
        let mut query = Vec::new();
        if let Some(prefix) = &self.options.prefix {
            query.push(("prefix", prefix.clone()));
        }
        if !self.options.kinds.is_empty() {
            query.push(("kinds", self.options.kinds.join(",")));
        }
        let headers: Vec<(&'static str, String)> =
            self.last.map(|last| ("Last-Event-ID", last.to_string())).into_iter().collect();
        let (endpoint, response) = self.client.transport.open_stream("/v1/events", &query, &headers).await?;
        self.endpoint = endpoint;
        self.response = Some(response);
        self.buffer.clear();
        Ok(())
    }

    /// The next frame; keepalive comments are skipped. A dropped connection is reopened (on any
    /// endpoint) resuming after the last event seen; a node other than the one before numbers
    /// its events anew, so expect a `missed` frame then.
    ///
    /// # Errors
    ///
    /// When the stream cannot be reopened after several attempts.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>> {
        let mut reconnects = 0;
        let mut pause = RECONNECT_MIN;
        loop {
            if let Some(frame) = self.take_frame() {
                match frame {
                    Some(event) => {
                        if event.id.is_some() {
                            self.last = event.id;
                        }
                        return Ok(Some(event));
                    }
                    None => continue,
                }
            }
            let chunk = match self.response.as_mut() {
                Some(response) => response.chunk().await,
                None => Ok(None),
            };
            if let Ok(Some(bytes)) = chunk {
                self.buffer.extend_from_slice(&bytes);
                continue;
            }
            // The stream ended or broke: reopen it after the last event.
            self.response = None;
            loop {
                reconnects += 1;
                if reconnects > RECONNECTS_MAX {
                    return Err(Error::Transport {
                        endpoint: self.endpoint.clone(),
                        source: "the event stream kept closing".into(),
                    });
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RECONNECT_MAX);
                match self.connect().await {
                    Ok(()) => break,
                    Err(error @ Error::Api { .. }) => return Err(error),
                    Err(_) => continue,
                }
            }
        }
    }

    /// Takes one complete frame from the buffer: `Some(Some(event))`, `Some(None)` for a comment
    /// or an empty block, `None` when no complete frame is buffered.
    fn take_frame(&mut self) -> Option<Option<StreamEvent>> {
        let end = self.buffer.windows(2).position(|pair| pair == b"\n\n")?;
        let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
        let text = String::from_utf8_lossy(&block);
        let (mut id, mut kind, mut data) = (None, None, None);
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("id:") {
                id = value.trim().parse().ok();
            } else if let Some(value) = line.strip_prefix("event:") {
                kind = Some(value.trim().to_owned());
            } else if let Some(value) = line.strip_prefix("data:") {
                data = serde_json::from_str(value.trim()).ok();
            }
        }
        Some(kind.map(|kind| StreamEvent { id, kind, data: data.unwrap_or(serde_json::Value::Null) }))
    }
}
