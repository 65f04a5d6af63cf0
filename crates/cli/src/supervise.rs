//! Running the command of `run` and `elect`: spawn it, forward signals to it, stop it when the
//! hold is lost, and turn its end into an exit code.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt};
use std::process::ExitStatus;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::{EXIT_CANNOT_EXECUTE, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_SIGNAL_BASE};

/// The signals `permit` catches while it holds something, and forwards to the command.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
}

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on, so that `permit` outlives them
    /// long enough to release and close its session.
    pub fn catch() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next caught signal's number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }
}

/// Where [`Running::supervise`] gets the signals it forwards to the command: the caught
/// [`Signals`] (`run`, `elect`), or a relay of them (`queue work`, which keeps the first signal
/// for itself and relays the next ones to every running command).
pub(crate) trait SignalSource {
    /// The next signal to forward; pending forever when there will be none.
    async fn next_signal(&mut self) -> i32;
}

impl SignalSource for Signals {
    async fn next_signal(&mut self) -> i32 {
        self.recv().await
    }
}

impl SignalSource for tokio::sync::broadcast::Receiver<i32> {
    async fn next_signal(&mut self) -> i32 {
        loop {
            match self.recv().await {
                Ok(signal) => return signal,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

/// The command to run while holding, and how to stop it.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    /// Program and arguments.
    pub command: Vec<OsString>,
    /// Grace period between SIGTERM and SIGKILL when the hold is lost.
    pub kill_after: Duration,
    /// Keep the command in `permit`'s process group (for interactive commands) and signal only
    /// it, instead of giving it its own group and signalling the whole group.
    pub foreground: bool,
    /// Leave `PERMIT_AUTH_TOKEN` in the command's environment (`--pass-token`). By default it
    /// is removed: the command runs under the lock, it is not the lock's owner, and a token
    /// in its environment leaks into whatever it runs, logs or dumps.
    pub pass_token: bool,
    /// The hold's local deadline when the command starts (the session's conservative
    /// deadline): the [`Watchdog`]'s first arming.
    pub deadline: Instant,
    /// Bytes to write to the command's standard input, which is then closed (`queue work`'s
    /// payload); `None` leaves `permit`'s standard input to the command.
    pub stdin: Option<Vec<u8>>,
}

/// The variable the CLI reads its token from, removed from a command's environment unless
/// [`Job::pass_token`].
pub(crate) const AUTH_TOKEN_VAR: &str = "PERMIT_AUTH_TOKEN";

/// How the command ended.
pub(crate) struct Ended {
    /// Its exit code, or 128 + the signal that killed it.
    pub code: i32,
    /// Whether the hold was lost while it ran (and it was told to stop).
    pub lost: bool,
}

/// A started command.
pub(crate) struct Running {
    child: Child,
    /// The process id.
    pid: i32,
    /// The command's process group (the guard's, which the command joins), unless `foreground`.
    group: Option<i32>,
    kill_after: Duration,
    /// Kills the command's process group if `permit` dies; `None` in the foreground.
    guard: Option<Guard>,
    /// Kills the command (its group) at the hold's local deadline unless re-armed, even while
    /// `permit` is stopped; `None` if it could not be started (reported on stderr).
    watchdog: Option<Watchdog>,
}

/// The signal the kernel sends the command when `permit` dies, however it dies (even by
/// SIGKILL): `PR_SET_PDEATHSIG`. SIGKILL rather than SIGTERM, because nobody is left to escalate:
/// the server frees the hold after the session's TTL, and the command must be gone by then even
/// if it ignores SIGTERM.
#[cfg(target_os = "linux")]
const PARENT_DEATH_SIGNAL: libc::c_int = libc::SIGKILL;

/// The shell script of the group guard: it ignores the signals `permit` forwards to the group,
/// blocks reading its stdin (a pipe whose only writer is `permit`) and kills its own process
/// group, which the command joined, with SIGKILL when the pipe closes without a line, which is
/// what happens when `permit` dies. A line (written by [`Guard::disarm`]) lets it exit quietly.
const GUARD_SCRIPT: &str = r#"trap '' INT TERM HUP QUIT; read -r line || kill -s KILL -- "-$$""#;

/// A small `/bin/sh` process that kills the command's process group when `permit` dies.
///
/// `PR_SET_PDEATHSIG` reaches only the command itself; the guard makes sure its children and
/// grandchildren (in its process group) go too. The guard starts *before* the command, which
/// joins the guard's process group: a `permit` killed at any moment after the command was forked
/// leaves a guard behind that ends it (started after the command, a guard could be missing when
/// a SIGKILL arrived right after the fork, and the command's children outlived `permit`).
struct Guard {
    pipe: std::io::PipeWriter,
    process: std::process::Child,
    /// The guard's pid, which is also its process group id.
    group: i32,
}

impl Guard {
    /// Starts a guard in a new process group of its own (so that a Ctrl-C in the terminal does
    /// not stop it), with no inherited files but the pipe.
    fn start() -> io::Result<Guard> {
        let (reader, pipe) = std::io::pipe()?;
        let process = std::process::Command::new("/bin/sh")
            .args(["-c", GUARD_SCRIPT, "permit-guard"])
            .env_clear()
            .stdin(reader)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        let group = i32::try_from(process.id()).map_err(io::Error::other)?;
        Ok(Guard { pipe, process, group })
    }

    /// Tells the guard to exit without killing anything (the command ended normally).
    fn disarm(mut self) {
        use std::io::Write;
        let _ = self.pipe.write_all(b"disarm\n");
        drop(self.pipe);
        let _ = self.process.wait();
    }
}

/// Starts the job's command with `env` added; on failure, the exit code to return.
///
/// The command dies with `permit` (see [`PARENT_DEATH_SIGNAL`]): it is forked from a thread that
/// lasts as long as the process, because the kernel sends the parent-death signal when the
/// *thread* that forked the child ends. Unless in the foreground, a [`Guard`] also kills its
/// process group when `permit` dies.
pub(crate) async fn spawn(job: &Job, env: &[(&str, String)]) -> Result<Running, i32> {
    let Some((program, arguments)) = job.command.split_first() else {
        eprintln!("permit: no command given");
        return Err(EXIT_ERROR);
    };
    let mut command = Command::new(program);
    command.args(arguments).envs(env.iter().map(|(key, value)| (key, value)));
    if job.stdin.is_some() {
        command.stdin(std::process::Stdio::piped());
    }
    if !job.pass_token {
        command.env_remove(AUTH_TOKEN_VAR);
    }
    die_with_this_process(&mut command);
    let (foreground, deadline) = (job.foreground, job.deadline);
    let started = on_lasting_thread(move || {
        let guard = if foreground { None } else { Some(Guard::start()) };
        if !foreground {
            // Join the guard's group; without a guard, a group of the command's own.
            command.process_group(match &guard {
                Some(Ok(guard)) => guard.group,
                _ => 0,
            });
        }
        // With a guard the command's group is known before it exists: the watchdog is armed
        // first, so that no moment passes with the command running and no watchdog (a
        // `permit` stopped right after the spawn would leave the command running past the
        // deadline). Otherwise it is armed right after the spawn, on this thread.
        let early = match &guard {
            Some(Ok(guard)) => Some(Watchdog::start(-guard.group, deadline)),
            _ => None,
        };
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                if let Some(Ok(watchdog)) = early {
                    watchdog.disarm();
                }
                if let Some(Ok(guard)) = guard {
                    guard.disarm();
                }
                return Err(error);
            }
        };
        let pid = child.id().and_then(|pid| i32::try_from(pid).ok()).unwrap_or(0);
        // In the foreground the command is signalled alone; without a guard, its own group.
        let watchdog =
            early.unwrap_or_else(|| Watchdog::start(if foreground { pid } else { -pid }, deadline));
        Ok((child, pid, guard, watchdog))
    })
    .await;
    let (mut child, pid, guard, watchdog) = started.map_err(|error| {
        eprintln!("permit: cannot run {}: {error}", program.to_string_lossy());
        match error.kind() {
            io::ErrorKind::NotFound => EXIT_NOT_FOUND,
            io::ErrorKind::PermissionDenied => EXIT_CANNOT_EXECUTE,
            _ => EXIT_ERROR,
        }
    })?;
    if let (Some(input), Some(mut pipe)) = (job.stdin.clone(), child.stdin.take()) {
        // Written in the background: a command that does not read its input must not hold
        // `permit` up; one that exits early closes the pipe (the write error is of no interest).
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let _ = pipe.write_all(&input).await;
        });
    }
    let guard = match guard {
        Some(Ok(guard)) => Some(guard),
        Some(Err(error)) => {
            eprintln!("permit: cannot start the process group guard ({error}); if permit is killed, the command's children may outlive it");
            None
        }
        None => None,
    };
    let group = match (&guard, job.foreground) {
        (_, true) => None,
        (Some(guard), false) => Some(guard.group),
        (None, false) => Some(pid),
    };
    let watchdog = match watchdog {
        Ok(watchdog) => Some(watchdog),
        Err(error) => {
            eprintln!("permit: cannot start the watchdog ({error}); if permit is stopped, nothing stops the command at the session's deadline");
            None
        }
    };
    Ok(Running { child, pid, group, kill_after: job.kill_after, guard, watchdog })
}

/// Makes the command die when this process dies: in the child, before exec, set the parent-death
/// signal, then check that the parent is still this process (it may have died before the
/// `prctl`, and the child would then have been adopted by another process and never get the
/// signal).
fn die_with_this_process(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid(2) has no preconditions.
        let parent = unsafe { libc::getpid() };
        let in_child = move || {
            // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid(2) are async-signal-safe system calls
            // without memory arguments; nothing here allocates or takes a lock, as required
            // between fork and exec.
            unsafe {
                if libc::prctl(libc::PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        };
        // SAFETY: the closure only makes async-signal-safe calls (see above).
        unsafe { command.pre_exec(in_child) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Work for the spawner thread.
type Work = Box<dyn FnOnce() + Send>;

/// Runs `work` on a thread that lives as long as the process, inside the current tokio runtime,
/// and returns its result.
async fn on_lasting_thread<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    static SPAWNER: Mutex<Option<mpsc::Sender<Work>>> = Mutex::new(None);
    let runtime = tokio::runtime::Handle::current();
    let (reply, answer) = tokio::sync::oneshot::channel();
    let work: Work = Box::new(move || {
        let _entered = runtime.enter();
        let _ = reply.send(work());
    });
    {
        let mut spawner = SPAWNER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let sender = match spawner.as_ref() {
            Some(sender) => sender.clone(),
            None => {
                let (sender, receiver) = mpsc::channel::<Work>();
                // The sender stays in the static, so the loop (and the thread) never ends.
                std::thread::Builder::new()
                    .name("permit-spawner".into())
                    .spawn(move || receiver.into_iter().for_each(|work| work()))?;
                spawner.insert(sender).clone()
            }
        };
        sender.send(work).map_err(|_| io::Error::other("the spawner thread is gone"))?;
    }
    answer.await.map_err(|_| io::Error::other("the spawner thread dropped the work"))?
}

/// How long before the hold's local deadline the [`Watchdog`] kills the command. The next
/// holder's command can start within milliseconds of the server's expiry, while the watchdog,
/// woken from `poll` at the deadline on a busy machine (or a thawing VM), can be scheduled tens
/// of milliseconds late: killing this much earlier keeps the command dead before the lease ends.
/// Far below a renewal's lead (a keepalive every third of the TTL moves the deadline on).
const WATCHDOG_LEAD_MS: i64 = 200;

/// How often [`Running::supervise`] passes the hold's deadline on to the [`Watchdog`]: often
/// enough that a renewal reaches it long before the old deadline (a third of the TTL at least).
const REARM_EVERY: Duration = Duration::from_millis(100);

/// The dead-man switch of `permit run` and `permit elect`: a process forked from `permit`, in a
/// process group of its own, that holds the hold's local deadline and sends SIGKILL to the
/// command (its process group) when the deadline passes. `permit` moves the deadline on after
/// each acknowledged keepalive by writing it to a pipe ([`Watchdog::rearm`]); when `permit` is
/// stopped (SIGSTOP, a frozen VM that thaws for the watchdog first, a hung runtime), the
/// deadline stays where it was and the command dies just before it ([`WATCHDOG_LEAD_MS`]),
/// before the server can expire the
/// session and grant the hold to someone else (the local deadline is never later than the
/// server's). Writing `0`, or closing the pipe, ends the watchdog without killing anything
/// (the command ended; if `permit` died, the [`Guard`] and the parent-death signal act).
///
/// It is forked rather than executed, so it needs no program on disk; between fork and exit it
/// makes only async-signal-safe system calls (`close`, `setpgid`, `clock_gettime`, `poll`,
/// `read`, `kill`, `_exit`), as required in the child of a multi-threaded process. Deadlines
/// travel as milliseconds of `CLOCK_MONOTONIC`, which every process shares.
struct Watchdog {
    pipe: std::io::PipeWriter,
    pid: libc::pid_t,
    /// The last deadline written, in ms of `CLOCK_MONOTONIC`.
    armed: i64,
}

/// Milliseconds of `CLOCK_MONOTONIC` (the clock of [`Instant`] on Linux).
fn monotonic_ms() -> i64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(2) writes the timespec we own; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec * 1000 + now.tv_nsec / 1_000_000
}

/// `at` in ms of `CLOCK_MONOTONIC`, rounded down (so never later than `at`).
fn instant_ms(at: Instant) -> i64 {
    let now = Instant::now();
    let ms = monotonic_ms();
    match at.checked_duration_since(now) {
        Some(ahead) => ms + i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX / 2),
        None => ms - i64::try_from(now.duration_since(at).as_millis()).unwrap_or(0) - 1,
    }
}

impl Watchdog {
    /// Forks the watchdog of `target` (a pid, or minus a process group id), armed for `deadline`.
    fn start(target: libc::pid_t, deadline: Instant) -> io::Result<Watchdog> {
        use std::os::fd::AsRawFd;
        let (reader, pipe) = std::io::pipe()?;
        let (read_fd, write_fd) = (reader.as_raw_fd(), pipe.as_raw_fd());
        let first = (instant_ms(deadline) - WATCHDOG_LEAD_MS).max(1);
        // SAFETY: the child runs only `watch`, which makes async-signal-safe calls and never
        // returns (it ends with _exit); the parent goes on as usual.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the forked child: see `watch`.
            unsafe { watch(read_fd, write_fd, target, first) }
        }
        drop(reader);
        Ok(Watchdog { pipe, pid, armed: first })
    }

    /// Moves the deadline to `deadline` (only later: a deadline never moves back).
    fn rearm(&mut self, deadline: Instant) {
        let at = (instant_ms(deadline) - WATCHDOG_LEAD_MS).max(1);
        if at > self.armed {
            use std::io::Write;
            // 8 bytes are below PIPE_BUF: the write is atomic, never half-read.
            if self.pipe.write_all(&at.to_le_bytes()).is_ok() {
                self.armed = at;
            }
        }
    }

    /// Ends the watchdog without killing anything, and reaps it.
    fn disarm(mut self) {
        use std::io::Write;
        let _ = self.pipe.write_all(&0i64.to_le_bytes());
        drop(self.pipe);
        // SAFETY: waitpid(2) on our own child.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

/// The watchdog's loop, in the forked child: wait on the pipe until the deadline; at the
/// deadline SIGKILL `target`; a `0` or end of file ends it quietly.
///
/// # Safety
///
/// Only in the child of `fork`: it closes every other descriptor and exits with `_exit`.
unsafe fn watch(read_fd: i32, write_fd: i32, target: libc::pid_t, mut deadline: i64) -> ! {
    // SAFETY (whole body): only async-signal-safe system calls on our own descriptors and
    // stack memory.
    unsafe {
        // Hold no descriptor but the read end: not `permit`'s connections, nor the write end
        // (whose last close by `permit` is the end-of-file that ends the watchdog).
        let _ = write_fd;
        for fd in 0..4096 {
            if fd != read_fd {
                libc::close(fd);
            }
        }
        // A group of its own: a Ctrl-Z or a signal to `permit`'s group does not stop it.
        libc::setpgid(0, 0);
        let mut buffer = [0u8; 8];
        let mut filled = 0usize;
        loop {
            let now = monotonic_ms();
            if now >= deadline {
                libc::kill(target, libc::SIGKILL);
                libc::_exit(0);
            }
            let timeout = (deadline - now).min(i64::from(i32::MAX)) as libc::c_int;
            let mut poll = libc::pollfd { fd: read_fd, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut poll, 1, timeout) <= 0 {
                continue; // Timed out (the deadline is checked above) or interrupted.
            }
            let read = libc::read(read_fd, buffer.as_mut_ptr().add(filled).cast(), 8 - filled);
            if read == 0 {
                libc::_exit(0);
            }
            if read < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(0);
            }
            filled += read as usize;
            if filled == 8 {
                filled = 0;
                let next = i64::from_le_bytes(buffer);
                if next == 0 {
                    libc::_exit(0);
                }
                deadline = deadline.max(next);
            }
        }
    }
}

impl Running {
    /// Waits for the command to end, forwarding caught signals to it and re-arming the
    /// [`Watchdog`] with `deadline()` (the hold's local deadline, moved on by each acknowledged
    /// keepalive). When `lost` resolves, calls `on_lost`, sends SIGTERM, and SIGKILL after the
    /// grace period.
    pub async fn supervise(
        mut self,
        signals: &mut impl SignalSource,
        lost: impl Future<Output = ()>,
        on_lost: impl FnOnce(),
        deadline: impl Fn() -> Instant,
    ) -> io::Result<Ended> {
        tokio::pin!(lost);
        let mut on_lost = Some(on_lost);
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        let mut rearm = tokio::time::interval(REARM_EVERY);
        rearm.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = rearm.tick(), if on_lost.is_some() => {
                    if let Some(watchdog) = &mut self.watchdog {
                        watchdog.rearm(deadline());
                    }
                }
                status = self.child.wait() => {
                    if let Some(watchdog) = self.watchdog.take() {
                        watchdog.disarm();
                    }
                    let lost = on_lost.is_none();
                    // After a lost hold the guard kills what the command left behind in its
                    // group; after a normal end it lets it be.
                    if let (false, Some(guard)) = (lost, self.guard.take()) {
                        guard.disarm();
                    }
                    return Ok(Ended { code: exit_code(status?), lost });
                }
                signal = signals.next_signal() => self.signal(signal),
                () = &mut lost, if on_lost.is_some() => {
                    if let Some(on_lost) = on_lost.take() {
                        on_lost();
                    }
                    self.signal(libc::SIGTERM);
                    kill_at = Some(Instant::now() + self.kill_after);
                }
                () = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                    eprintln!("permit: the command did not stop within {:?}; sending SIGKILL", self.kill_after);
                    self.signal(libc::SIGKILL);
                    killed = true;
                }
            }
        }
    }

    /// Sends `signal` to the command (its whole process group unless in the foreground). The
    /// child is not reaped before `supervise` returns, so its pid cannot be reused meanwhile.
    fn signal(&self, signal: i32) {
        let target = self.group.map_or(self.pid, |group| -group);
        // SAFETY: kill(2) has no memory-safety preconditions; the target is our unreaped child
        // (or the group of our unreaped guard).
        let result = unsafe { libc::kill(target, signal) };
        if result != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ESRCH) {
                eprintln!("permit: cannot send signal {signal} to the command: {error}");
            }
        }
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed the process.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => EXIT_SIGNAL_BASE + signal,
        (None, None) => EXIT_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether process `pid` runs (exists and is not a zombie).
    fn alive(pid: i32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
        !matches!(state, Some('Z' | 'X') | None)
    }

    /// The parent-death signal fires when the *thread* that forked the child ends: a command
    /// started from a short-lived thread must outlive that thread.
    #[test]
    fn the_command_outlives_the_thread_that_asked_for_it() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let job = Job {
            command: vec!["sleep".into(), "30".into()],
            kill_after: Duration::from_secs(1),
            foreground: false,
            pass_token: false,
            deadline: Instant::now() + Duration::from_secs(60),
            stdin: None,
        };
        let handle = runtime.handle().clone();
        let started = std::thread::spawn(move || handle.block_on(spawn(&job, &[]))).join().unwrap();
        let Ok(running) = started else { panic!("sleep did not start") };
        // The asking thread is gone; a signal tied to it would arrive within this window.
        let watch_until = std::time::Instant::now() + Duration::from_millis(300);
        while std::time::Instant::now() < watch_until {
            assert!(alive(running.pid), "the command died with the thread that started it");
            std::thread::sleep(Duration::from_millis(10));
        }
        running.signal(libc::SIGKILL);
        let mut child = running.child;
        runtime.block_on(child.wait()).unwrap();
    }
}
