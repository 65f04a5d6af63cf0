//! The benchmark's HTTP/1.1 client: one kept-alive connection, written to and read from by the
//! task that makes the request.
//!
//! It is as thin as the RESP client of the `redis` part, so that Permit and Redis are measured
//! through clients of the same weight. reqwest (what `permit-client` uses) drives each
//! connection from a task of its own and goes through its pool: a wake-up of that task and back
//! per round trip, which the benchmark would otherwise count as the server's
//! (`docs/performance.md`, *The benchmark's client*; `--client reqwest` measures with it).
//!
//! It speaks only what the benchmark needs: a request with an optional JSON body, an answer
//! with `content-length` or `chunked` framing, `connection: close` honoured. An idle connection
//! is not reused after [`IDLE_MAX`], well before the server's header-read timeout closes it, so
//! that a request is never written to a connection the server is closing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An idle connection older than this is closed rather than reused (the server closes one
/// after 10 s without a request by default).
pub const IDLE_MAX: Duration = Duration::from_secs(4);
/// The most header lines an answer may have.
const HEADERS_MAX: usize = 64;
/// The largest answer head and body accepted (the benchmark's answers are a few hundred bytes;
/// a 100 k-session keepalive answer is a few MB).
const ANSWER_MAX: usize = 64 << 20;

/// One HTTP/1.1 answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The `permit-leader` header, if the answer had one.
    pub leader: Option<String>,
    pub body: Vec<u8>,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(bytes).await,
            Stream::Tls(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
        }
    }

    async fn read_buf(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read_buf(buf).await,
            Stream::Tls(s) => s.read_buf(buf).await,
        }
    }
}

/// One server, one connection at a time, opened on first use and again after an error, a
/// `connection: close` or [`IDLE_MAX`] of idleness.
pub struct Http1 {
    /// `host:port`.
    authority: String,
    tls: Option<tokio_rustls::TlsConnector>,
    conn: Option<(Stream, Instant)>,
    buf: Vec<u8>,
}

impl Http1 {
    /// A client of `url` (`http://host:port` or `https://host:port`; HTTPS trusts only
    /// [`crate::tls::trusted_ca`]). Connects on the first request.
    pub fn new(url: &str) -> anyhow::Result<Http1> {
        let (tls, authority) = if let Some(rest) = url.strip_prefix("https://") {
            let ca = crate::tls::trusted_ca().context("an https URL, but no CA made for this run")?;
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.clone())?;
            crate::install_crypto_provider();
            let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
            (Some(tokio_rustls::TlsConnector::from(Arc::new(config))), rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (None, rest)
        } else {
            bail!("not an http(s) URL: {url}");
        };
        let authority = authority.trim_end_matches('/').to_owned();
        anyhow::ensure!(!authority.contains('/'), "a URL with a path: {url}");
        Ok(Http1 { authority, tls, conn: None, buf: Vec::with_capacity(4096) })
    }

    /// Sends one request and reads its answer. `body` is sent as `application/json`; `bearer`
    /// as `Authorization: Bearer`.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        bearer: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.authority);
        if let Some(secret) = bearer {
            head.push_str(&format!("authorization: Bearer {secret}\r\n"));
        }
        let body = body.unwrap_or_default();
        if !body.is_empty() || method != "GET" {
            head.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);

        let mut stream = match self.conn.take() {
            Some((stream, used)) if used.elapsed() < IDLE_MAX => stream,
            _ => self.connect().await?,
        };
        stream.write_all(&request).await.with_context(|| format!("{method} {path}: write"))?;
        let (answer, keep) = read_answer(&mut stream, &mut self.buf)
            .await
            .with_context(|| format!("{method} {path}: read"))?;
        if keep {
            self.conn = Some((stream, Instant::now()));
        }
        Ok(answer)
    }

    async fn connect(&self) -> anyhow::Result<Stream> {
        let tcp = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connect to {}", self.authority))?;
        tcp.set_nodelay(true)?;
        Ok(match &self.tls {
            None => Stream::Plain(tcp),
            Some(connector) => {
                let host = self.authority.rsplit_once(':').map_or(self.authority.as_str(), |(host, _)| host);
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
                Stream::Tls(Box::new(connector.connect(name, tcp).await?))
            }
        })
    }
}

/// Reads one answer from `stream` into `buf` (cleared first): the answer, and whether the
/// connection may be used again.
async fn read_answer(stream: &mut Stream, buf: &mut Vec<u8>) -> anyhow::Result<(Answer, bool)> {
    buf.clear();
    let (head_len, status, leader, framing, keep) = loop {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut parsed = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head_len) = parsed.parse(buf)? {
            let status = parsed.code.context("no status code")?;
            let mut leader = None;
            let mut framing = Framing::UntilClose;
            let mut keep = true;
            for header in parsed.headers.iter() {
                let value = std::str::from_utf8(header.value)?.trim();
                if header.name.eq_ignore_ascii_case("content-length") {
                    framing = Framing::Length(value.parse()?);
                } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                    anyhow::ensure!(value.eq_ignore_ascii_case("chunked"), "transfer-encoding {value}");
                    framing = Framing::Chunked;
                } else if header.name.eq_ignore_ascii_case("connection") {
                    keep &= !value.eq_ignore_ascii_case("close");
                } else if header.name.eq_ignore_ascii_case("permit-leader") {
                    leader = Some(value.to_owned());
                }
            }
            break (head_len, status, leader, framing, keep);
        }
        fill(stream, buf).await?;
    };
    let body = match framing {
        // No body, whatever the headers say (RFC 9112, 6.3).
        _ if status == 204 || status == 304 || (100..200).contains(&status) => {
            anyhow::ensure!(buf.len() == head_len, "bytes after a body-less answer");
            Vec::new()
        }
        Framing::Length(length) => {
            anyhow::ensure!(length <= ANSWER_MAX, "an answer of {length} bytes");
            while buf.len() < head_len + length {
                fill(stream, buf).await?;
            }
            anyhow::ensure!(buf.len() == head_len + length, "bytes after the answer");
            buf[head_len..].to_vec()
        }
        Framing::Chunked => read_chunked(stream, buf, head_len).await?,
        Framing::UntilClose => {
            while fill(stream, buf).await.is_ok() {}
            return Ok((Answer { status, leader, body: buf[head_len..].to_vec() }, false));
        }
    };
    Ok((Answer { status, leader, body }, keep))
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Decodes a chunked body that starts at `buf[start..]`, reading more as needed.
async fn read_chunked(stream: &mut Stream, buf: &mut Vec<u8>, start: usize) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut at = start;
    loop {
        let line_end = loop {
            if let Some(end) = buf[at..].windows(2).position(|w| w == b"\r\n") {
                break at + end;
            }
            fill(stream, buf).await?;
        };
        let size_text = std::str::from_utf8(&buf[at..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size_text:?}"))?;
        anyhow::ensure!(body.len() + size <= ANSWER_MAX, "a chunked answer over {ANSWER_MAX} bytes");
        at = line_end + 2;
        // The chunk and its CRLF; the last (empty) chunk is followed by an empty trailer line.
        while buf.len() < at + size + 2 {
            fill(stream, buf).await?;
        }
        body.extend_from_slice(&buf[at..at + size]);
        anyhow::ensure!(&buf[at + size..at + size + 2] == b"\r\n", "a chunk without its CRLF");
        at += size + 2;
        if size == 0 {
            anyhow::ensure!(buf.len() == at, "bytes after the answer");
            return Ok(body);
        }
    }
}

/// Reads what is there into `buf`; an error at the end of the stream.
async fn fill(stream: &mut Stream, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    anyhow::ensure!(buf.len() <= ANSWER_MAX, "an answer over {ANSWER_MAX} bytes");
    buf.reserve(4096);
    if stream.read_buf(buf).await? == 0 {
        bail!("the server closed the connection");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server on a free loopback port that reads each request (head and `content-length`
    /// body) and answers it with the next of `answers`, then closes; returns its URL and the
    /// requests it read.
    async fn serve(answers: Vec<&'static [u8]>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            let (mut socket, _) = listener.accept().await.expect("accept");
            for answer in answers {
                let mut buf = Vec::new();
                let head_len = loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    assert!(socket.read_buf(&mut buf).await.expect("read") > 0, "client closed");
                };
                let head = String::from_utf8(buf[..head_len].to_vec()).expect("utf-8");
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse::<usize>().expect("length"));
                while buf.len() < head_len + length {
                    assert!(socket.read_buf(&mut buf).await.expect("read") > 0, "client closed");
                }
                requests.push(String::from_utf8(buf).expect("utf-8"));
                socket.write_all(answer).await.expect("write");
            }
            requests
        });
        (url, server)
    }

    #[tokio::test]
    async fn reads_length_and_chunked_answers_on_one_connection() {
        let (url, server) = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\npermit-leader: http://n2\r\n\r\n{\"token\":7}",
            b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        ])
        .await;
        let mut client = Http1::new(&url).expect("url");
        let first = client.request("POST", "/a", Some(b"{\"s\":1}"), Some("secret")).await.expect("first");
        assert_eq!((first.status, first.leader.as_deref()), (200, Some("http://n2")));
        assert_eq!(first.body, b"{\"token\":7}");
        let second = client.request("GET", "/b", None, None).await.expect("second");
        assert_eq!((second.status, second.leader), (409, None));
        assert_eq!(second.body, b"{\"a\":1}");
        // A 204 has no body: the answer ends with its head, and the connection goes on.
        let third = tokio::time::timeout(Duration::from_secs(5), client.request("DELETE", "/c", None, None))
            .await
            .expect("a 204 read as a body up to the connection's end")
            .expect("third");
        assert_eq!((third.status, third.body.len()), (204, 0));
        let fourth = client.request("GET", "/d", None, None).await.expect("fourth");
        assert_eq!((fourth.status, fourth.body), (200, b"{}".to_vec()));
        // All four on the one connection the server accepted, each request as sent.
        let requests = server.await.expect("server");
        assert!(requests[0].starts_with("POST /a HTTP/1.1\r\n"), "{}", requests[0]);
        assert!(requests[0].contains("authorization: Bearer secret\r\n"));
        assert!(requests[0].ends_with("content-length: 7\r\n\r\n{\"s\":1}"), "{}", requests[0]);
        assert!(!requests[1].contains("content-length"), "a GET without a body: {}", requests[1]);
        assert!(requests[2].contains("content-length: 0\r\n"));
    }

    #[tokio::test]
    async fn reconnects_after_connection_close() {
        let (url, _first) =
            serve(vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"]).await;
        let mut client = Http1::new(&url).expect("url");
        assert_eq!(client.request("GET", "/", None, None).await.expect("answer").body, b"{}");
        assert!(client.conn.is_none(), "kept a connection the server closes");
        // The server accepts once: the second request connects again and is refused or reset.
        assert!(client.request("GET", "/", None, None).await.is_err());
    }

    #[tokio::test]
    async fn refuses_bad_answers_and_urls() {
        let (url, _server) = serve(vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}extra"]).await;
        let mut client = Http1::new(&url).expect("url");
        let error = client.request("GET", "/", None, None).await.expect_err("trailing bytes");
        assert!(format!("{error:#}").contains("bytes after the answer"), "{error:#}");
        assert!(client.conn.is_none(), "kept a connection after a bad answer");
        assert!(Http1::new("ftp://127.0.0.1:1").is_err());
        assert!(Http1::new("http://127.0.0.1:1/v1").is_err());
        assert!(Http1::new("https://127.0.0.1:1").is_err(), "https without the run's CA");
    }
}
