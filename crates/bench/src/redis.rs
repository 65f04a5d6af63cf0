//! The durable peer: Redis with `appendonly yes` and `appendfsync always`, running the same W1
//! and W2 as Permit with a Lua semaphore, in the same run.
//!
//! The semaphore `NAME` is four keys:
//! - `NAME:holders`, a hash holder id -> fencing token;
//! - `NAME:queue`, a list of waiting client ids (strict FIFO);
//! - `NAME:fence`, the fencing counter (`INCR`, never reused);
//! - `NAME:wake:ID`, a list per client where a release pushes the token it granted that client.
//!
//! Acquire (`ACQUIRE` script, one `EVALSHA`): granted at once when a permit is free and nobody
//! queues (so a newcomer never overtakes a waiter); otherwise the client joins the queue's tail
//! and blocks with `BLPOP NAME:wake:ID` (no polling). Release (`RELEASE`, one `EVALSHA`) removes
//! the holder and, in the same script, grants free permits to the queue's head(s) in order, each
//! with a fresh token, and pushes the token to the waiter's wake list: the same handoff Permit
//! does in its release's log entry. With `appendfsync always` Redis fsyncs the AOF before it
//! answers, so every granted token is durable when its holder learns it, as with Permit.
//!
//! The `take` part runs the usual GCRA rate limiter ([`Gcra`]) beside Permit's take.
//!
//! The queues' Q1 and Q2 run against a Redis stream ([`StreamClient`]): `XADD` to push,
//! `XREADGROUP ... BLOCK` in one consumer group to claim, `XACK` to acknowledge.
//!
//! Redis is `redis-server` from the PATH (Debian's package; `crates/bench/redis/setup.sh`
//! installs it), started on a free loopback port in a temp dir and killed by PID at the end.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::stats::Samples;
use crate::workloads::{Contended, Uncontended};

/// KEYS: holders, queue, fence. ARGV: client id, capacity. Returns the token, or 0 when queued.
const ACQUIRE: &str = r#"
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held then return tonumber(held) end
local capacity = tonumber(ARGV[2])
if redis.call('HLEN', KEYS[1]) < capacity and redis.call('LLEN', KEYS[2]) == 0 then
  local token = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[1], ARGV[1], token)
  return token
end
if not redis.call('LPOS', KEYS[2], ARGV[1]) then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
return 0
"#;

/// KEYS: holders, queue, fence. ARGV: client id, capacity, wake-list prefix. Returns 1 when the
/// client held a permit.
const RELEASE: &str = r#"
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
local capacity = tonumber(ARGV[2])
while redis.call('HLEN', KEYS[1]) < capacity do
  local waiter = redis.call('LPOP', KEYS[2])
  if not waiter then break end
  local token = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[1], waiter, token)
  redis.call('RPUSH', ARGV[3] .. waiter, token)
end
return removed
"#;

/// The usual GCRA rate limiter of Redis (go-redis/redis_rate's script): the key holds the
/// theoretical arrival time (TAT) in seconds since 2017 (to keep microseconds within a double),
/// read from Redis' own clock (`TIME`); an allowed request moves it on by `period / rate` and
/// `SET`s it, so each allowed request is one fsynced write under `appendfsync always`.
/// KEYS: the limiter. ARGV: burst, rate, period (s), cost. Returns {allowed, remaining,
/// retry_after (s, as a string), reset_after (s, as a string)}.
const GCRA: &str = r#"
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])
local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)
local tat = redis.call("GET", rate_limit_key)
if not tat then
  tat = now
else
  tat = tonumber(tat)
end
tat = math.max(tat, now)
local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval
if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {0, 0, tostring(retry_after), tostring(reset_after)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
return {cost, remaining, "-1", tostring(reset_after)}
"#;

/// A `redis-server` process; killed by PID on drop.
pub struct RedisProcess {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    child: Option<Child>,
}

impl RedisProcess {
    /// Starts `redis-server` on a free loopback port with its data in `dir`, AOF on and fsynced
    /// before every reply, RDB snapshots off; waits (bounded) until it answers PING.
    pub async fn start(dir: &Path) -> anyhow::Result<RedisProcess> {
        std::fs::create_dir_all(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--dir"])
            .arg(dir)
            .args(["--appendonly", "yes", "--appendfsync", "always", "--save", ""])
            .args(["--daemonize", "no", "--logfile", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawn redis-server (install it with crates/bench/redis/setup.sh)")?;
        let mut redis = RedisProcess { addr: format!("127.0.0.1:{port}"), child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = Conn::connect(&redis.addr).await {
                if conn.call(&["PING"]).await.is_ok() {
                    break;
                }
            }
            if let Some(status) = redis.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("redis-server exited: {status}");
            }
            anyhow::ensure!(Instant::now() < deadline, "redis-server did not answer within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut conn = Conn::connect(&redis.addr).await?;
        let fsync = conn.call(&["CONFIG", "GET", "appendfsync"]).await?;
        anyhow::ensure!(
            matches!(&fsync, Reply::Array(items) if matches!(items.get(1), Some(Reply::Bulk(v)) if v == b"always")),
            "redis-server is not running with appendfsync always"
        );
        Ok(redis)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A RESP2 reply.
#[derive(Debug)]
enum Reply {
    Simple,
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

/// One connection, used sequentially (RESP2, no pipelining).
struct Conn {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Conn {
    async fn connect(addr: &str) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream: BufReader::new(stream), out: Vec::with_capacity(256) })
    }

    async fn call(&mut self, args: &[&str]) -> anyhow::Result<Reply> {
        self.out.clear();
        self.out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            self.out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            self.out.extend_from_slice(arg.as_bytes());
            self.out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&self.out).await?;
        self.read_reply().await
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        let n = self.stream.read_line(&mut line).await?;
        anyhow::ensure!(n > 0, "redis closed the connection");
        anyhow::ensure!(line.ends_with("\r\n"), "truncated RESP line");
        line.truncate(line.len() - 2);
        Ok(line)
    }

    async fn read_reply(&mut self) -> anyhow::Result<Reply> {
        // Arrays are read iteratively: (items so far, items expected) per open array.
        let mut stack: Vec<(Vec<Reply>, usize)> = Vec::new();
        loop {
            let line = self.line().await?;
            let (kind, rest) = line.split_at(1);
            let mut reply = match kind {
                "+" => Reply::Simple,
                "-" => bail!("redis error: {rest}"),
                ":" => Reply::Int(rest.parse()?),
                "$" => {
                    let len: i64 = rest.parse()?;
                    if len < 0 {
                        Reply::Nil
                    } else {
                        let mut data = vec![0; len as usize + 2];
                        self.stream.read_exact(&mut data).await?;
                        data.truncate(len as usize);
                        Reply::Bulk(data)
                    }
                }
                "*" => {
                    let len: i64 = rest.parse()?;
                    if len < 0 {
                        Reply::Nil
                    } else if len == 0 {
                        Reply::Array(Vec::new())
                    } else {
                        stack.push((Vec::with_capacity(len as usize), len as usize));
                        continue;
                    }
                }
                other => bail!("unexpected RESP type {other:?}"),
            };
            loop {
                let Some((items, expected)) = stack.last_mut() else { return Ok(reply) };
                items.push(reply);
                if items.len() < *expected {
                    break;
                }
                let (items, _) = stack.pop().expect("non-empty");
                reply = Reply::Array(items);
            }
        }
    }
}

/// One client of the Lua semaphore `name`.
struct Semaphore {
    conn: Conn,
    id: String,
    keys: [String; 3],
    wake: String,
    capacity: String,
    acquire_sha: String,
    release_sha: String,
}

async fn load(conn: &mut Conn, script: &str) -> anyhow::Result<String> {
    match conn.call(&["SCRIPT", "LOAD", script]).await? {
        Reply::Bulk(sha) => Ok(String::from_utf8(sha)?),
        other => bail!("SCRIPT LOAD answered {other:?}"),
    }
}

impl Semaphore {
    async fn open(addr: &str, name: &str, id: &str, capacity: u64) -> anyhow::Result<Semaphore> {
        let mut conn = Conn::connect(addr).await?;
        let acquire_sha = load(&mut conn, ACQUIRE).await?;
        let release_sha = load(&mut conn, RELEASE).await?;
        Ok(Semaphore {
            conn,
            id: id.to_owned(),
            keys: [format!("{name}:holders"), format!("{name}:queue"), format!("{name}:fence")],
            wake: format!("{name}:wake:"),
            capacity: capacity.to_string(),
            acquire_sha,
            release_sha,
        })
    }

    /// One try: the token, or `None` when queued.
    async fn try_acquire(&mut self) -> anyhow::Result<Option<i64>> {
        let [holders, queue, fence] = &self.keys;
        let args = [&*self.acquire_sha, holders, queue, fence, &self.id, &self.capacity];
        match self.conn.call(&[&["EVALSHA"][..], &args[..1], &["3"], &args[1..]].concat()).await? {
            Reply::Int(0) => Ok(None),
            Reply::Int(token) => Ok(Some(token)),
            other => bail!("acquire answered {other:?}"),
        }
    }

    /// Acquires, blocking on the wake list when queued.
    async fn acquire(&mut self) -> anyhow::Result<i64> {
        if let Some(token) = self.try_acquire().await? {
            return Ok(token);
        }
        let wake = format!("{}{}", self.wake, self.id);
        match self.conn.call(&["BLPOP", &wake, "30"]).await? {
            Reply::Array(items) => match items.get(1) {
                Some(Reply::Bulk(token)) => Ok(std::str::from_utf8(token)?.parse()?),
                other => bail!("BLPOP answered {other:?}"),
            },
            Reply::Nil => bail!("not granted within 30 s"),
            other => bail!("BLPOP answered {other:?}"),
        }
    }

    async fn release(&mut self) -> anyhow::Result<()> {
        let [holders, queue, fence] = &self.keys;
        let args = [&*self.release_sha, holders, queue, fence, &self.id, &self.capacity, &self.wake];
        match self.conn.call(&[&["EVALSHA"][..], &args[..1], &["3"], &args[1..]].concat()).await? {
            Reply::Int(1) => Ok(()),
            other => bail!("release answered {other:?} (not a holder)"),
        }
    }
}

/// One client of a GCRA limiter ([`GCRA`], one `EVALSHA` per request) at one key.
pub struct Gcra {
    conn: Conn,
    sha: String,
    key: String,
    /// ARGV of the script but the cost: burst, rate, period in seconds.
    limits: [String; 3],
}

impl Gcra {
    /// A client of the limiter `key`: `rate` requests per `period`, at most `burst` at once.
    pub async fn open(
        addr: &str,
        key: &str,
        rate: u64,
        period: Duration,
        burst: u64,
    ) -> anyhow::Result<Gcra> {
        let mut conn = Conn::connect(addr).await?;
        let sha = load(&mut conn, GCRA).await?;
        let limits = [burst.to_string(), rate.to_string(), period.as_secs_f64().to_string()];
        Ok(Gcra { conn, sha, key: key.to_owned(), limits })
    }

    /// One request of cost 1: whether the limiter allowed it.
    pub async fn take(&mut self) -> anyhow::Result<bool> {
        let [burst, rate, period] = &self.limits;
        let args = ["EVALSHA", &self.sha, "1", &self.key, burst, rate, period, "1"];
        match self.conn.call(&args).await? {
            Reply::Array(items) => match items.first() {
                Some(Reply::Int(allowed)) => Ok(*allowed > 0),
                other => bail!("the GCRA script answered {other:?} first"),
            },
            other => bail!("the GCRA script answered {other:?}"),
        }
    }
}

/// One client of the stream `key` and its consumer group `group` (the queues' peer): a producer
/// `XADD`s, a consumer (named in the group) claims with `XREADGROUP ... COUNT 1 BLOCK` and
/// acknowledges with `XACK`. With `appendfsync always`, each is durable when answered.
pub struct StreamClient {
    conn: Conn,
    key: String,
    group: String,
    consumer: String,
}

/// An entry read from a stream: its id and the value of its field `p`.
pub struct StreamEntry {
    pub id: String,
    pub payload: Vec<u8>,
}

impl StreamClient {
    /// Creates the stream `key` (empty) with the consumer group `group` reading from its start.
    pub async fn create(addr: &str, key: &str, group: &str) -> anyhow::Result<()> {
        let mut conn = Conn::connect(addr).await?;
        conn.call(&["XGROUP", "CREATE", key, group, "0", "MKSTREAM"]).await?;
        Ok(())
    }

    /// A client named `consumer` in the group.
    pub async fn open(addr: &str, key: &str, group: &str, consumer: &str) -> anyhow::Result<StreamClient> {
        Ok(StreamClient {
            conn: Conn::connect(addr).await?,
            key: key.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
        })
    }

    /// `XADD key * p payload`.
    pub async fn push(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let payload = std::str::from_utf8(payload)?;
        match self.conn.call(&["XADD", &self.key, "*", "p", payload]).await? {
            Reply::Bulk(_) => Ok(()),
            other => bail!("XADD answered {other:?}"),
        }
    }

    /// `XREADGROUP GROUP group consumer COUNT 1 BLOCK ms STREAMS key >`: the next entry no
    /// consumer of the group has read, or `None` when none came within `wait`.
    pub async fn claim(&mut self, wait: Duration) -> anyhow::Result<Option<StreamEntry>> {
        let block = wait.as_millis().max(1).to_string();
        let args = ["XREADGROUP", "GROUP", &self.group, &self.consumer, "COUNT", "1", "BLOCK", &block];
        let reply = self.conn.call(&[&args[..], &["STREAMS", &self.key, ">"]].concat()).await?;
        // [[key, [[id, [field, value]]]]]
        let Reply::Array(streams) = reply else { return Ok(None) };
        let entry = match streams.into_iter().next() {
            Some(Reply::Array(stream)) => match stream.into_iter().nth(1) {
                Some(Reply::Array(entries)) => entries.into_iter().next(),
                _ => None,
            },
            _ => None,
        };
        let Some(Reply::Array(entry)) = entry else { bail!("XREADGROUP answered no entry") };
        let mut entry = entry.into_iter();
        let (Some(Reply::Bulk(id)), Some(Reply::Array(fields))) = (entry.next(), entry.next()) else {
            bail!("XREADGROUP answered a malformed entry")
        };
        let Some(Reply::Bulk(payload)) = fields.into_iter().nth(1) else {
            bail!("XREADGROUP answered an entry without its field")
        };
        Ok(Some(StreamEntry { id: String::from_utf8(id)?, payload }))
    }

    /// `XACK key group id`.
    pub async fn ack(&mut self, id: &str) -> anyhow::Result<()> {
        match self.conn.call(&["XACK", &self.key, &self.group, id]).await? {
            Reply::Int(1) => Ok(()),
            other => bail!("XACK {id} answered {other:?}"),
        }
    }
}

/// W1 against Redis: one client, capacity 4, loop {acquire; release}.
pub async fn uncontended(addr: &str, name: &str, duration: Duration) -> anyhow::Result<Uncontended> {
    let mut sem = Semaphore::open(addr, name, "w1", 4).await?;
    let (mut acquire, mut release) = (Samples::default(), Samples::default());
    let started = Instant::now();
    let mut cycles = 0u64;
    let mut last_token = 0;
    while started.elapsed() < duration {
        let t = Instant::now();
        let token = sem.try_acquire().await?.context("uncontended acquire queued")?;
        acquire.push(t.elapsed());
        anyhow::ensure!(token > last_token, "fencing token went backwards");
        last_token = token;
        let t = Instant::now();
        sem.release().await?;
        release.push(t.elapsed());
        cycles += 1;
    }
    Ok(Uncontended { cycles_per_second: cycles as f64 / started.elapsed().as_secs_f64(), acquire, release })
}

/// W2 against Redis: `clients` clients, capacity 4, loop {blocking acquire; release}.
pub async fn contended(
    addr: &str,
    name: &str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Contended> {
    let holders = Arc::new(AtomicI64::new(0));
    let max_holders = Arc::new(AtomicI64::new(0));
    let mut sems = Vec::new();
    for i in 0..clients {
        sems.push(Semaphore::open(addr, name, &format!("c{i}"), 4).await?);
    }
    let end = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = sems
        .into_iter()
        .map(|mut sem| {
            let (holders, max_holders) = (holders.clone(), max_holders.clone());
            tokio::spawn(async move {
                let mut wait = Samples::default();
                let mut cycles = 0u64;
                while Instant::now() < end {
                    let t = Instant::now();
                    sem.acquire().await?;
                    wait.push(t.elapsed());
                    let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_holders.fetch_max(now_holding, Ordering::SeqCst);
                    holders.fetch_sub(1, Ordering::SeqCst);
                    sem.release().await?;
                    cycles += 1;
                }
                anyhow::Ok((cycles, wait))
            })
        })
        .collect();
    Contended::gather(tasks, started, &max_holders).await
}
