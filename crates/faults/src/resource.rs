//! The protected resource of the fenced workloads: a counter that remembers the largest token
//! it has seen on any request and refuses requests with a smaller one (Kleppmann's fencing).
//! It also serves HTTP, so that a client in another process (one the harness pauses) can write.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

#[derive(Default, Debug, Clone, Copy)]
struct Cell {
    max_token: u64,
    value: u64,
}

/// Fenced counters by name.
#[derive(Default, Clone)]
pub struct Resource {
    cells: Arc<Mutex<BTreeMap<String, Cell>>>,
    unfenced: Arc<AtomicBool>,
}

impl Resource {
    /// Turns fencing off (or on again): a control run, to show what fencing prevents.
    pub fn set_unfenced(&self, unfenced: bool) {
        self.unfenced.store(unfenced, Ordering::SeqCst);
    }

    fn stale(&self, token: u64, cell: &Cell) -> bool {
        token < cell.max_token && !self.unfenced.load(Ordering::SeqCst)
    }

    /// Reads counter `name` with `token`; `None` when the token is stale.
    pub fn read(&self, name: &str, token: u64) -> Option<u64> {
        let mut cells = self.cells.lock().expect("resource lock");
        let cell = cells.entry(name.to_owned()).or_default();
        if self.stale(token, cell) {
            return None;
        }
        cell.max_token = cell.max_token.max(token);
        Some(cell.value)
    }

    /// Writes `value` to counter `name` with `token`; false when the token is stale.
    pub fn write(&self, name: &str, token: u64, value: u64) -> bool {
        let mut cells = self.cells.lock().expect("resource lock");
        let cell = cells.entry(name.to_owned()).or_default();
        if self.stale(token, cell) {
            return false;
        }
        cell.max_token = cell.max_token.max(token);
        cell.value = value;
        true
    }

    /// The counter's value now.
    pub fn value(&self, name: &str) -> u64 {
        self.cells.lock().expect("resource lock").get(name).map_or(0, |c| c.value)
    }

    /// Serves `POST /write {name, token}` (increments; 200 accepted, 409 stale) on `listen`.
    pub async fn serve(
        &self,
        listen: SocketAddr,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let resource = self.clone();
        let app = axum::Router::new().route(
            "/write",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let resource = resource.clone();
                async move {
                    let name = body["name"].as_str().unwrap_or("victim").to_owned();
                    let token = body["token"].as_u64().unwrap_or(0);
                    let accepted = match resource.read(&name, token) {
                        Some(value) => resource.write(&name, token, value + 1),
                        None => false,
                    };
                    let status = if accepted { 200 } else { 409 };
                    (
                        axum::http::StatusCode::from_u16(status).expect("status"),
                        axum::Json(json!({ "accepted": accepted })),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((addr, task))
    }
}
