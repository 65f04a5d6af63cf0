//! Running the command of `run` and `elect`: spawn it, forward signals to it, stop it when the
//! hold is lost, and turn its end into an exit code.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
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

/// The command to run while holding, and how to stop it.
#[derive(Debug)]
pub(crate) struct Job {
    /// Program and arguments.
    pub command: Vec<OsString>,
    /// Grace period between SIGTERM and SIGKILL when the hold is lost.
    pub kill_after: Duration,
    /// Keep the command in `permit`'s process group (for interactive commands) and signal only
    /// it, instead of giving it its own group and signalling the whole group.
    pub foreground: bool,
}

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
    /// The process id (and, unless `foreground`, the process group id).
    pid: i32,
    foreground: bool,
    kill_after: Duration,
}

/// Starts the job's command with `env` added; on failure, the exit code to return.
pub(crate) fn spawn(job: &Job, env: &[(&str, String)]) -> Result<Running, i32> {
    let (program, arguments) = job.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    command.args(arguments).envs(env.iter().map(|(key, value)| (key, value)));
    if !job.foreground {
        command.process_group(0);
    }
    let child = command.spawn().map_err(|error| {
        eprintln!("permit: cannot run {}: {error}", program.to_string_lossy());
        match error.kind() {
            io::ErrorKind::NotFound => EXIT_NOT_FOUND,
            io::ErrorKind::PermissionDenied => EXIT_CANNOT_EXECUTE,
            _ => EXIT_ERROR,
        }
    })?;
    let pid = child.id().and_then(|pid| i32::try_from(pid).ok()).expect("a just-spawned child has a pid");
    Ok(Running { child, pid, foreground: job.foreground, kill_after: job.kill_after })
}

impl Running {
    /// Waits for the command to end, forwarding caught signals to it. When `lost` resolves,
    /// calls `on_lost`, sends SIGTERM, and SIGKILL after the grace period.
    pub async fn supervise(
        mut self,
        signals: &mut Signals,
        lost: impl Future<Output = ()>,
        on_lost: impl FnOnce(),
    ) -> io::Result<Ended> {
        tokio::pin!(lost);
        let mut on_lost = Some(on_lost);
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        loop {
            tokio::select! {
                status = self.child.wait() => {
                    return Ok(Ended { code: exit_code(status?), lost: on_lost.is_none() });
                }
                signal = signals.recv() => self.signal(signal),
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
        let target = if self.foreground { self.pid } else { -self.pid };
        // SAFETY: kill(2) has no memory-safety preconditions; the target is our unreaped child.
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
