//! The listener against real `permit serve` processes: the header-read timeout (slowloris), the
//! connection cap, shutdown with a long-poll open, HTTPS with the Rust client and the CLI, plain
//! HTTP on a TLS port, client certificates, and a 3-node cluster over TLS. Certificates are made
//! at test time.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::api::Api;
use common::{eventually, permit_bin, Cluster, Connections, Server};
use permit_client::{AcquireOptions, Client, ErrorCode};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Longest any step below may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// A private CA with one server certificate (for `localhost` and 127.0.0.1, usable as a client
/// certificate too, as nodes present it to their peers) and one client certificate, in PEM
/// files of a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new() -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "permit test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>, name: &str| {
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages =
                vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()], "permit node");
        let (client_cert, client_key) = leaf(Vec::new(), "permit client");
        let dir = tempfile::tempdir().unwrap();
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server_cert),
            ("server-key.pem", server_key),
            ("client.pem", client_cert.clone()),
            ("client-key.pem", client_key.clone()),
        ] {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        Pki { dir, ca: ca.pem(), client_cert, client_key }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `permit serve` arguments for HTTPS, plus `more`.
    fn serve_args(&self, more: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--tls-cert".to_owned(),
            self.path("server.pem"),
            "--tls-key".to_owned(),
            self.path("server-key.pem"),
        ];
        args.extend(more.iter().map(|s| s.to_string()));
        args
    }

    /// A raw HTTP client trusting only this CA, presenting the client certificate if `identity`.
    fn http(&self, identity: bool) -> reqwest::Client {
        permit_client::install_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(self.ca.as_bytes()).unwrap());
        if identity {
            let pem = format!("{}\n{}", self.client_cert, self.client_key);
            builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        builder.build().unwrap()
    }
}

/// A single node in a temp dir with these extra arguments.
fn start(extra: &[String]) -> (Server, tempfile::TempDir) {
    let temp = tempfile::tempdir().unwrap();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    (Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &extra), temp)
}

/// Reads until the server closes the connection (or `PATIENCE` passes: a failure).
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

fn cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(permit_bin()).arg("--server").arg(url).args(args).output().expect("run permit")
}

#[test]
fn a_client_that_sends_half_a_request_line_is_cut_off_after_the_header_read_timeout() {
    let (server, _temp) = start(&["--header-read-timeout".into(), "300ms".into()]);
    let started = Instant::now();
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.write_all(b"GET /v1/hea").unwrap();
    read_until_closed(&mut slow);
    assert!(started.elapsed() >= Duration::from_millis(250), "closed after {:?}", started.elapsed());
    // A client that sends its request in time is served.
    let mut prompt = TcpStream::connect(&server.addr).unwrap();
    prompt.write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let answer = read_until_closed(&mut prompt);
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    // A kept-alive connection that goes idle after its answer is closed as well.
    let mut idle = TcpStream::connect(&server.addr).unwrap();
    idle.write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let answer = read_until_closed(&mut idle);
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_and_clients_get_answers_after_the_flood() {
    let (server, _temp) = start(&["--connections-max".into(), "8".into()]);
    let flood: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&server.addr).unwrap()).collect();
    // The listener accepts in order: the ninth connection finds the cap reached and is closed
    // without an answer.
    let mut ninth = TcpStream::connect(&server.addr).unwrap();
    let _ = ninth.write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n");
    assert_eq!(read_until_closed(&mut ninth), b"", "the ninth connection was served");
    drop(flood);
    let api = Api::new(&server);
    let served = eventually(PATIENCE, async || {
        let Ok(answer) = api.http.get(format!("{}/v1/health", api.url)).send().await else { return false };
        answer.status() == 200
    })
    .await;
    assert!(served, "no answer after the flood ended");
    let metrics = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("permit_connections_refused_total{reason=\"cap\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_an_open_long_poll_early_and_the_server_exits() {
    let (mut server, _temp) = start(&[]);
    let client = Client::new(&server.url).unwrap();
    let view = client.put_semaphore("quiet", 1).await.unwrap();
    let watcher = client.clone();
    let watch =
        tokio::spawn(
            async move { watcher.watch_semaphore("quiet", view.index, Duration::from_secs(60)).await },
        );
    // The long-poll's connection is open once the server counts two (it and this probe's).
    let api = Api::new(&server);
    let open = eventually(PATIENCE, async || {
        let Ok(answer) = api.http.get(format!("{}/metrics", api.url)).send().await else { return false };
        let metrics = answer.text().await.unwrap_or_default();
        metrics.lines().any(|line| {
            line.strip_prefix("permit_connections_open ").and_then(|n| n.parse::<u64>().ok()) >= Some(2)
        })
    })
    .await;
    assert!(open, "the long-poll never connected");
    // SAFETY: sending a signal to our own child by its PID.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) };
    let ended = tokio::time::timeout(PATIENCE, watch).await;
    assert!(ended.is_ok(), "the long-poll outlived the shutdown");
    let exited = tokio::task::spawn_blocking(move || server.wait_for_exit(PATIENCE)).await.unwrap();
    assert!(exited.is_some(), "the server did not exit after SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_the_rust_client_and_the_cli() {
    let pki = Pki::new();
    let (server, _temp) = start(&pki.serve_args(&[]));
    assert!(server.url.starts_with("https://"), "{}", server.url);

    let client = Client::builder([&server.url]).ca_pem(pki.ca.clone()).build().unwrap();
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    // Kept: the listing below shows it after the release.
    let options = AcquireOptions { capacity: Some(2), ephemeral: false, ..AcquireOptions::default() };
    let permit = session.acquire_with("tls.rust", 1, &options).await.unwrap().expect("granted");
    assert!(permit.token() > 0);
    permit.release().await.unwrap();
    session.close().await.unwrap();

    let ca = pki.path("ca.pem");
    let set = cli(&server.url, &["--ca-file", &ca, "set-capacity", "tls.cli", "3"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let ls = Command::new(permit_bin())
        .args(["ls", "--server", &server.url])
        .env("PERMIT_CA_FILE", &ca)
        .output()
        .unwrap();
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(listing.contains("tls.cli") && listing.contains("tls.rust"), "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_a_clear_400() {
    let pki = Pki::new();
    let (server, _temp) = start(&pki.serve_args(&[]));
    let mut plain = TcpStream::connect(&server.addr).unwrap();
    plain.write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let answer = String::from_utf8(read_until_closed(&mut plain)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (_, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let body: permit_wire::ErrorBody = serde_json::from_str(body).unwrap();
    assert_eq!(body.error.code, ErrorCode::TlsRequired);
    assert!(body.error.message.contains("https://"), "{}", body.error.message);

    // The Rust client says the same.
    let client = Client::new(&format!("http://{}", server.addr)).unwrap();
    let error = client.health().await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::TlsRequired), "{error:?}");

    // The CLI fails at once with 78 (a configuration mistake), saying to use https://: after one
    // connection, without the retries of a transient error.
    let counted = Connections::to(&server.addr).await;
    let url = counted.url.clone();
    let output = tokio::task::spawn_blocking(move || cli(&url, &["ls"])).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("https://"), "{stderr}");
    assert_eq!(counted.count(), 1, "connections made: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_client_ca_only_clients_with_a_certificate_get_in() {
    let pki = Pki::new();
    let (server, _temp) = start(&pki.serve_args(&["--tls-client-ca", &pki.path("ca.pem")]));
    let health = format!("{}/v1/health", server.url);

    let anonymous = pki.http(false).get(&health).send().await;
    assert!(anonymous.is_err(), "served without a client certificate: {anonymous:?}");
    let http = pki.http(true);
    let healthy = eventually(PATIENCE, async || {
        http.get(&health).send().await.expect("served with a client certificate").status() == 200
    })
    .await;
    assert!(healthy, "never healthy");

    let ls = cli(
        &server.url,
        &[
            "--ca-file",
            &pki.path("ca.pem"),
            "--client-cert",
            &pki.path("client.pem"),
            "--client-key",
            &pki.path("client-key.pem"),
            "ls",
        ],
    );
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_over_tls_elects_a_leader_and_replicates_a_write() {
    let pki = Pki::new();
    // Client certificates required everywhere: nodes present theirs to each other.
    let args = pki.serve_args(&["--tls-client-ca", &pki.path("ca.pem")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::start_with(3, &args, pki.http(true)).await;
    assert!(cluster.nodes.iter().all(|n| n.url.starts_with("https://")));
    let leader = cluster.leader(PATIENCE).await.expect("a leader");
    let follower = (leader + 1) % 3;

    // A write sent to a follower is forwarded to the leader over HTTPS and replicated.
    let api = Api { http: pki.http(true), url: cluster.nodes[follower].url.clone() };
    let put =
        api.send("PUT", "/v1/semaphores/tls.replicated", Some(serde_json::json!({"capacity": 5}))).await;
    assert!(put.status < 300, "{put:?}");
    for node in &cluster.nodes {
        let api = Api { http: pki.http(true), url: node.url.clone() };
        let replicated = eventually(PATIENCE, async || {
            api.get("/v1/semaphores/tls.replicated?stale=true").await.body["capacity"] == 5
        })
        .await;
        assert!(replicated, "node {} did not apply the write", node.url);
    }
}

/// Finding: `cluster add` could not work on a TLS cluster, since the leader probed the new
/// node's health over `http://`. It probes with the cluster's scheme now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_grows_with_cluster_add() {
    let pki = Pki::new();
    let args = pki.serve_args(&["--tls-client-ca", &pki.path("ca.pem")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start_with(3, &args, pki.http(true)).await;
    let leader = cluster.leader(PATIENCE).await.expect("a leader");
    let joiner = cluster.start_joiner_with(4, &args);
    let api = Api { http: pki.http(true), url: cluster.nodes[leader].url.clone() };
    let body = serde_json::json!({ "id": 4, "addr": cluster.nodes[joiner].addr });
    let added = api.send("POST", "/v1/cluster/members", Some(body)).await;
    assert_eq!(added.status, 200, "{added:?}");
    let put = api.send("PUT", "/v1/semaphores/tls.grown", Some(serde_json::json!({"capacity": 2}))).await;
    assert!(put.status < 300, "{put:?}");
    let new_node = Api { http: pki.http(true), url: cluster.nodes[joiner].url.clone() };
    let replicated = eventually(PATIENCE, async || {
        new_node.get("/v1/semaphores/tls.grown?stale=true").await.body["capacity"] == 2
    })
    .await;
    assert!(replicated, "the added node applies the cluster's log");
}

/// Every health probe goes through the node's one peer client, over HTTPS on a TLS cluster: the
/// cluster view reaches every member, and a node removed from a TLS cluster finds out from the
/// other members' health (its own log usually never drops it: the leader stops replicating to it
/// first), then says so and stops campaigning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_from_a_tls_cluster_finds_out_from_the_others() {
    let pki = Pki::new();
    let args = pki.serve_args(&["--tls-client-ca", &pki.path("ca.pem")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::start_with(3, &args, pki.http(true)).await;
    let leader = cluster.leader(PATIENCE).await.expect("a leader");
    let api = Api { http: pki.http(true), url: cluster.nodes[leader].url.clone() };
    let view = api.get("/v1/cluster").await;
    assert_eq!(view.status, 200, "{view:?}");
    let members = view.body["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{view:?}");
    assert!(members.iter().all(|m| m["reachable"] == true), "a member's probe failed: {view:?}");

    let removed = (leader + 1) % 3;
    let id = removed + 1;
    let answer = api.send("DELETE", &format!("/v1/cluster/members/{id}"), None).await;
    assert_eq!(answer.status, 204, "{answer:?}");
    let node = Api { http: pki.http(true), url: cluster.nodes[removed].url.clone() };
    let mut last = None;
    let said_removed = eventually(PATIENCE, async || {
        let health = node.get("/v1/health").await;
        let removed = health.status == 503 && health.body["reason"] == "removed";
        last = Some(health);
        removed
    })
    .await;
    assert!(said_removed, "node {id} never said it was removed: {last:?}");
}

/// Writes `request` on a new connection to `addr` and returns the connection.
fn send_raw(addr: &str, request: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request).unwrap();
    stream
}

/// The status code of a raw HTTP answer (0 for none) and its JSON error code, if any.
fn status_and_code(answer: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(answer);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let code = text
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
        .and_then(|body| body["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, code)
}

/// Reads one answer's head (and whatever body came with it) from a kept-alive connection:
/// until the end of the head and `content-length` bytes more, the connection closes, or
/// `PATIENCE` passes (a failure).
fn read_answer(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&received).to_lowercase();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return received;
            }
        }
        match stream.read(&mut buffer) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("no answer: {e}"),
        }
    }
}

/// The head of a POST whose body (`length` bytes announced) the caller sends, or not.
fn post_head(path: &str, token: Option<&str>, length: usize) -> String {
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}content-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    )
}

/// The root secret of the `--auth` clusters below.
const ROOT: &str = "listener-root-secret-0123456789abcdef";

/// Issue 28, finding 6: a follower read the body of a request it forwards before anyone checked
/// its token, with no time limit, so slow-body connections without a token held every slot.
/// Now a follower refuses such a request before reading its body (`401`, connection closed),
/// and a client with a token is served meanwhile; a slow body with a valid token is cut off
/// within the header-read timeout on the way to the leader (`408 body_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_slow_bodies_without_a_token_before_reading_them() {
    let args = ["--connections-max", "64", "--header-read-timeout", "1s"];
    let cluster = Cluster::start_secured(3, ROOT, &args).await;
    let leader = cluster.leader(PATIENCE).await.expect("a leader");
    let follower = &cluster.nodes[(leader + 1) % 3];
    let root = Api::with_token(&follower.url, ROOT);
    let ready =
        eventually(PATIENCE, async || root.get("/v1/acl/tokens/self?stale=true").await.status == 200).await;
    assert!(ready, "the follower never knew the root token");

    // The attack: heads of writes without a token (or with a wrong one), then a trickle of body.
    let addr = follower.addr.clone();
    let attack = tokio::task::spawn_blocking(move || {
        let slow: Vec<TcpStream> = (0..24)
            .map(|i| {
                let token = (i % 2 == 1).then_some("not-a-token-of-this-cluster");
                let head = post_head("/v1/semaphores/starved/acquire", token, 1000);
                send_raw(&addr, format!("{head}{{\"session\":").as_bytes())
            })
            .collect();
        slow.into_iter()
            .map(|mut stream| {
                let started = Instant::now();
                let answer = read_until_closed(&mut stream);
                (status_and_code(&answer), started.elapsed())
            })
            .collect::<Vec<_>>()
    });
    let answers = attack.await.unwrap();
    for ((status, code), took) in &answers {
        assert_eq!((*status, code.as_str()), (401, "unauthenticated"), "{answers:?}");
        assert!(*took < Duration::from_secs(5), "answered after {took:?}: {answers:?}");
    }
    // A client with a token is served by the follower (forwarded to the leader).
    let put = root.send("PUT", "/v1/semaphores/served", Some(serde_json::json!({"capacity": 1}))).await;
    assert!(put.status < 300, "{put:?}");

    // A valid token whose body never arrives whole: cut off within the header-read timeout.
    let addr = follower.addr.clone();
    let (answer, took) = tokio::task::spawn_blocking(move || {
        let head = post_head("/v1/semaphores/served/acquire", Some(ROOT), 1000);
        let mut stream = send_raw(&addr, format!("{head}{{\"session\":").as_bytes());
        let started = Instant::now();
        (read_until_closed(&mut stream), started.elapsed())
    })
    .await
    .unwrap();
    assert_eq!(
        status_and_code(&answer),
        (408, "body_timeout".to_owned()),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
}

/// Issue 28, finding 6: a body that trickles in (a byte every 50 ms) is cut off once the
/// header-read timeout has passed since its head, with `408 body_timeout`, and the connection
/// closes; a body sent whole is served.
#[test]
fn a_trickled_body_is_cut_off_within_the_header_read_timeout() {
    let (server, _temp) = start(&["--header-read-timeout".into(), "500ms".into()]);
    let mut slow = send_raw(&server.addr, post_head("/v1/sessions", None, 10_000).as_bytes());
    let mut writer = slow.try_clone().unwrap();
    let started = Instant::now();
    let trickle = std::thread::spawn(move || {
        // The attacker's pace, bounded: at most 10 s of it, and stop once the server hung up.
        for _ in 0..200 {
            if writer.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let answer = read_until_closed(&mut slow);
    let took = started.elapsed();
    assert_eq!(
        status_and_code(&answer),
        (408, "body_timeout".to_owned()),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(5), "cut off after {took:?}");
    drop(slow);
    trickle.join().unwrap();
    // A request whose body is sent whole is served as before.
    let body = r#"{"ttl_ms": 10000}"#;
    let mut prompt =
        send_raw(&server.addr, format!("{}{body}", post_head("/v1/sessions", None, body.len())).as_bytes());
    let answer = read_answer(&mut prompt);
    assert_eq!(status_and_code(&answer).0, 201, "{}", String::from_utf8_lossy(&answer));
}

/// A connection from `source` (a loopback address of this machine other than 127.0.0.1, say)
/// to `addr`.
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(addr.parse().unwrap()).await.unwrap();
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Issue 28, finding 6: one source address cannot take every connection slot
/// (`--connections-per-client-max`): its connections beyond its share are refused and counted
/// with `reason="per_client"`, while another address still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection_slot() {
    let (server, _temp) =
        start(&["--connections-max".into(), "8".into(), "--connections-per-client-max".into(), "3".into()]);
    const HEALTH: &[u8] = b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = connect_from("127.0.0.2", &server.addr).await;
        stream.write_all(HEALTH).unwrap();
        assert_eq!(status_and_code(&read_answer(&mut stream)).0, 200);
        held.push(stream);
    }
    let mut fourth = connect_from("127.0.0.2", &server.addr).await;
    let _ = fourth.write_all(HEALTH);
    assert_eq!(read_until_closed(&mut fourth), b"", "a fourth connection from one address was served");
    // Another address is served, and the refusal is counted.
    let api = Api::new(&server);
    let metrics = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("permit_connections_refused_total{reason=\"per_client\"} 1"), "{metrics}");
    // Once one of its connections closes, the address gets a place again.
    drop(held.pop());
    let served = eventually(PATIENCE, async || {
        let mut stream = connect_from("127.0.0.2", &server.addr).await;
        let _ = stream.write_all(HEALTH);
        tokio::task::spawn_blocking(move || {
            status_and_code(&read_until_closed_or_answer(&mut stream)).0 == 200
        })
        .await
        .unwrap()
    })
    .await;
    assert!(served, "the address never got its place back");
}

/// Reads one answer, or nothing if the server closes the connection first.
fn read_until_closed_or_answer(stream: &mut TcpStream) -> Vec<u8> {
    read_answer(stream)
}

/// Issue 28, finding 6: the connection slots peers need are kept apart from the clients'. With
/// every client slot of the leader held by connections from clients (that send nothing more),
/// a follower still opens a new connection to the leader, in a peer slot, and forwards a write
/// there; a client connection that lands in a peer slot is refused `429 limit_exceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_still_connect_when_the_client_slots_are_full() {
    let args = ["--connections-max", "8", "--header-read-timeout", "30s"];
    let cluster = Cluster::start(3, &args).await;
    let leader = cluster.leader(PATIENCE).await.expect("a leader");
    let follower = &cluster.nodes[(leader + 1) % 3];
    let addr = cluster.nodes[leader].addr.clone();
    // Fill the leader's client slots: keep every connection that was served; stop at the first
    // that is refused (or closed without an answer).
    let (held, refusal) = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        for _ in 0..32 {
            let mut stream = send_raw(&addr, b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
            let answer = read_answer(&mut stream);
            match status_and_code(&answer) {
                (200, _) => held.push(stream),
                refused => return (held, refused),
            }
        }
        panic!("32 connections and the client slots are not full");
    })
    .await
    .unwrap();
    assert!(!held.is_empty());
    // The follower has never sent the leader anything: forwarding opens a new connection.
    let api = Api::at(&follower.url);
    let put =
        api.send("PUT", "/v1/semaphores/through.the.reserve", Some(serde_json::json!({"capacity": 2}))).await;
    assert!(put.status < 300, "the follower could not reach the leader: {put:?}");
    assert_eq!(refusal, (429, "limit_exceeded".to_owned()), "a client in a peer slot");
    drop(held);
    let leader_api = Api::at(&cluster.nodes[leader].url);
    let counted = eventually(PATIENCE, async || {
        let Ok(answer) = leader_api.http.get(format!("{}/metrics", leader_api.url)).send().await else {
            return false;
        };
        answer.text().await.unwrap_or_default().contains("permit_connections_refused_total{reason=\"cap\"}")
    })
    .await;
    assert!(counted, "the refusal was not counted");
}

/// Issue 28, finding 8: without `--auth`, a request whose `Host` is a name other than
/// `localhost` (what a web page's requests carry after DNS rebinding) is refused with
/// `421 misdirected_request`; loopback names and IP literals are served, and so are health probes.
#[test]
fn without_auth_a_host_that_is_not_local_or_an_ip_is_misdirected() {
    let (server, _temp) = start(&[]);
    let port = server.addr.rsplit_once(':').unwrap().1.to_owned();
    let get = |host: &str, path: &str| {
        let mut stream = send_raw(
            &server.addr,
            format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes(),
        );
        status_and_code(&read_until_closed(&mut stream))
    };
    for host in
        [format!("evil.example:{port}"), "evil.example".to_owned(), format!("localhost.evil.example:{port}")]
    {
        assert_eq!(get(&host, "/v1/semaphores"), (421, "misdirected_request".to_owned()), "{host}");
        assert_eq!(get(&host, "/v1/health").0, 200, "{host}: health probes are answered");
    }
    for host in
        [format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}"), "10.1.2.3".into()]
    {
        assert_eq!(get(&host, "/v1/semaphores").0, 200, "{host}");
    }
    // With --auth, the token is the defence: the same request is answered 401, not 421.
    let temp = tempfile::tempdir().unwrap();
    let secured = Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &["--auth"]);
    let mut stream = send_raw(
        &secured.addr,
        b"GET /v1/semaphores HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status_and_code(&read_until_closed(&mut stream)), (401, "unauthenticated".to_owned()));
}
