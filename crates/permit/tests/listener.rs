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
use common::{eventually, permit_bin, Cluster, Server};
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
    let options = AcquireOptions { capacity: Some(2), ..AcquireOptions::default() };
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
