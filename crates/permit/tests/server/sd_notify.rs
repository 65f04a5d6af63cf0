//! systemd's notifications (`Type=notify`, `WatchdogSec=`) through a real notify socket this
//! test opens, without systemd: `READY=1` only once `/v1/health` answers 200, `WATCHDOG=1` every
//! `WATCHDOG_USEC / 2` while the node is live (and no more once it failed), `STOPPING=1` on
//! SIGTERM and on a fail-stop.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::net::UnixDatagram;

use super::full_disk::write_until_it_stops;
use super::sync_shim;
use crate::common::{permit_bin, write_cluster_secret, Server};

/// Longest a notification that must come may take.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(20);

/// A notify socket as systemd opens it, bound to a path or to an abstract name.
struct NotifySocket {
    socket: UnixDatagram,
    /// The value of `NOTIFY_SOCKET` for the server.
    name: String,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn at_path() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket { socket, name: path.to_str().unwrap().to_owned(), _dir: dir }
    }

    fn abstract_name() -> NotifySocket {
        use std::os::linux::net::SocketAddrExt;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("permit-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket =
            std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind the abstract notify socket");
        socket.set_nonblocking(true).unwrap();
        let socket = UnixDatagram::from_std(socket).unwrap();
        NotifySocket { socket, name: format!("@{name}"), _dir: tempfile::tempdir().unwrap() }
    }

    /// The next notification, or `None` after `timeout`.
    async fn next(&self, timeout: Duration) -> Option<String> {
        let mut buffer = vec![0u8; 4096];
        let size = tokio::time::timeout(timeout, self.socket.recv(&mut buffer)).await.ok()?.expect("recv");
        Some(String::from_utf8(buffer[..size].to_vec()).expect("a UTF-8 notification"))
    }

    /// The notifications up to and including the first that is `state`, within `timeout`;
    /// `None` if `state` did not come.
    async fn until(&self, state: &str, timeout: Duration) -> Option<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Some(message) = self.next(deadline.saturating_duration_since(Instant::now())).await {
            let found = message.lines().any(|line| line == state);
            seen.push(message);
            if found {
                return Some(seen);
            }
        }
        None
    }
}

/// `permit serve` on an ephemeral port with `args`, notifying `socket`, with `env`.
fn serve(socket: &NotifySocket, data_dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut command = Command::new(permit_bin());
    command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir).args(args);
    command.env("NOTIFY_SOCKET", &socket.name).envs(env.iter().copied());
    Server::spawn(command)
}

async fn health(http: &reqwest::Client, server: &Server) -> u16 {
    let answer = http.get(format!("{}/v1/health", server.url)).timeout(Duration::from_secs(5)).send().await;
    answer.expect("health answers").status().as_u16()
}

/// A node started with `--join` answers health 503 until it is initialised: no `READY=1` before,
/// one after, when health answers 200.
#[tokio::test]
async fn ready_comes_only_once_health_answers_200() {
    let temp = tempfile::tempdir().unwrap();
    let socket = NotifySocket::at_path();
    let secret = write_cluster_secret(temp.path());
    let secret = secret.to_str().unwrap();
    let server = serve(&socket, &temp.path().join("data"), &["--join", "--cluster-secret-file", secret], &[]);
    let http = reqwest::Client::new();
    assert_eq!(health(&http, &server).await, 503, "a joining node is not ready");
    // Absence can only be shown for a while: a node that notified at start, or on a timer,
    // has done so by now.
    if let Some(message) = socket.next(Duration::from_secs(1)).await {
        panic!("notified {message:?} while health answers 503");
    }
    let init = http
        .post(format!("{}/v1/cluster/init", server.url))
        .json(&serde_json::json!({ "members": [{ "id": 1, "addr": server.addr }] }))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("init");
    assert!(init.status().is_success(), "init: {}", init.text().await.unwrap_or_default());
    let seen = socket.until("READY=1", NOTIFY_TIMEOUT).await.expect("READY=1 once the node is initialised");
    assert_eq!(seen, ["READY=1"]);
    assert_eq!(health(&http, &server).await, 200, "READY=1 came while health answers 200");
}

/// With `WATCHDOG_USEC` set, `WATCHDOG=1` comes every half of it (to an abstract socket); on
/// SIGTERM `STOPPING=1` comes, the petting stops and the node exits 0. A `WATCHDOG_PID` of
/// another process means the watchdog is not this node's.
#[tokio::test]
async fn the_watchdog_is_pet_and_sigterm_notifies_stopping() {
    let temp = tempfile::tempdir().unwrap();
    let socket = NotifySocket::abstract_name();
    let mut server = serve(&socket, &temp.path().join("data"), &[], &[("WATCHDOG_USEC", "200000")]);
    socket.until("READY=1", NOTIFY_TIMEOUT).await.expect("READY=1");
    let started = Instant::now();
    for pet in 0..3 {
        let seen = socket.until("WATCHDOG=1", NOTIFY_TIMEOUT).await;
        assert_eq!(seen.as_deref(), Some(&["WATCHDOG=1".to_owned()][..]), "pet {pet}");
    }
    // Three pets 100 ms apart (the first at once): not much sooner than 200 ms.
    assert!(started.elapsed() >= Duration::from_millis(150), "pets every {:?}", started.elapsed() / 3);
    // SAFETY: a signal to our own child, by its PID.
    assert_eq!(unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) }, 0);
    socket.until("STOPPING=1", NOTIFY_TIMEOUT).await.expect("STOPPING=1 on SIGTERM");
    let status = server.wait_exit(NOTIFY_TIMEOUT).await.expect("the node exits after SIGTERM");
    assert!(status.success(), "{status}");
    while let Some(message) = socket.next(Duration::ZERO).await {
        assert_ne!(message, "WATCHDOG=1", "a pet after STOPPING=1");
    }

    let socket = NotifySocket::abstract_name();
    let env = [("WATCHDOG_USEC", "200000"), ("WATCHDOG_PID", "1")];
    let _other = serve(&socket, &temp.path().join("other"), &[], &env);
    assert_eq!(socket.until("READY=1", NOTIFY_TIMEOUT).await.as_deref(), Some(&["READY=1".to_owned()][..]));
    if let Some(message) = socket.next(Duration::from_secs(1)).await {
        panic!("notified {message:?}: the watchdog belongs to another process");
    }
}

/// A node that fail-stops (its fsyncs fail) notifies `STOPPING=1` and pets the watchdog no
/// more while it lingers before its exit, so that systemd restarts it.
#[tokio::test]
async fn a_failed_node_stops_petting_the_watchdog() {
    let temp = tempfile::tempdir().unwrap();
    let Some(shim) = sync_shim::build(temp.path()) else { return };
    let socket = NotifySocket::abstract_name();
    let env = [
        ("WATCHDOG_USEC", "100000"),
        ("LD_PRELOAD", shim.to_str().unwrap()),
        ("PERMIT_FAIL_SYNC_AFTER", "200"),
    ];
    let mut server = serve(&socket, &temp.path().join("data"), &[], &env);
    socket.until("READY=1", NOTIFY_TIMEOUT).await.expect("READY=1");
    socket.until("WATCHDOG=1", NOTIFY_TIMEOUT).await.expect("pets while serving");
    // Read what it sends while the writers run (a full socket would drop notifications).
    let reader = tokio::spawn(async move {
        let mut messages = Vec::new();
        // Bounded: the node exits within the writers' minute and its linger, then stays silent.
        while let Some(message) = socket.next(Duration::from_secs(5)).await {
            messages.push(message);
            assert!(messages.len() < 10_000, "a flood of notifications");
        }
        messages
    });
    let (status, seen, _) = write_until_it_stops(&mut server, 2, Duration::from_secs(60)).await;
    assert!(seen.storage_error.is_some(), "the node failed on its fsyncs");
    assert!(!status.expect("the failed node exits").success());
    // Everything it sent: pets while it served, then STOPPING=1 and nothing more, although it
    // lingered (answering 503) for longer than many watchdog periods.
    let messages = reader.await.unwrap();
    let stopping = messages.iter().position(|m| m == "STOPPING=1").expect("STOPPING=1 on the fail-stop");
    assert_eq!(messages.len(), stopping + 1, "after STOPPING=1: {:?}", &messages[stopping..]);
}
