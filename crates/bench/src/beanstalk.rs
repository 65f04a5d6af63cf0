//! The queues' second durable peer: beanstalkd with its binlog fsynced on every write
//! (`-b DIR -f0`), driven through its text protocol by a client as thin as the RESP client of
//! `redis.rs`: one connection, written and read by the calling task.
//!
//! A producer `use`s the tube and `put`s; a consumer `watch`es the tube (and ignores `default`),
//! `reserve-with-timeout`s (blocking: the server answers the moment a job is put) and `delete`s.
//! beanstalkd is Debian's package (`crates/bench/redis/setup.sh` installs it), started on a free
//! loopback port in a temp dir and killed by PID at the end.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A `beanstalkd` process; killed by PID on drop.
pub struct BeanstalkProcess {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    child: Option<Child>,
}

impl BeanstalkProcess {
    /// Starts `beanstalkd` on a free loopback port with its binlog in `dir`, fsynced after every
    /// write (`-f0`); waits (bounded) until it answers `stats` and its binlog file exists.
    pub async fn start(dir: &Path) -> anyhow::Result<BeanstalkProcess> {
        std::fs::create_dir_all(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-f0", "-b"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawn beanstalkd (install it with crates/bench/redis/setup.sh)")?;
        let mut server = BeanstalkProcess { addr: format!("127.0.0.1:{port}"), child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = Conn::connect(&server.addr).await {
                if conn.command("stats").await.is_ok_and(|line| line.starts_with("OK ")) {
                    break;
                }
            }
            if let Some(status) = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("beanstalkd exited: {status}");
            }
            anyhow::ensure!(Instant::now() < deadline, "beanstalkd did not answer within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let binlog = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .any(|entry| entry.file_name().to_string_lossy().starts_with("binlog."));
        anyhow::ensure!(binlog, "beanstalkd runs without a binlog in {}", dir.display());
        Ok(server)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for BeanstalkProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One connection, used sequentially.
pub struct Conn {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
    line: String,
}

/// A reserved job.
pub struct Job {
    pub id: u64,
    pub body: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: &str) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream: BufReader::new(stream), out: Vec::with_capacity(512), line: String::new() })
    }

    /// A producer of `tube`.
    pub async fn producer(addr: &str, tube: &str) -> anyhow::Result<Conn> {
        let mut conn = Conn::connect(addr).await?;
        let answer = conn.command(&format!("use {tube}")).await?;
        anyhow::ensure!(answer == format!("USING {tube}"), "use answered {answer:?}");
        Ok(conn)
    }

    /// A consumer of `tube` alone.
    pub async fn consumer(addr: &str, tube: &str) -> anyhow::Result<Conn> {
        let mut conn = Conn::connect(addr).await?;
        let answer = conn.command(&format!("watch {tube}")).await?;
        anyhow::ensure!(answer == "WATCHING 2", "watch answered {answer:?}");
        let answer = conn.command("ignore default").await?;
        anyhow::ensure!(answer == "WATCHING 1", "ignore answered {answer:?}");
        Ok(conn)
    }

    /// Sends one command line and reads the answer's first line (without its CRLF).
    async fn command(&mut self, line: &str) -> anyhow::Result<String> {
        self.out.clear();
        self.out.extend_from_slice(line.as_bytes());
        self.out.extend_from_slice(b"\r\n");
        self.stream.get_mut().write_all(&self.out).await?;
        self.read_line().await
    }

    async fn read_line(&mut self) -> anyhow::Result<String> {
        self.line.clear();
        let n = self.stream.read_line(&mut self.line).await?;
        anyhow::ensure!(n > 0, "beanstalkd closed the connection");
        anyhow::ensure!(self.line.ends_with("\r\n"), "truncated line {:?}", self.line);
        Ok(self.line[..self.line.len() - 2].to_owned())
    }

    /// `put` with priority 1024, no delay and a TTR of 120 s: the job's id once it is durable.
    pub async fn put(&mut self, body: &[u8]) -> anyhow::Result<u64> {
        self.out.clear();
        self.out.extend_from_slice(format!("put 1024 0 120 {}\r\n", body.len()).as_bytes());
        self.out.extend_from_slice(body);
        self.out.extend_from_slice(b"\r\n");
        self.stream.get_mut().write_all(&self.out).await?;
        let answer = self.read_line().await?;
        match answer.strip_prefix("INSERTED ") {
            Some(id) => Ok(id.parse()?),
            None => bail!("put answered {answer:?}"),
        }
    }

    /// `reserve-with-timeout`: the next job of the watched tube, or `None` when none came
    /// within `timeout` (whole seconds, at least 1).
    pub async fn reserve(&mut self, timeout: Duration) -> anyhow::Result<Option<Job>> {
        let seconds = timeout.as_secs().max(1);
        let answer = self.command(&format!("reserve-with-timeout {seconds}")).await?;
        if answer == "TIMED_OUT" {
            return Ok(None);
        }
        let Some(rest) = answer.strip_prefix("RESERVED ") else { bail!("reserve answered {answer:?}") };
        let (id, bytes) = rest.split_once(' ').context("RESERVED without a size")?;
        let (id, bytes): (u64, usize) = (id.parse()?, bytes.parse()?);
        let mut body = vec![0; bytes + 2];
        self.stream.read_exact(&mut body).await?;
        anyhow::ensure!(body.ends_with(b"\r\n"), "a job body without its CRLF");
        body.truncate(bytes);
        Ok(Some(Job { id, body }))
    }

    /// `delete`: the job is gone once this returns.
    pub async fn delete(&mut self, id: u64) -> anyhow::Result<()> {
        let answer = self.command(&format!("delete {id}")).await?;
        anyhow::ensure!(answer == "DELETED", "delete {id} answered {answer:?}");
        Ok(())
    }
}
