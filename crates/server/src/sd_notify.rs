//! systemd's service notifications (sd_notify(3)) for `Type=notify` units, without libsystemd:
//! one datagram per state change to the socket named by `NOTIFY_SOCKET` (a path, or `@name` for
//! an abstract socket).
//!
//! - `READY=1` once the node would answer `/v1/health` with 200 (the readiness the probes see,
//!   `api::system::is_ready`), so that `systemctl start` returns when the node serves.
//! - `WATCHDOG=1` every `WATCHDOG_USEC / 2` while the unit sets a watchdog (`WatchdogSec=`) and
//!   the node is live (`/v1/health/live` would answer 200): a failed node stops petting, and so
//!   does one whose runtime is wedged (the petting task no longer runs), and systemd restarts it.
//! - `STOPPING=1` when the node begins to stop: on SIGTERM/SIGINT, or on a fail-stop.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) nothing is sent. A failed send is logged
//! once and otherwise ignored: notifications never stop a node.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

use crate::api::app::App;

/// How often the node's readiness is looked at until it is ready.
const READY_POLL: Duration = Duration::from_millis(50);

/// The notification socket of the service manager.
#[derive(Debug)]
pub struct SdNotify {
    socket: UnixDatagram,
    to: SocketAddr,
    /// Pet the watchdog this often (half of `WATCHDOG_USEC`), if it is set for this process.
    watchdog: Option<Duration>,
}

impl SdNotify {
    /// The socket named by `NOTIFY_SOCKET`, if set; `None` outside systemd.
    ///
    /// # Errors
    /// When the socket cannot be created or the variable names no valid address.
    pub fn from_env() -> std::io::Result<Option<SdNotify>> {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET").filter(|name| !name.is_empty()) else {
            return Ok(None);
        };
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
        let to = match bytes.strip_prefix(b"@") {
            Some(abstract_name) => {
                <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(abstract_name)?
            }
            None => SocketAddr::from_pathname(std::path::Path::new(&name))?,
        };
        let socket = UnixDatagram::unbound()?;
        // Never block the runtime: a service manager that does not read loses notifications.
        socket.set_nonblocking(true)?;
        Ok(Some(SdNotify { socket, to, watchdog: watchdog_interval() }))
    }

    /// Sends one notification (`READY=1`, ...).
    ///
    /// # Errors
    /// When the datagram cannot be sent.
    pub fn send(&self, state: &str) -> std::io::Result<()> {
        self.socket.send_to_addr(state.as_bytes(), &self.to).map(|_| ())
    }

    /// Sends `state`, logging a failure (a notification is never worth stopping for).
    fn notify(&self, state: &str) {
        if let Err(error) = self.send(state) {
            tracing::warn!(%error, state, "cannot notify the service manager (NOTIFY_SOCKET)");
        }
    }

    /// Tells the service manager the node begins to stop.
    pub(crate) fn stopping(&self) {
        self.notify("STOPPING=1");
    }

    /// Sends `READY=1` once the node of `app` is ready, then pets the watchdog while it is live; runs
    /// until the node stops (spawn it).
    pub(crate) async fn run(self: Arc<Self>, app: Arc<App>) {
        let mut shutdown = app.shutdown.clone();
        let ready = async {
            while !crate::api::system::is_ready(&app) {
                tokio::time::sleep(READY_POLL).await;
            }
            self.notify("READY=1");
            tracing::info!("ready: notified the service manager");
        };
        let watchdog = async {
            let Some(every) = self.watchdog else { return std::future::pending().await };
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if crate::api::system::is_live(&app) {
                    self.notify("WATCHDOG=1");
                }
            }
        };
        let stopped = async {
            let _ = shutdown.wait_for(|stopping| *stopping).await;
        };
        tokio::select! {
            () = async { tokio::join!(ready, watchdog); } => {}
            () = stopped => {}
            _ = app.fail_stop.wait() => {}
        }
    }
}

/// Half the watchdog timeout systemd set for this process (`WATCHDOG_USEC`, and `WATCHDOG_PID`
/// when it names this process), as sd_watchdog_enabled(3) advises; `None` without a watchdog.
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok().filter(|&usec| usec > 0)?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}
