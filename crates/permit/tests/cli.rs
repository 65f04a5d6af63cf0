//! The client commands of the `permit` binary (`run`, `elect`, `ls`, `show`, ...) against a real
//! `permit serve` process, with real child processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use permit_client::{AcquireOptions, Client, SessionOptions};
use tokio::process::{Child, Command};

use crate::common::{permit_bin, Connections, Server};

/// Longest any single step (a command, a wait for a file) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Exit codes documented by `permit run --help`.
const EXIT_ERROR: i32 = 1;
const EXIT_NO_LEADER: i32 = 3;
const EXIT_UNREACHABLE: i32 = 74;
const EXIT_TIMEOUT: i32 = 75;
const EXIT_LOST: i32 = 76;
const EXIT_NOT_FOUND: i32 = 127;
/// Exit codes documented by the operator commands and for local mistakes.
const EXIT_NOT_CURRENT: i32 = 3;
const EXIT_NOT_LEADING: i32 = 3;
const EXIT_USAGE: i32 = 64;
const EXIT_UNAVAILABLE: i32 = 69;
const EXIT_CONFIG: i32 = 78;

/// The output of a short `permit` command.
#[derive(Debug)]
struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `permit <args>` against `server` to completion, within `STEP_TIMEOUT`.
async fn permit(server: &Server, args: &[&str]) -> Output {
    permit_with_env(server, args, &[]).await
}

/// Like [`permit`], with extra environment variables.
async fn permit_with_env(server: &Server, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(permit_bin());
    command.args(args).env("PERMIT_SERVER", &server.url).stdin(Stdio::null()).kill_on_drop(true);
    command.envs(env.iter().copied());
    let output = tokio::time::timeout(STEP_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("permit {args:?} did not finish in time"))
        .expect("run permit");
    Output {
        code: exit_code(output.status),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A long-running `permit` process with its output in files; on drop (a failed test) it gets
/// SIGTERM, which it forwards to its command, then SIGKILL.
struct Running {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Running {
    fn spawn(server: &Server, dir: &Path, args: &[&str]) -> Running {
        let stderr = dir.join(format!("stderr-{}", rand_suffix()));
        let stdout = dir.join(format!("stdout-{}", rand_suffix()));
        let child = Command::new(permit_bin())
            .args(args)
            .env("PERMIT_SERVER", &server.url)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn permit");
        Running { child, stdout, stderr }
    }

    fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own unreaped child.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    async fn exit_code(&mut self) -> i32 {
        let status = tokio::time::timeout(STEP_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("permit did not exit in time; stderr: {}", self.stderr()))
            .expect("wait");
        exit_code(status)
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else { return };
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        for _ in 0..200 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.start_kill();
    }
}

/// A distinct suffix for output files of concurrent processes in one directory.
fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// Waits until `path` exists and is not empty, then returns its contents.
async fn file_contents(path: &Path) -> String {
    let appeared = common::eventually(STEP_TIMEOUT, async || {
        std::fs::read_to_string(path).is_ok_and(|text| !text.trim().is_empty())
    })
    .await;
    assert!(appeared, "{} was not written in time", path.display());
    std::fs::read_to_string(path).unwrap()
}

fn client(server: &Server) -> Client {
    Client::new(&server.url).unwrap()
}

/// A shell command string with `$DIR` replaced by `dir`.
fn script(dir: &Path, text: &str) -> String {
    text.replace("$DIR", &dir.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exports_the_token_and_exits_with_the_commands_code() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        r#"echo "$PERMIT_TOKEN $PERMIT_SEMAPHORE $PERMIT_PERMITS $PERMIT_SESSION" > $DIR/env; exit 7"#,
    );
    let output =
        permit(&server, &["run", "job", "--capacity", "2", "--keep", "-n", "2", "--", "sh", "-c", &command])
            .await;
    assert_eq!(output.code, 7, "the command's exit code; stderr: {}", output.stderr);

    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{env:?}");
    assert!(fields[0].parse::<u64>().unwrap() > 0, "PERMIT_TOKEN is a token: {env:?}");
    assert_eq!((fields[1], fields[2]), ("job", "2"));
    let client = client(&server);
    let view = client.get_semaphore("job").await.unwrap();
    assert_eq!((view.capacity, view.held), (2, 0), "released on exit");
    assert!(client.get_session(fields[3]).await.is_err(), "and the session closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_capacity_one_never_overlap() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    // mkdir is atomic: it fails if another command is inside its critical section right now.
    let command = script(
        dir.path(),
        "mkdir $DIR/inside || exit 99; echo $PERMIT_TOKEN >> $DIR/tokens; sleep 0.2; rmdir $DIR/inside",
    );
    let runs: Vec<Running> = (0..3)
        .map(|_| {
            Running::spawn(
                &server,
                dir.path(),
                &["run", "mutex", "--capacity", "1", "--", "sh", "-c", &command],
            )
        })
        .collect();
    for mut run in runs {
        assert_eq!(run.exit_code().await, 0, "overlap or failure; stderr: {}", run.stderr());
    }
    let tokens = std::fs::read_to_string(dir.path().join("tokens")).unwrap();
    let tokens: Vec<u64> = tokens.lines().map(|line| line.parse().unwrap()).collect();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "each run saw a larger token: {tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_hold_stops_the_command_with_sigterm() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        r#"trap 'echo term > $DIR/signal; exit 0' TERM; echo $PERMIT_SESSION > $DIR/session; while :; do sleep 0.05; done"#,
    );
    let mut run = Running::spawn(
        &server,
        dir.path(),
        &["run", "lease", "--capacity", "1", "--ttl", "600ms", "--", "sh", "-c", &command],
    );
    let session = file_contents(&dir.path().join("session")).await;

    // Another client closes the session: the next keepalive is refused and the hold is lost.
    client(&server).close_session(session.trim()).await.unwrap();
    assert_eq!(run.exit_code().await, EXIT_LOST, "stderr: {}", run.stderr());
    assert_eq!(file_contents(&dir.path().join("signal")).await.trim(), "term", "the command got SIGTERM");
    assert!(run.stderr().contains("lost"), "a clear message: {}", run.stderr());
}

/// An operator's `permit revoke` (or `permit release --session`) ends the hold while the
/// session lives on, so keepalives keep succeeding: `run`, `elect` and `lock` must still notice,
/// or two commands would run under one permit once the next holder is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_or_released_hold_stops_run_elect_and_lock_with_76() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        r#"trap 'echo term > $DIR/signal; exit 0' TERM; echo $PERMIT_SESSION > $DIR/session; while :; do sleep 0.05; done"#,
    );
    let mut run =
        Running::spawn(&server, dir.path(), &["run", "door", "--capacity", "1", "--", "sh", "-c", &command]);
    let session = file_contents(&dir.path().join("session")).await;
    let revoked = permit(&server, &["revoke", "door", session.trim()]).await;
    assert_eq!(revoked.code, 0, "{revoked:?}");
    assert_eq!(run.exit_code().await, EXIT_LOST, "stderr: {}", run.stderr());
    assert_eq!(file_contents(&dir.path().join("signal")).await.trim(), "term", "the command got SIGTERM");
    assert!(run.stderr().contains("revoked"), "says why: {}", run.stderr());

    let mut lock = Running::spawn(&server, dir.path(), &["lock", "door", "--capacity", "1", "--keep"]);
    let printed = common::eventually(STEP_TIMEOUT, async || lock.stdout().ends_with('\n')).await;
    assert!(printed, "no token printed; stderr: {}", lock.stderr());
    let holder = client(&server).get_semaphore("door").await.unwrap().holders[0].session.clone();
    let released = permit(&server, &["release", "door", "--session", &holder]).await;
    assert_eq!(released.code, 0, "{released:?}");
    assert_eq!(lock.exit_code().await, EXIT_LOST, "stderr: {}", lock.stderr());

    let elected = dir.path().join("elected");
    let leading = script(
        dir.path(),
        &format!("echo $PERMIT_SESSION > {}; while :; do sleep 0.05; done", elected.display()),
    );
    let mut elect =
        Running::spawn(&server, dir.path(), &["elect", "sched", "--value", "a", "--", "sh", "-c", &leading]);
    let leader = file_contents(&elected).await;
    let ended = permit(&server, &["revoke", "--election", "sched", leader.trim()]).await;
    assert_eq!(ended.code, 0, "{ended:?}");
    assert_eq!(elect.exit_code().await, EXIT_LOST, "stderr: {}", elect.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        r#"trap '' TERM; echo $PERMIT_SESSION > $DIR/session; while :; do sleep 0.05; done"#,
    );
    let args =
        ["run", "stubborn", "--capacity", "1", "--ttl", "600ms", "--kill-after", "300ms", "--", "sh", "-c"];
    let mut run = Running::spawn(&server, dir.path(), &[&args[..], &[command.as_str()]].concat());
    let session = file_contents(&dir.path().join("session")).await;

    client(&server).close_session(session.trim()).await.unwrap();
    assert_eq!(run.exit_code().await, EXIT_LOST, "stderr: {}", run.stderr());
    assert!(run.stderr().contains("SIGKILL"), "{}", run.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_the_command_when_it_passes() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let args = ["run", "capped", "--capacity", "1", "--keep", "--max-hold", "300ms", "--", "sleep", "30"];
    let mut run = Running::spawn(&server, dir.path(), &args);
    assert_eq!(run.exit_code().await, EXIT_LOST, "stderr: {}", run.stderr());
    assert!(run.stderr().contains("--max-hold passed"), "{}", run.stderr());
    assert_eq!(client(&server).get_semaphore("capped").await.unwrap().held, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_gives_up_after_its_timeout_without_keeping_a_queue_place() {
    let server = Server::start();
    let client = client(&server);
    let holder = client.session(Duration::from_secs(10)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let _held = holder.acquire_with("taken", 1, &options).await.unwrap().expect("granted");

    let output = permit(&server, &["run", "taken", "--timeout", "300ms", "--", "true"]).await;
    assert_eq!(output.code, EXIT_TIMEOUT, "stderr: {}", output.stderr);
    assert!(output.stderr.contains("timed out"), "{}", output.stderr);
    let view = client.get_semaphore("taken").await.unwrap();
    assert_eq!((view.held, view.waiters.len()), (1, 0), "no waiter left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_forwards_sigterm_to_the_command_and_releases() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(
        dir.path(),
        r#"trap 'echo term > $DIR/signal; exit 5' TERM; echo up > $DIR/started; while :; do sleep 0.05; done"#,
    );
    let mut run = Running::spawn(
        &server,
        dir.path(),
        &["run", "forward", "--capacity", "1", "--keep", "--", "sh", "-c", &command],
    );
    file_contents(&dir.path().join("started")).await;
    run.signal(libc::SIGTERM);
    assert_eq!(run.exit_code().await, 5, "the command's own exit code; stderr: {}", run.stderr());
    assert_eq!(file_contents(&dir.path().join("signal")).await.trim(), "term");
    assert_eq!(client(&server).get_semaphore("forward").await.unwrap().held, 0, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_a_missing_command() {
    let server = Server::start();
    let output = permit(&server, &["run", "missing", "--capacity", "1", "--", "/nonexistent/command"]).await;
    assert_eq!(output.code, EXIT_NOT_FOUND, "stderr: {}", output.stderr);
    // `--capacity` made the semaphore on the fly, so it is ephemeral: released, it is gone.
    assert!(client(&server).get_semaphore("missing").await.is_err(), "released and deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_show_set_capacity_and_delete() {
    let server = Server::start();
    let set = permit(&server, &["set-capacity", "db.orders", "3"]).await;
    assert_eq!(set.code, 0, "stderr: {}", set.stderr);
    assert!(set.stdout.contains("db.orders: capacity 3"), "{}", set.stdout);

    let client = client(&server);
    let options = SessionOptions { ttl: Duration::from_secs(10), name: Some("holder-x".into()) };
    let session = client.session_with(options).await.unwrap();
    let permit_held = session.acquire("db.orders", 2).await.unwrap();

    let ls = permit(&server, &["ls"]).await;
    assert_eq!(ls.code, 0, "stderr: {}", ls.stderr);
    let lines: Vec<Vec<&str>> = ls.stdout.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "CAPACITY", "HELD", "AVAILABLE", "HOLDERS", "WAITERS"]);
    assert_eq!(lines[1], ["db.orders", "3", "2", "1", "1", "0"]);
    let json: serde_json::Value =
        serde_json::from_str(&permit(&server, &["ls", "--json"]).await.stdout).unwrap();
    assert_eq!(json[0]["name"], "db.orders");
    assert_eq!(json[0]["held"], 2);

    let show = permit(&server, &["show", "db.orders"]).await;
    assert_eq!(show.code, 0, "stderr: {}", show.stderr);
    assert!(show.stdout.contains("capacity 3, held 2, available 1"), "{}", show.stdout);
    assert!(show.stdout.contains(session.id()) && show.stdout.contains("holder-x"), "{}", show.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&permit(&server, &["show", "db.orders", "--json"]).await.stdout).unwrap();
    assert_eq!(json["holders"][0]["token"], permit_held.token());

    let busy = permit(&server, &["delete", "db.orders"]).await;
    assert_eq!(busy.code, EXIT_ERROR);
    assert!(busy.stderr.contains("semaphore_busy"), "{}", busy.stderr);
    permit_held.release().await.unwrap();
    assert_eq!(permit(&server, &["delete", "db.orders"]).await.code, 0);
    let gone = permit(&server, &["show", "db.orders"]).await;
    assert_eq!(gone.code, EXIT_ERROR);
    assert!(gone.stderr.contains("semaphore_not_found"), "{}", gone.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_the_command_while_leading_and_leader_prints_it() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(permit(&server, &["leader", "sched"]).await.code, EXIT_NO_LEADER);

    let command = script(dir.path(), "echo $PERMIT_TOKEN > $DIR/token; exec sleep 30");
    let mut elect = Running::spawn(
        &server,
        dir.path(),
        &["elect", "sched", "--value", "node-a", "--", "sh", "-c", &command],
    );
    let token: u64 = file_contents(&dir.path().join("token")).await.trim().parse().unwrap();
    let leader = permit(&server, &["leader", "sched"]).await;
    assert_eq!((leader.code, leader.stdout.as_str()), (0, "node-a\n"), "stderr: {}", leader.stderr);
    let json: serde_json::Value =
        serde_json::from_str(&permit(&server, &["leader", "sched", "--json"]).await.stdout).unwrap();
    assert_eq!(json["leader"]["token"], token);

    elect.signal(libc::SIGTERM);
    assert_eq!(elect.exit_code().await, 128 + libc::SIGTERM, "sleep was killed by the forwarded SIGTERM");
    assert_eq!(permit(&server, &["leader", "sched"]).await.code, EXIT_NO_LEADER, "resigned on exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_exits_74() {
    let server = Server::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let output = permit(&server, &["--server", &format!("http://{closed}"), "ls"]).await;
    assert_eq!(output.code, EXIT_UNREACHABLE);
    assert!(output.stderr.contains("cannot list semaphores"), "{}", output.stderr);
}

/// Whether process `pid` still runs: it has a `/proc` entry that is not a zombie (a killed
/// orphan may stay a zombie when the reaper of this container does not reap).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// The pid written to `path` by a command.
async fn pid_in(path: &Path) -> i32 {
    file_contents(path).await.trim().parse().expect("a pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_run_kills_the_command_and_its_grandchildren_within_a_second() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(dir.path(), "echo $$ > $DIR/child; sleep 30 & echo $! > $DIR/grandchild; wait");
    let mut run =
        Running::spawn(&server, dir.path(), &["run", "k9", "--capacity", "1", "--", "sh", "-c", &command]);
    let (child, grandchild) =
        (pid_in(&dir.path().join("child")).await, pid_in(&dir.path().join("grandchild")).await);
    assert!(alive(child) && alive(grandchild));

    run.signal(libc::SIGKILL);
    assert_eq!(run.exit_code().await, 128 + libc::SIGKILL);
    let gone = common::eventually(Duration::from_secs(1), async || !alive(child) && !alive(grandchild)).await;
    assert!(
        gone,
        "child {child} alive: {}, grandchild {grandchild} alive: {}",
        alive(child),
        alive(grandchild)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_elects_never_run_at_once_when_the_leader_is_killed_9() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    // Each run logs its start, then a tick every 20 ms, and its end on SIGTERM, under its token.
    let command = script(
        dir.path(),
        r#"trap 'echo "end $PERMIT_TOKEN" >> $DIR/log; exit 0' TERM; echo "start $PERMIT_TOKEN" >> $DIR/log; while :; do echo "tick $PERMIT_TOKEN" >> $DIR/log; sleep 0.02; done"#,
    );
    let args = ["elect", "sched", "--value", "v", "--ttl", "1s", "--", "sh", "-c", &command];
    let mut first = Running::spawn(&server, dir.path(), &args);
    let log = dir.path().join("log");
    file_contents(&log).await;
    let mut second = Running::spawn(&server, dir.path(), &args);
    let queued = common::eventually(STEP_TIMEOUT, async || {
        client(&server).get_election("sched").await.is_ok_and(|view| view.candidates >= 1)
    })
    .await;
    assert!(queued, "the second elect campaigns behind the first");

    first.signal(libc::SIGKILL);
    assert_eq!(first.exit_code().await, 128 + libc::SIGKILL);
    // Long enough after the takeover for a surviving first command to show up in the log.
    let second_ticks = async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let second_start = lines.iter().rposition(|line| line.starts_with("start ")).unwrap_or(0);
        second_start > 0 && lines.len() - second_start > 15
    };
    assert!(
        common::eventually(STEP_TIMEOUT, second_ticks).await,
        "the second took over: {}",
        second.stderr()
    );
    second.signal(libc::SIGTERM);
    assert_eq!(second.exit_code().await, 0, "stderr: {}", second.stderr());

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(&str, u64)> = text
        .lines()
        .map(|line| {
            let (what, token) = line.split_once(' ').expect("WHAT TOKEN");
            (what, token.parse().expect("a token"))
        })
        .collect();
    let second_start = lines.iter().rposition(|(what, _)| *what == "start").unwrap();
    let (first_token, second_token) = (lines[0].1, lines[second_start].1);
    assert!(second_token > first_token, "{text}");
    assert!(
        lines[second_start..].iter().all(|(_, token)| *token == second_token),
        "the first command ran after the second started:\n{text}"
    );
    assert!(lines[..second_start].iter().all(|(_, token)| *token == first_token), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_76_within_ttl_and_kill_after_when_the_server_dies() {
    let mut server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let command = script(dir.path(), "trap '' TERM; echo $$ > $DIR/started; while :; do sleep 0.05; done");
    let args = ["run", "doomed", "--capacity", "1", "--ttl", "1s", "--kill-after", "1s", "--", "sh", "-c"];
    let mut run = Running::spawn(&server, dir.path(), &[&args[..], &[command.as_str()]].concat());
    let pid = pid_in(&dir.path().join("started")).await;

    let killed = std::time::Instant::now();
    server.kill9();
    assert_eq!(run.exit_code().await, EXIT_LOST, "stderr: {}", run.stderr());
    // TTL + --kill-after, plus the bounded cleanup (1 s) and a margin for a loaded machine.
    let bound = Duration::from_secs(1 + 1 + 1) + Duration::from_millis(1500);
    assert!(killed.elapsed() < bound, "took {:?}; stderr: {}", killed.elapsed(), run.stderr());
    // The command ignores SIGTERM: it was killed (by `permit` past --kill-after, or by the
    // watchdog at the deadline, whichever came first on this machine).
    let dead = common::eventually(Duration::from_secs(2), async || !alive(pid)).await;
    assert!(dead, "the command outlived permit; stderr: {}", run.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_against_a_closed_port_exits_74() {
    let server = Server::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let output = permit(&server, &["--server", &format!("http://{closed}"), "run", "x", "--", "true"]).await;
    assert_eq!(output.code, EXIT_UNREACHABLE, "stderr: {}", output.stderr);
    assert!(output.stderr.contains("cannot reach"), "{}", output.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_prints_the_token_and_releases_on_sigterm() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut lock = Running::spawn(&server, dir.path(), &["lock", "door", "--capacity", "1", "--keep"]);
    let printed = common::eventually(STEP_TIMEOUT, async || lock.stdout().ends_with('\n')).await;
    assert!(printed, "no token printed; stderr: {}", lock.stderr());
    let token: u64 = lock.stdout().trim().parse().expect("one line with the token");

    let client = client(&server);
    let view = client.get_semaphore("door").await.unwrap();
    assert_eq!((view.held, view.holders[0].token), (1, token));
    let other = client.session(Duration::from_secs(10)).await.unwrap();
    let now = AcquireOptions { timeout: Some(Duration::ZERO), ..AcquireOptions::default() };
    assert!(other.acquire_with("door", 1, &now).await.unwrap().is_none(), "held by permit lock");

    lock.signal(libc::SIGTERM);
    assert_eq!(lock.exit_code().await, 0, "stderr: {}", lock.stderr());
    let next = other.acquire_with("door", 1, &now).await.unwrap().expect("released on SIGTERM");
    assert!(next.token() > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_watch_prints_every_change() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = Running::spawn(&server, dir.path(), &["leader", "sched", "--watch"]);
    let printed = async |expected: &str| {
        let seen = common::eventually(STEP_TIMEOUT, async || watch.stdout() == expected).await;
        assert!(seen, "expected {expected:?}, got {:?}; stderr: {}", watch.stdout(), watch.stderr());
    };
    printed("\n").await;
    let client = client(&server);
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let leadership = session.campaign("sched", "node-a").await.unwrap();
    printed("\nnode-a\n").await;
    leadership.resign().await.unwrap();
    printed("\nnode-a\n\n").await;
    let _again = session.campaign("sched", "node-b").await.unwrap();
    printed("\nnode-a\n\nnode-b\n").await;

    watch.signal(libc::SIGINT);
    assert_eq!(watch.exit_code().await, 0, "stderr: {}", watch.stderr());
}

#[test]
fn help_texts_have_one_exit_code_table_each_and_serve_lists_no_client_flags() {
    let help = |args: &[&str]| {
        let output = std::process::Command::new(permit_bin()).args(args).arg("--help").output().unwrap();
        assert!(output.status.success(), "{args:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    for (command, row) in [
        (&["run"][..], "76"),
        (&["elect"], "leadership was lost"),
        (&["lock"], "released after SIGINT"),
        (&["take"], "rate limited: the rate had no room"),
        (&["leader"], "nobody leads"),
        (&["proclaim"], "does not lead the election"),
        (&["ls"], "74"),
        (&["cluster", "status"], "74"),
        (&["queue", "work"], "the running commands got SIGTERM"),
        (&["queue", "push"], "push again with --key"),
        (&["queue", "show"], "74"),
        (&["serve"], "stopped by SIGINT or SIGTERM"),
        (&["config", "check"], "the configuration is valid"),
        (&["config", "show"], "the configuration is valid"),
    ] {
        let text = help(command);
        assert_eq!(text.matches("Exit codes:").count(), 1, "{command:?}:\n{text}");
        assert!(text.contains(row), "{command:?}:\n{text}");
    }
    assert!(!help(&["elect"]).contains("max-hold"), "elect lists run's codes");
    assert!(!help(&["serve"]).contains("--server"), "serve lists client flags");
    assert!(!help(&["config", "show"]).contains("--server"), "config show lists client flags");
    assert!(
        help(&["serve"]).contains("A flag beats its environment variable"),
        "serve states the precedence"
    );
    assert!(!help(&[]).contains("Glue"), "a developer note in the help");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_file_carry_no_colours() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut serve = Command::new(permit_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logged = common::eventually(STEP_TIMEOUT, async || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("INFO"))
    })
    .await;
    serve.start_kill().unwrap();
    serve.wait().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(logged, "no info line: {text}");
    assert!(!text.contains('\u{1b}'), "ANSI escapes in a log file: {text:?}");
}

#[tokio::test]
async fn acl_token_create_list_self_and_delete_with_the_root_token() {
    let temp = tempfile::tempdir().unwrap();
    let server = Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &["--auth"]);
    let root_file = temp.path().join("data/root-token");
    let written = crate::common::eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(&root_file).is_ok_and(|s| s.trim().len() >= 32)
    })
    .await;
    assert!(written, "no root token file");
    let root = std::fs::read_to_string(&root_file).unwrap().trim().to_owned();
    let denied = permit(&server, &["ls"]).await;
    assert_eq!(denied.code, 1, "{denied:?}");
    assert!(denied.stderr.contains("unauthenticated"), "{}", denied.stderr);
    // The message says how to pass a token, not which HTTP header carries it.
    assert!(
        denied.stderr.contains("--auth-token") && denied.stderr.contains("PERMIT_AUTH_TOKEN"),
        "{}",
        denied.stderr
    );

    let created = permit(
        &server,
        &[
            "--auth-token",
            &root,
            "acl",
            "token",
            "create",
            "--name",
            "ci",
            "--rule",
            "semaphore:ci.=write",
            "--rule",
            "session:=write",
            "--quiet",
        ],
    )
    .await;
    assert_eq!(created.code, 0, "{created:?}");
    let secret = created.stdout.trim().to_owned();
    assert_eq!(secret.len(), 64, "{created:?}");
    let me = permit(&server, &["--auth-token", &secret, "acl", "token", "self"]).await;
    assert!(me.stdout.contains("ci") && me.stdout.contains("semaphore:ci.=write"), "{me:?}");
    let ran =
        permit(&server, &["--auth-token", &secret, "run", "ci.job", "--capacity", "1", "--", "true"]).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let refused =
        permit(&server, &["--auth-token", &secret, "run", "prod.job", "--capacity", "1", "--", "true"]).await;
    assert!(refused.stderr.contains("permission_denied"), "{refused:?}");

    let listed = permit(&server, &["--auth-token", &root, "acl", "token", "list"]).await;
    let id =
        listed.stdout.lines().find(|line| line.contains(" ci ")).and_then(|l| l.split_whitespace().next());
    let id = id.unwrap_or_else(|| panic!("ci not listed: {listed:?}")).to_owned();
    assert!(!listed.stdout.contains(&secret), "secrets are never listed");
    assert_eq!(permit(&server, &["--auth-token", &root, "acl", "token", "delete", &id]).await.code, 0);
    let gone = permit(&server, &["--auth-token", &secret, "acl", "token", "self"]).await;
    assert!(gone.stderr.contains("unauthenticated"), "{gone:?}");
}

/// The token `permit` was given in its environment does not reach the command it runs under a
/// lock or a leadership (a build script that dumps its environment, a core dump, a child that
/// logs it), unless `--pass-token` asks for it.
#[tokio::test]
async fn run_and_elect_keep_the_auth_token_from_the_command_unless_pass_token() {
    let server = Server::start();
    let secret = "a-token-secret-the-command-must-not-see";
    let env = [("PERMIT_AUTH_TOKEN", secret)];
    let runs: [&[&str]; 2] = [
        &["run", "env.job", "--capacity", "1", "--", "env"],
        &["elect", "env.leader", "--value", "v", "--", "env"],
    ];
    for args in runs {
        let ran = permit_with_env(&server, args, &env).await;
        assert_eq!(ran.code, 0, "{args:?}: {ran:?}");
        assert!(ran.stdout.contains("PERMIT_SESSION="), "the command's environment was printed: {ran:?}");
        assert!(!ran.stdout.contains(secret), "{args:?} handed the token to the command: {ran:?}");
        let (verb, rest) = args.split_first().unwrap();
        let mut passing = vec![*verb, "--pass-token"];
        passing.extend_from_slice(rest);
        let passed = permit_with_env(&server, &passing, &env).await;
        assert_eq!(passed.code, 0, "{passing:?}: {passed:?}");
        assert!(passed.stdout.contains(&format!("PERMIT_AUTH_TOKEN={secret}")), "{passing:?}: {passed:?}");
    }
}

#[tokio::test]
async fn events_prints_one_line_per_event_filtered_and_resumed() {
    let server = Server::start();
    let client = Client::new(&server.url).unwrap();
    let options = SessionOptions { ttl: Duration::from_secs(30), name: Some("worker-1".into()) };
    let session = client.session_with(options).await.unwrap();
    let options = AcquireOptions { capacity: Some(4), ..AcquireOptions::default() };
    let held = session.acquire_with("gpu", 2, &options).await.unwrap().expect("granted");
    held.release().await.unwrap();
    // From the start of the ring: every event so far, in order.
    let all = permit(&server, &["events", "--after", "0", "--count", "4"]).await;
    assert_eq!(all.code, 0, "{all:?}");
    let lines: Vec<&str> = all.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{all:?}");
    assert!(
        lines[0].starts_with("1 @") && lines[0].contains(" session_created session=worker-1("),
        "{all:?}"
    );
    assert!(lines[1].contains(" capacity_changed semaphore gpu capacity=4"), "{all:?}");
    assert!(
        lines[2].contains(" granted semaphore gpu session=worker-1(")
            && lines[2].contains("permits=2 token=1")
    );
    assert!(lines[3].contains(" released semaphore gpu "), "{all:?}");
    // Filtered by kind, as JSON.
    let json =
        permit(&server, &["events", "--after", "0", "--kinds", "released", "--json", "--count", "1"]).await;
    let event: serde_json::Value = serde_json::from_str(json.stdout.trim()).expect("one JSON object");
    assert_eq!((event["kind"].as_str(), event["name"].as_str()), (Some("released"), Some("gpu")));
    // An unknown kind is refused.
    let bad = permit(&server, &["events", "--kinds", "nope"]).await;
    assert_eq!(bad.code, EXIT_ERROR, "{bad:?}");
    assert!(bad.stderr.contains("unknown event kind"), "{bad:?}");
}

/// `permit validate`, `revoke`, `release` and `elections` against a real server: an operator ends
/// a stuck hold (or leadership) from the command line, and a token stops being current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_validate_revoke_release_and_list_elections() {
    let server = Server::start();
    let client = client(&server);
    let once = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let stuck = client.session(Duration::from_secs(30)).await.unwrap();
    let permit_held = stuck.acquire_with("door", 1, &once);
    let held = permit_held.await.unwrap().expect("granted");
    let token = held.token().to_string();

    let current = permit(&server, &["validate", "door", &token]).await;
    assert_eq!(current.code, 0, "{current:?}");
    assert!(current.stdout.contains(stuck.id()), "names the holder: {current:?}");
    let other = (held.token() + 1).to_string();
    assert_eq!(permit(&server, &["validate", "door", &other]).await.code, EXIT_NOT_CURRENT);

    let revoked = permit(&server, &["revoke", "door", stuck.id()]).await;
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let stale = permit(&server, &["validate", "door", &token]).await;
    assert_eq!(stale.code, EXIT_NOT_CURRENT, "revoked: {stale:?}");
    assert!(stale.stdout.contains("not current"), "{stale:?}");
    drop(held);

    let mine = client.session(Duration::from_secs(30)).await.unwrap();
    let grant = mine.acquire_with("door", 1, &once);
    let grant = grant.await.unwrap().expect("free again after the revoke");
    let released = permit(&server, &["release", "door", "--session", mine.id()]).await;
    assert_eq!(released.code, 0, "{released:?}");
    assert_eq!(
        permit(&server, &["validate", "door", &grant.token().to_string()]).await.code,
        EXIT_NOT_CURRENT
    );
    drop(grant);

    let leader = client.session(Duration::from_secs(30)).await.unwrap();
    let leadership = leader.campaign("sched", "node-a").await.unwrap();
    let listed = permit(&server, &["elections"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let row =
        listed.stdout.lines().find(|line| line.starts_with("sched ")).unwrap_or_else(|| panic!("{listed:?}"));
    assert!(row.contains("node-a") && row.contains(leader.id()), "{row}");
    let json: serde_json::Value =
        serde_json::from_str(&permit(&server, &["elections", "--json"]).await.stdout).unwrap();
    assert_eq!(json[0]["leader"]["value"], "node-a", "{json}");

    let ended = permit(&server, &["revoke", "--election", "sched", leader.id()]).await;
    assert_eq!(ended.code, 0, "{ended:?}");
    assert_eq!(permit(&server, &["leader", "sched"]).await.code, EXIT_NO_LEADER, "leadership revoked");
    drop(leadership);

    let bad = permit(&server, &["revoke", "door", "not-a-session"]).await;
    assert_eq!(bad.code, EXIT_ERROR, "{bad:?}");
}

/// `permit health` prints the node's state; `--wait` returns once healthy and gives up after its
/// `--timeout` with 75; a node that answers but is not ready exits 69, no answer exits 74.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_node_and_wait_is_bounded() {
    let server = Server::start();
    let healthy = permit(&server, &["health"]).await;
    assert_eq!(healthy.code, 0, "{healthy:?}");
    assert!(healthy.stdout.starts_with("ok: node 1, leader"), "{healthy:?}");
    assert_eq!(permit(&server, &["health", "--wait", "--timeout", "5s"]).await.code, 0);

    // A node started with --join is not a member: it answers, degraded.
    let temp = tempfile::tempdir().unwrap();
    let secret = common::write_cluster_secret(temp.path());
    let secret = secret.display().to_string();
    let joiner = Server::start_in(
        &temp.path().join("data"),
        "127.0.0.1:0",
        &["--id", "2", "--join", "--cluster-secret-file", &secret],
    );
    let degraded = permit(&joiner, &["health"]).await;
    assert_eq!(degraded.code, EXIT_UNAVAILABLE, "{degraded:?}");
    assert!(degraded.stdout.starts_with("degraded"), "{degraded:?}");
    let started = std::time::Instant::now();
    let waited = permit(&joiner, &["health", "--wait", "--timeout", "1s"]).await;
    assert_eq!(waited.code, EXIT_TIMEOUT, "{waited:?}");
    assert!(started.elapsed() >= Duration::from_secs(1), "waited its timeout");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("http://{closed}");
    assert_eq!(permit(&server, &["--server", &url, "health"]).await.code, EXIT_UNREACHABLE);
    // A node that accepts connections but never answers does not hold --wait past --timeout.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    let started = std::time::Instant::now();
    let waited = permit(&server, &["--server", &hung_url, "health", "--wait", "--timeout", "1s"]).await;
    assert_eq!(waited.code, EXIT_TIMEOUT, "{waited:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drop(hung);
    assert_eq!(
        permit(&server, &["--server", &url, "health", "--wait", "--timeout", "1s"]).await.code,
        EXIT_TIMEOUT
    );
}

/// Local mistakes fail at once with 64 (usage) or 78 (config) and a message that names the fix,
/// instead of seconds of retries and "cannot reach" (74).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mistakes_fail_at_once_with_a_message_that_names_the_fix() {
    let server = Server::start();

    // A trailing newline (a secret read from a file) is trimmed: the command works.
    let trimmed = permit_with_env(&server, &["ls"], &[("PERMIT_AUTH_TOKEN", "0123456789abcdef\n")]).await;
    assert_eq!(trimmed.code, 0, "{trimmed:?}");
    // Whitespace or control characters inside are refused before anything is sent: the server
    // named is never even connected to.
    for bad in ["0123 4567", "01\u{7}23"] {
        let counted = Connections::to(&server.addr).await;
        let refused = permit(&server, &["--server", &counted.url, "--auth-token", bad, "ls"]).await;
        assert_eq!(refused.code, EXIT_USAGE, "{refused:?}");
        assert!(refused.stderr.contains("PERMIT_AUTH_TOKEN"), "{refused:?}");
        assert_eq!(counted.count(), 0, "connected with a malformed token: {refused:?}");
    }

    // https:// against the plain-HTTP port: 78, naming the address to use, after one connection
    // (a retried one would be a transient error, reported only after seconds of retries).
    let counted = Connections::to(&server.addr).await;
    let https = counted.url.replacen("http://", "https://", 1);
    let mismatch = permit(&server, &["--server", &https, "ls"]).await;
    assert_eq!(mismatch.code, EXIT_CONFIG, "{mismatch:?}");
    assert!(mismatch.stderr.contains(&format!("use {}", counted.url)), "{mismatch:?}");
    assert_eq!(counted.count(), 1, "connections made: {mismatch:?}");

    // A malformed address: 64, naming it.
    let malformed = permit(&server, &["--server", "http//127.0.0.1:7376", "ls"]).await;
    assert_eq!(malformed.code, EXIT_USAGE, "{malformed:?}");
    assert!(malformed.stderr.contains("http//127.0.0.1:7376"), "{malformed:?}");

    // "cannot reach" names every endpoint tried, with its error.
    let closed: Vec<String> = (0..2)
        .map(|_| {
            format!("http://{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap())
        })
        .collect();
    let unreachable = permit(&server, &["--server", &closed.join(","), "ls"]).await;
    assert_eq!(unreachable.code, EXIT_UNREACHABLE, "{unreachable:?}");
    for url in &closed {
        assert!(unreachable.stderr.contains(&format!("{url}: Connection refused")), "{url}: {unreachable:?}");
    }
}

/// With `RUST_BACKTRACE=1`, ordinary errors of the client commands and of `permit serve` print
/// their message, not a stack trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_backtrace_does_not_turn_user_errors_into_stack_traces() {
    let server = Server::start();
    let missing = permit_with_env(&server, &["show", "nothing-here"], &[("RUST_BACKTRACE", "1")]).await;
    assert_eq!(missing.code, EXIT_ERROR, "{missing:?}");
    assert!(!missing.stderr.to_lowercase().contains("backtrace"), "{missing:?}");

    let temp = tempfile::tempdir().unwrap();
    let not_a_dir = temp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let data_dir = not_a_dir.join("data").display().to_string();
    let serve = permit_with_env(
        &server,
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", &data_dir],
        &[("RUST_BACKTRACE", "1")],
    )
    .await;
    assert_eq!(serve.code, 1, "{serve:?}");
    assert!(serve.stderr.starts_with("permit: ") || serve.stderr.contains("\npermit: "), "{serve:?}");
    assert!(!serve.stderr.to_lowercase().contains("backtrace"), "{serve:?}");
}

/// Finding 2 of issue 29: a queued `permit run` rides out a server outage longer than the
/// transport's retry budget (≈ 6 s) but shorter than its session's TTL, keeping its queue place;
/// and finding 5's queue position is printed while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_rides_out_an_outage_shorter_than_its_session_and_keeps_its_place() {
    let mut server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut holder =
        Running::spawn(&server, dir.path(), &["lock", "outage", "--capacity", "1", "--ttl", "30s"]);
    file_contents(&holder.stdout).await;
    let command = script(dir.path(), "echo $PERMIT_TOKEN > $DIR/granted");
    let mut waiter = Running::spawn(
        &server,
        dir.path(),
        &["run", "outage", "--capacity", "1", "--ttl", "30s", "--", "sh", "-c", &command],
    );
    let queued = common::eventually(STEP_TIMEOUT, async || waiter.stderr().contains("position 1")).await;
    assert!(queued, "the waiter did not say it is queued: {}", waiter.stderr());

    // The outage: longer than the transport's retry window, shorter than the sessions' TTL.
    server.kill9();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(waiter.child.try_wait().unwrap().is_none(), "the waiter gave up: {}", waiter.stderr());
    server.restart();

    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exit_code().await, 0, "stderr: {}", holder.stderr());
    assert_eq!(waiter.exit_code().await, 0, "stderr: {}", waiter.stderr());
    assert!(!file_contents(&dir.path().join("granted")).await.trim().is_empty());
}

/// Finding 2 of issue 29: an outage longer than the session's TTL ends the wait with 76 (the
/// session, and its place, are lost), not 74; `--quiet` prints no queue position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_exits_76_when_an_outage_outlasts_its_session() {
    let mut server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let holder = client(&server).session(Duration::from_secs(60)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let _held = holder.acquire_with("long", 1, &options).await.unwrap().expect("granted");
    let mut waiter = Running::spawn(
        &server,
        dir.path(),
        &["run", "long", "--quiet", "--ttl", "2s", "--", "sh", "-c", "echo should-not-run"],
    );
    let queued = common::eventually(STEP_TIMEOUT, async || {
        client(&server).get_semaphore("long").await.is_ok_and(|view| view.waiters.len() == 1)
    })
    .await;
    assert!(queued, "stderr: {}", waiter.stderr());

    server.kill9();
    assert_eq!(waiter.exit_code().await, EXIT_LOST, "stderr: {}", waiter.stderr());
    assert!(waiter.stderr().contains("lost the session"), "{}", waiter.stderr());
    assert!(!waiter.stderr().contains("position"), "--quiet: {}", waiter.stderr());
    assert!(!waiter.stdout().contains("should-not-run"));
}

/// Finding 3 of issue 29: with `permit run` itself stopped (SIGSTOP), its watchdog kills the
/// command at the session's local deadline, before the server expires the session and grants
/// the lock to the next `permit run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_permit_runs_command_is_dead_before_the_next_holder_starts() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let first_command =
        script(dir.path(), "echo $$ > $DIR/first; while :; do date +%s%N >> $DIR/beat; sleep 0.05; done");
    let mut first = Running::spawn(
        &server,
        dir.path(),
        &["run", "frozen", "--capacity", "1", "--ttl", "2s", "--", "sh", "-c", &first_command],
    );
    let first_pid = pid_in(&dir.path().join("first")).await;
    first.signal(libc::SIGSTOP);

    // The next holder records the first command's state when it starts: gone, or a zombie.
    let second_command = script(
        dir.path(),
        &format!(
            "s=$(cut -d' ' -f3 /proc/{first_pid}/stat 2>/dev/null); echo \"${{s:-gone}}\" > $DIR/second"
        ),
    );
    let second = permit(
        &server,
        &["run", "frozen", "--capacity", "1", "--ttl", "2s", "--", "sh", "-c", &second_command],
    )
    .await;
    first.signal(libc::SIGCONT);
    assert_eq!(second.code, 0, "stderr: {}", second.stderr);
    let state = file_contents(&dir.path().join("second")).await;
    assert!(matches!(state.trim(), "gone" | "Z"), "the first command was {state:?} when the second started");
    assert_eq!(first.exit_code().await, EXIT_LOST, "stderr: {}", first.stderr());
}

/// Finding 3 of issue 29: a `--kill-after` that does not fit in a third of the TTL is clamped,
/// with a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_that_does_not_fit_in_the_ttl_is_clamped_with_a_message() {
    let server = Server::start();
    let output = permit(
        &server,
        &["run", "fit", "--capacity", "1", "--ttl", "3s", "--kill-after", "10s", "--", "true"],
    )
    .await;
    assert_eq!(output.code, 0, "stderr: {}", output.stderr);
    assert!(
        output.stderr.contains("does not fit") && output.stderr.contains("using 1s"),
        "{}",
        output.stderr
    );
}

/// Finding 5 of issue 29 (queue position): queued `lock` and `elect` print their position on
/// stderr when they start waiting and again when it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_lock_and_elect_print_their_position_and_its_changes() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let holder = client(&server).session(Duration::from_secs(30)).await.unwrap();
    let options = AcquireOptions { capacity: Some(1), ..AcquireOptions::default() };
    let held = holder.acquire_with("pos", 1, &options).await.unwrap().expect("granted");
    let _leading = holder.campaign("pos-e", "holder").await.unwrap();

    let mut first = Running::spawn(&server, dir.path(), &["lock", "pos"]);
    let first_queued = common::eventually(STEP_TIMEOUT, async || first.stderr().contains("position 1")).await;
    assert!(first_queued, "{}", first.stderr());
    let mut second = Running::spawn(&server, dir.path(), &["lock", "pos"]);
    let second_queued =
        common::eventually(STEP_TIMEOUT, async || second.stderr().contains("position 2")).await;
    assert!(second_queued, "{}", second.stderr());
    let elect = Running::spawn(&server, dir.path(), &["elect", "pos-e", "--value", "x", "--", "true"]);
    let candidate = common::eventually(STEP_TIMEOUT, async || elect.stderr().contains("position 1")).await;
    assert!(candidate, "{}", elect.stderr());

    // The first waiter leaves: the second moves up and says so.
    first.signal(libc::SIGTERM);
    assert_eq!(first.exit_code().await, 128 + libc::SIGTERM, "stderr: {}", first.stderr());
    let moved = common::eventually(STEP_TIMEOUT, async || second.stderr().contains("position 1")).await;
    assert!(moved, "{}", second.stderr());
    held.release().await.unwrap();
    file_contents(&second.stdout).await;
    second.signal(libc::SIGTERM);
    assert_eq!(second.exit_code().await, 0, "stderr: {}", second.stderr());
}

/// The command of `permit elect` publishes a new value with `permit proclaim` (its session from
/// PERMIT_SESSION): the leadership, its token and the command go on, and `permit leader --watch`
/// prints the new value. Another session is refused with 3 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_from_the_elected_command_publishes_a_new_value_that_leader_watch_prints() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = Running::spawn(&server, dir.path(), &["leader", "sched", "--watch"]);
    let command = script(
        dir.path(),
        &format!(
            "echo $PERMIT_TOKEN > $DIR/token; i=0; while [ ! -e $DIR/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
             {} proclaim \"$PERMIT_ELECTION\" node-b; echo $? > $DIR/proclaimed; exec sleep 30",
            permit_bin()
        ),
    );
    let mut elect = Running::spawn(
        &server,
        dir.path(),
        &["elect", "sched", "--value", "node-a", "--", "sh", "-c", &command],
    );
    let token = file_contents(&dir.path().join("token")).await;
    let first = common::eventually(STEP_TIMEOUT, async || watch.stdout().ends_with("node-a\n")).await;
    assert!(first, "watch printed {:?}; stderr: {}", watch.stdout(), watch.stderr());

    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(file_contents(&dir.path().join("proclaimed")).await.trim(), "0", "stderr: {}", elect.stderr());
    let second =
        common::eventually(STEP_TIMEOUT, async || watch.stdout().ends_with("node-a\nnode-b\n")).await;
    assert!(second, "watch printed {:?}", watch.stdout());
    let json: serde_json::Value =
        serde_json::from_str(&permit(&server, &["leader", "sched", "--json"]).await.stdout).unwrap();
    assert_eq!(
        (json["leader"]["value"].as_str(), json["leader"]["token"].as_u64()),
        (Some("node-b"), token.trim().parse().ok())
    );

    let other = client(&server).session(Duration::from_secs(10)).await.unwrap();
    let refused = permit(&server, &["proclaim", "sched", "node-c", "--session", other.id()]).await;
    assert_eq!(refused.code, EXIT_NOT_LEADING, "{refused:?}");
    assert!(refused.stderr.contains("does not lead"), "{}", refused.stderr);
    assert_eq!(permit(&server, &["leader", "sched"]).await.stdout, "node-b\n", "nothing changed");

    // The leadership went on through the proclaim: the command ends by the forwarded SIGTERM.
    elect.signal(libc::SIGTERM);
    assert_eq!(elect.exit_code().await, 128 + libc::SIGTERM, "stderr: {}", elect.stderr());
    watch.signal(libc::SIGTERM);
    assert_eq!(watch.exit_code().await, 0);
}

/// Waits until the server's cluster runs feature version 4 (queues): a new node starts at
/// version 1 and raises it once its leader has probed the members, a moment after it starts.
async fn queues_ready(server: &Server) {
    let client = Client::new(&server.url).unwrap();
    let ready = common::eventually(STEP_TIMEOUT, async || {
        client.cluster().await.is_ok_and(|view| view.feature_version.is_some_and(|v| v >= 4))
    })
    .await;
    assert!(ready, "the cluster did not reach feature version 4");
}

/// Runs `permit <args>` with `input` on its standard input, to completion.
async fn permit_with_input(server: &Server, args: &[&str], input: &str) -> Output {
    use tokio::io::AsyncWriteExt as _;
    let mut child = Command::new(permit_bin())
        .args(args)
        .env("PERMIT_SERVER", &server.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn permit");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("permit {args:?} did not finish in time"))
        .expect("run permit");
    Output {
        code: exit_code(output.status),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The queue's (pending, claimed, delayed) counts.
async fn queue_counts(server: &Server, name: &str) -> Option<(u64, u64, u64)> {
    let view = client(server).get_queue(name).await.ok()?;
    Some((view.pending, view.claimed, view.delayed))
}

/// Waits until `path` has at least `lines` lines; returns them.
async fn lines_in(path: &Path, lines: usize) -> Vec<String> {
    let enough = common::eventually(STEP_TIMEOUT, async || {
        std::fs::read_to_string(path).is_ok_and(|text| text.lines().count() >= lines)
    })
    .await;
    assert!(enough, "{} did not get {lines} lines in time", path.display());
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_started_before_the_queue_processes_every_pushed_item_once() {
    let server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    // One append per item (a single short write to an O_APPEND file does not interleave).
    let command =
        script(dir.path(), r#"line="$(cat) $PERMIT_QUEUE $PERMIT_ATTEMPT"; echo "$line" >> $DIR/done"#);
    let mut work = Running::spawn(
        &server,
        dir.path(),
        &["queue", "work", "jobs", "--concurrency", "4", "--", "sh", "-c", &command],
    );
    let waiting =
        common::eventually(STEP_TIMEOUT, async || work.stderr().contains("does not exist yet")).await;
    assert!(waiting, "the worker waits for the queue; stderr: {}", work.stderr());

    let input: String = (0..20).map(|n| format!("{{\"n\":{n}}}\n")).collect();
    let pushed = permit_with_input(&server, &["queue", "push", "jobs"], &input).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    assert_eq!(pushed.stdout.lines().count(), 20, "one id per item: {}", pushed.stdout);

    let mut done = lines_in(&dir.path().join("done"), 20).await;
    let emptied =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&server, "jobs").await == Some((0, 0, 0)))
            .await;
    assert!(emptied, "every item acked: {:?}", queue_counts(&server, "jobs").await);
    done.sort();
    let mut expected: Vec<String> = (0..20).map(|n| format!("{{\"n\":{n}}} jobs 1")).collect();
    expected.sort();
    assert_eq!(done, expected, "each payload once, on its first attempt");
    work.signal(libc::SIGTERM);
    assert_eq!(work.exit_code().await, 0, "stderr: {}", work.stderr());
}

/// The requests of `route` answered `status`, from the server's `/metrics`.
async fn requests_answered(server: &Server, route: &str, status: u16) -> u64 {
    let text = reqwest::get(format!("{}/metrics", server.url)).await.unwrap().text().await.unwrap();
    let series =
        format!("permit_http_requests_total{{route=\"{route}\",method=\"POST\",status=\"{status}\"}} ");
    text.lines().filter_map(|line| line.strip_prefix(&series)?.parse::<u64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_claims_the_next_pending_item_with_the_ack() {
    let server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let input: String = (0..5).map(|n| format!("{n}\n")).collect();
    let pushed = permit_with_input(&server, &["queue", "push", "busy"], &input).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    let command = script(dir.path(), r#"echo "$(cat) $PERMIT_ATTEMPT" >> $DIR/done"#);
    let mut work = Running::spawn(
        &server,
        dir.path(),
        &["queue", "work", "busy", "--concurrency", "1", "--", "sh", "-c", &command],
    );
    let done = lines_in(&dir.path().join("done"), 5).await;
    assert_eq!(done, ["0 1", "1 1", "2 1", "3 1", "4 1"], "in order, each once");
    let emptied =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&server, "busy").await == Some((0, 0, 0)))
            .await;
    assert!(emptied, "every item acked: {:?}", queue_counts(&server, "busy").await);
    // One claim took the first item; each ack took the next, the last one none. (The claim
    // that waits for a sixth item is not answered yet, so not counted.)
    assert_eq!(requests_answered(&server, "/v1/queues/{name}/items/{id}/ack", 200).await, 5);
    assert_eq!(requests_answered(&server, "/v1/queues/{name}/claim", 200).await, 1);
    work.signal(libc::SIGTERM);
    assert_eq!(work.exit_code().await, 0, "stderr: {}", work.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_nacks_a_failed_item_and_runs_it_again_with_the_next_attempt() {
    let server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let pushed = permit(&server, &["queue", "push", "flaky", r#""payload""#]).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    let id = pushed.stdout.trim().to_owned();
    let command = script(
        dir.path(),
        r#"echo "$PERMIT_ATTEMPT $PERMIT_ITEM_ID $PERMIT_TOKEN $(cat)" >> $DIR/attempts; [ "$PERMIT_ATTEMPT" -ge 2 ]"#,
    );
    let mut work = Running::spawn(
        &server,
        dir.path(),
        &["queue", "work", "flaky", "--backoff", "10ms", "--", "sh", "-c", &command],
    );
    let attempts = lines_in(&dir.path().join("attempts"), 2).await;
    let fields: Vec<Vec<&str>> = attempts.iter().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!((fields[0][0], fields[1][0]), ("1", "2"), "{attempts:?}");
    assert_eq!((fields[0][1], fields[1][1]), (id.as_str(), id.as_str()), "the same item: {attempts:?}");
    assert!(fields[1][2].parse::<u64>().unwrap() > fields[0][2].parse::<u64>().unwrap(), "a new token");
    assert_eq!(fields[0][3], r#""payload""#);
    let emptied =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&server, "flaky").await == Some((0, 0, 0)))
            .await;
    assert!(emptied, "acked on the second attempt: {:?}", queue_counts(&server, "flaky").await);
    assert!(work.stderr().contains("failed (exit 1)"), "stderr: {}", work.stderr());
    work.signal(libc::SIGINT);
    assert_eq!(work.exit_code().await, 0, "stderr: {}", work.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_on_sigint_claims_no_more_and_lets_the_running_item_finish() {
    let server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let pushed = permit_with_input(&server, &["queue", "push", "slow"], "1\n2\n").await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    // The command waits for the test's go-ahead, so that the signal surely comes while it runs.
    let command = script(
        dir.path(),
        r#"cat > $DIR/started; while [ ! -e $DIR/go ]; do sleep 0.02; done; echo finished > $DIR/finished"#,
    );
    let mut work =
        Running::spawn(&server, dir.path(), &["queue", "work", "slow", "--", "sh", "-c", &command]);
    assert_eq!(file_contents(&dir.path().join("started")).await, "1");
    work.signal(libc::SIGINT);
    let told = common::eventually(STEP_TIMEOUT, async || work.stderr().contains("no more claims")).await;
    assert!(told, "stderr: {}", work.stderr());
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(work.exit_code().await, 0, "stderr: {}", work.stderr());
    assert_eq!(file_contents(&dir.path().join("finished")).await.trim(), "finished");
    // The running item was acked; the other was never claimed.
    assert_eq!(queue_counts(&server, "slow").await, Some((1, 0, 0)));
    let show = permit(&server, &["queue", "show", "slow", "--items", "--json"]).await;
    let view: serde_json::Value = serde_json::from_str(&show.stdout).unwrap();
    assert_eq!(view["items"][0]["payload"], 2);
    assert_eq!(view["items"][0]["attempt"], 0, "never claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_stops_the_command_when_the_session_is_lost() {
    let server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let pushed = permit(&server, &["queue", "push", "leases", "{}"]).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    let command = script(
        dir.path(),
        r#"trap 'echo term > $DIR/signal; exit 0' TERM; echo $PERMIT_SESSION > $DIR/session; while :; do sleep 0.05; done"#,
    );
    let mut work = Running::spawn(
        &server,
        dir.path(),
        &["queue", "work", "leases", "--ttl", "2s", "--", "sh", "-c", &command],
    );
    let session = file_contents(&dir.path().join("session")).await;
    client(&server).close_session(session.trim()).await.unwrap();
    assert_eq!(work.exit_code().await, EXIT_LOST, "stderr: {}", work.stderr());
    assert_eq!(file_contents(&dir.path().join("signal")).await.trim(), "term", "the command got SIGTERM");
    assert_eq!(queue_counts(&server, "leases").await, Some((1, 0, 0)), "the item is the queue's again");
    assert!(work.stderr().contains("lost the session"), "stderr: {}", work.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_push_ls_and_show() {
    let server = Server::start();
    queues_ready(&server).await;
    let first = permit(&server, &["queue", "push", "mail", r#"{"to":"a@example.com"}"#, "--key", "a"]).await;
    assert_eq!(first.code, 0, "stderr: {}", first.stderr);
    let again = permit(&server, &["queue", "push", "mail", r#"{"to":"a@example.com"}"#, "--key", "a"]).await;
    assert_eq!((again.code, &again.stdout), (0, &first.stdout), "a queued key answers its item");
    assert!(again.stderr.contains("already queued"), "stderr: {}", again.stderr);
    let delayed = permit(&server, &["queue", "push", "mail", "2", "--delay", "1h"]).await;
    assert_eq!(delayed.code, 0, "stderr: {}", delayed.stderr);

    let bad = permit_with_input(&server, &["queue", "push", "mail"], "1\nnot json\n").await;
    assert_eq!(bad.code, EXIT_USAGE, "stderr: {}", bad.stderr);
    assert!(bad.stderr.contains("item 2 is not JSON"), "stderr: {}", bad.stderr);
    let keyed = permit_with_input(&server, &["queue", "push", "mail", "--key", "k"], "1\n2\n").await;
    assert_eq!(keyed.code, EXIT_USAGE, "stderr: {}", keyed.stderr);
    assert_eq!(queue_counts(&server, "mail").await, Some((1, 0, 1)), "the refused pushes added nothing");

    let ls = permit(&server, &["queue", "ls"]).await;
    assert_eq!(ls.code, 0, "stderr: {}", ls.stderr);
    let row: Vec<&str> = ls.stdout.lines().nth(1).expect("a row").split_whitespace().collect();
    assert_eq!(&row[..5], ["mail", "1", "0", "1", "0"], "{}", ls.stdout);
    let show = permit(&server, &["queue", "show", "mail", "--items", "--state", "delayed"]).await;
    assert_eq!(show.code, 0, "stderr: {}", show.stderr);
    assert!(show.stdout.starts_with("mail: 1 pending, 0 claimed, 1 delayed"), "{}", show.stdout);
    assert!(show.stdout.contains("max_attempts 5, dead_letter mail.dead"), "{}", show.stdout);
    let items: Vec<&str> = show.stdout.lines().skip_while(|line| !line.starts_with("ID")).skip(1).collect();
    assert_eq!(items.len(), 1, "only the delayed item: {}", show.stdout);
    assert!(items[0].contains("delayed") && items[0].ends_with('2'), "{}", show.stdout);
    let missing = permit(&server, &["queue", "show", "nope"]).await;
    assert_eq!(missing.code, EXIT_ERROR);
    assert!(missing.stderr.contains("queue_not_found"), "stderr: {}", missing.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_stops_the_command_before_the_deadline_when_the_server_stops_answering() {
    let mut server = Server::start();
    queues_ready(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let pushed = permit(&server, &["queue", "push", "stalls", "{}"]).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    let command = script(
        dir.path(),
        r#"trap 'echo term > $DIR/signal; exit 0' TERM; echo $$ > $DIR/started; while :; do sleep 0.05; done"#,
    );
    // SIGTERM a second before the deadline, the watchdog's SIGKILL 200 ms before it: time for
    // the trap to write its file on a loaded machine.
    let args = ["queue", "work", "stalls", "--ttl", "3s", "--kill-after", "1s", "--", "sh", "-c"];
    let mut work = Running::spawn(&server, dir.path(), &[&args[..], &[command.as_str()]].concat());
    let pid = pid_in(&dir.path().join("started")).await;
    let stopped = std::time::Instant::now();
    server.pause();
    assert_eq!(file_contents(&dir.path().join("signal")).await.trim(), "term", "the command got SIGTERM");
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "before the session's deadline: {:?}",
        stopped.elapsed()
    );
    assert_eq!(work.exit_code().await, EXIT_LOST, "stderr: {}", work.stderr());
    assert!(!alive(pid), "the command is gone");
    server.resume();
    // The server expires the session after its TTL and hands the item back.
    let back =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&server, "stalls").await == Some((1, 0, 0)))
            .await;
    assert!(back, "the item is pending again: {:?}", queue_counts(&server, "stalls").await);
}

/// A worker started before its cluster runs queues (here a node that speaks version 1, as an
/// old build would) waits, and works once the node is upgraded (restarted with this build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_waits_for_a_cluster_that_does_not_run_queues_yet() {
    let dir = tempfile::tempdir().unwrap();
    let old = [("PERMIT_INJECT_BUG", "speaks_version_1")];
    let mut server = Server::start_with_env(&dir.path().join("data"), "127.0.0.1:0", &[], &old);
    let command = script(dir.path(), r#"cat > $DIR/done"#);
    let mut work =
        Running::spawn(&server, dir.path(), &["queue", "work", "later", "--", "sh", "-c", &command]);
    let waiting =
        common::eventually(STEP_TIMEOUT, async || work.stderr().contains("does not run queues yet")).await;
    assert!(waiting, "stderr: {}", work.stderr());
    server.restart();
    queues_ready(&server).await;
    let pushed = permit(&server, &["queue", "push", "later", "42"]).await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    assert_eq!(file_contents(&dir.path().join("done")).await, "42", "stderr: {}", work.stderr());
    work.signal(libc::SIGTERM);
    assert_eq!(work.exit_code().await, 0, "stderr: {}", work.stderr());
}

/// A command that cannot run would fail every item the same way: the worker gives the item back
/// and exits with the shell's code, instead of burning the queue through its attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_stops_at_a_command_that_cannot_run_and_gives_its_item_back() {
    let server = Server::start();
    queues_ready(&server).await;
    let pushed = permit_with_input(&server, &["queue", "push", "typo"], "1\n2\n").await;
    assert_eq!(pushed.code, 0, "stderr: {}", pushed.stderr);
    let work =
        permit(&server, &["queue", "work", "typo", "--concurrency", "2", "--", "/nonexistent/encode"]).await;
    assert_eq!(work.code, EXIT_NOT_FOUND, "stderr: {}", work.stderr);
    let back =
        common::eventually(STEP_TIMEOUT, async || queue_counts(&server, "typo").await == Some((2, 0, 0)))
            .await;
    assert!(back, "both items are pending again: {:?}", queue_counts(&server, "typo").await);
}

/// Exit code of `permit take` when the rate has no room (documented by `permit take --help`).
const EXIT_RATE_LIMITED: i32 = 75;

/// `permit take` exits 0 while the rate has room and 75 once it has none (nothing taken, the
/// wait on stderr), so that `permit take NAME && CMD` runs CMD only within the rate; `--timeout`
/// waits for the rate; more permits than the burst, or no such semaphore, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_exits_0_within_the_rate_and_75_when_rate_limited() {
    let server = Server::start();
    // 3 a minute, 3 at once: after the burst, the next permit is 20 s away, so the fourth take
    // is refused however slowly the commands start.
    let set = permit(&server, &["set-capacity", "api.quota", "1", "--rate", "3/m", "--burst", "3"]).await;
    assert_eq!(set.code, 0, "stderr: {}", set.stderr);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let taken = permit(&server, &["take", "api.quota", "--print-token"]).await;
        assert_eq!(taken.code, 0, "stderr: {}", taken.stderr);
        tokens.push(taken.stdout.trim().parse::<u64>().expect("the token on stdout"));
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "tokens increase: {tokens:?}");
    let silent = permit(&server, &["take", "api.quota"]).await;
    assert_eq!(silent.code, EXIT_RATE_LIMITED, "the fourth take: {silent:?}");
    assert!(silent.stdout.is_empty(), "{silent:?}");
    assert!(silent.stderr.contains("api.quota is rate limited: nothing taken"), "{}", silent.stderr);
    assert_eq!(permit(&server, &["take", "api.quota", "-q"]).await.stderr, "", "--quiet");
    let shell = tokio::time::timeout(
        STEP_TIMEOUT,
        Command::new("sh")
            .args(["-c", "permit take api.quota -q && echo called; echo done"])
            .env("PATH", format!("{}:/usr/bin:/bin", Path::new(permit_bin()).parent().unwrap().display()))
            .env("PERMIT_SERVER", &server.url)
            .output(),
    )
    .await
    .expect("sh in time")
    .expect("run sh");
    assert_eq!(String::from_utf8_lossy(&shell.stdout), "done\n", "the command after && did not run");

    let over = permit(&server, &["take", "api.quota", "-n", "4"]).await;
    assert_eq!(over.code, EXIT_ERROR, "{over:?}");
    assert!(over.stderr.contains("permits_exceed_capacity"), "{}", over.stderr);
    let missing = permit(&server, &["take", "no.such.quota"]).await;
    assert_eq!(missing.code, EXIT_ERROR, "{missing:?}");
    assert!(missing.stderr.contains("semaphore_not_found"), "{}", missing.stderr);
    let long = permit(&server, &["take", "api.quota", "--timeout", "61s"]).await;
    assert_eq!(long.code, EXIT_USAGE, "{long:?}");

    // 3 a second, 3 at once: after a burst of 3, a take of 3 with --timeout waits about a second
    // for them; another at once finds no room within 100 ms.
    let set = permit(&server, &["set-capacity", "api.fast", "1", "--rate", "3/s", "--burst", "3"]).await;
    assert_eq!(set.code, 0, "stderr: {}", set.stderr);
    assert_eq!(permit(&server, &["take", "api.fast", "-n", "3"]).await.code, 0);
    let started = std::time::Instant::now();
    let waited = permit(&server, &["take", "api.fast", "-n", "3", "--timeout", "10s"]).await;
    assert_eq!(waited.code, 0, "{waited:?}");
    assert!(started.elapsed() >= Duration::from_millis(500), "taken after {:?}", started.elapsed());
    let late = permit(&server, &["take", "api.fast", "-n", "3", "--timeout", "100ms"]).await;
    assert_eq!(late.code, EXIT_RATE_LIMITED, "{late:?}");

    // A semaphore without a rate takes at once, always.
    assert_eq!(permit(&server, &["set-capacity", "plain", "1"]).await.code, 0);
    for _ in 0..5 {
        assert_eq!(permit(&server, &["take", "plain"]).await.code, 0);
    }
}

/// `permit set-capacity` sets every policy, keeps those its flags leave out and removes them with
/// `--no-rate`, `--no-group-max` and `--lock-delay 0s`; `permit show` prints the rate (with what
/// it has now), the lock-delay and the permits it keeps, and the groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_capacity_sets_and_removes_every_policy_and_show_prints_them() {
    let server = Server::start();
    let all = [
        "set-capacity",
        "gpu",
        "4",
        "--rate",
        "10/s",
        "--burst",
        "20",
        "--lock-delay",
        "5s",
        "--group-max",
        "2",
    ];
    let set = permit(&server, &all).await;
    assert_eq!(set.code, 0, "stderr: {}", set.stderr);
    for line in ["gpu: capacity 4", "rate: 10/s, burst 20", "lock-delay: 5000ms", "group-max: 2"] {
        assert!(set.stdout.contains(line), "{line:?} in {}", set.stdout);
    }
    let json = |output: Output| -> serde_json::Value {
        assert_eq!(output.code, 0, "stderr: {}", output.stderr);
        serde_json::from_str(&output.stdout).expect("JSON")
    };
    let view = json(permit(&server, &["show", "gpu", "--json"]).await);
    assert_eq!(view["rate"]["permits"], 10);
    assert_eq!(view["rate"]["per_ms"], 1000);
    assert_eq!(view["rate"]["burst"], 20);
    assert_eq!(view["lock_delay_ms"], 5000);
    assert_eq!(view["group_max"], 2);

    // A hold in a group, and another revoked: its permit stays out for the lock-delay.
    let client = client(&server);
    let holder = client.session(Duration::from_secs(30)).await.unwrap();
    let grouped = AcquireOptions::default().group("team-a");
    let _held = holder.acquire_with("gpu", 1, &grouped).await.unwrap().expect("granted");
    let failed = client.session(Duration::from_secs(30)).await.unwrap();
    let revoked = failed.acquire("gpu", 1).await.unwrap();
    assert_eq!(client.revoke("gpu", failed.id()).await.unwrap().released, 1);
    drop(revoked);
    let show = permit(&server, &["show", "gpu"]).await;
    assert_eq!(show.code, 0, "stderr: {}", show.stderr);
    for line in [
        "capacity 4, held 1, available 2",
        "rate: 10/s, burst 20:",
        "available now, next in",
        "lock-delay: 5000ms, 1 permits delayed now",
        "group-max: 2 permits per group",
        "delayed (lock-delay):",
        "GROUP",
    ] {
        assert!(show.stdout.contains(line), "{line:?} in\n{}", show.stdout);
    }
    let groups: Vec<Vec<&str>> = show
        .stdout
        .lines()
        .skip_while(|line| *line != "groups:")
        .skip(2)
        .take_while(|line| !line.is_empty())
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(groups, [["team-a", "1", "1", "0"]], "\n{}", show.stdout);

    // No flag keeps every policy.
    assert_eq!(permit(&server, &["set-capacity", "gpu", "5"]).await.code, 0);
    let view = json(permit(&server, &["show", "gpu", "--json"]).await);
    assert_eq!((view["capacity"].as_u64(), view["rate"]["permits"].as_u64()), (Some(5), Some(10)));
    assert_eq!((view["lock_delay_ms"].as_u64(), view["group_max"].as_u64()), (Some(5000), Some(2)));
    // A lock-delay out of range is refused by the server and changes nothing; a malformed rate
    // never reaches it.
    let refused = permit(&server, &["set-capacity", "gpu", "5", "--lock-delay", "61s"]).await;
    assert_eq!(refused.code, EXIT_ERROR, "{refused:?}");
    assert!(refused.stderr.contains("invalid_argument"), "{}", refused.stderr);
    let malformed = permit(&server, &["set-capacity", "gpu", "5", "--rate", "10 per second"]).await;
    assert_ne!(malformed.code, 0);
    assert!(malformed.stderr.contains("PERMITS/PERIOD"), "{}", malformed.stderr);
    assert_eq!(json(permit(&server, &["show", "gpu", "--json"]).await)["lock_delay_ms"], 5000);
    // The removals.
    let removed =
        permit(&server, &["set-capacity", "gpu", "5", "--no-rate", "--no-group-max", "--lock-delay", "0s"])
            .await;
    assert_eq!(removed.code, 0, "stderr: {}", removed.stderr);
    let view = json(permit(&server, &["show", "gpu", "--json"]).await);
    assert!(view.get("rate").is_none() && view.get("group_max").is_none(), "{view}");
    assert_eq!(view["lock_delay_ms"], 0);
    let show = permit(&server, &["show", "gpu"]).await;
    assert!(!show.stdout.contains("rate:") && !show.stdout.contains("group-max:"), "{}", show.stdout);
}

/// `permit run --group` waits while its group holds `group_max`, and a later run of another
/// group is granted ahead of it (passed over, it keeps its place); `permit lock --group` counts
/// against the cap too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_group_waits_at_the_group_cap_while_other_groups_go_first() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let set = permit(&server, &["set-capacity", "pool", "3", "--group-max", "1"]).await;
    assert_eq!(set.code, 0, "stderr: {}", set.stderr);
    let mut lock = Running::spawn(&server, dir.path(), &["lock", "pool", "--group", "team-a"]);
    let locked = common::eventually(STEP_TIMEOUT, async || lock.stdout().ends_with('\n')).await;
    assert!(locked, "no token printed; stderr: {}", lock.stderr());

    // team-a is at its cap although the pool has room: a try gives up.
    let capped =
        permit(&server, &["run", "pool", "--group", "team-a", "--timeout", "300ms", "--", "true"]).await;
    assert_eq!(capped.code, EXIT_TIMEOUT, "{capped:?}");
    // A waiting run of team-a, then one of team-b that goes first.
    let marker = dir.path().join("team-a-ran");
    let command = script(dir.path(), "echo $PERMIT_TOKEN > $DIR/team-a-ran");
    let mut waiting = Running::spawn(
        &server,
        dir.path(),
        &["run", "pool", "--group", "team-a", "--", "sh", "-c", &command],
    );
    let queued = common::eventually(STEP_TIMEOUT, async || waiting.stderr().contains("position 1")).await;
    assert!(queued, "{}", waiting.stderr());
    let other =
        permit(&server, &["run", "pool", "--group", "team-b", "--timeout", "10s", "--", "true"]).await;
    assert_eq!(other.code, 0, "team-b passed over team-a's waiter: {other:?}");
    let view = client(&server).get_semaphore("pool").await.unwrap();
    assert_eq!(view.waiters.len(), 1, "team-a's run still waits");
    assert_eq!(view.waiters[0].group.as_deref(), Some("team-a"));
    assert!(!marker.exists(), "team-a's run ran above its cap");
    assert_eq!(view.holders.iter().filter(|h| h.group.as_deref() == Some("team-a")).count(), 1);

    // The lock lets go: team-a's run gets its turn.
    lock.signal(libc::SIGTERM);
    assert_eq!(lock.exit_code().await, 0, "stderr: {}", lock.stderr());
    assert_eq!(waiting.exit_code().await, 0, "stderr: {}", waiting.stderr());
    assert!(file_contents(&marker).await.trim().parse::<u64>().is_ok());
}
