//! CPU time of processes over a window of a measurement, from `/proc/PID/stat`: the server's
//! and the load generator's share of this machine's 2 cores.

use std::time::Duration;

use anyhow::Context;

/// CPU time of processes over a window.
pub struct CpuWindow {
    pids: Vec<String>,
    before: Vec<u64>,
}

impl CpuWindow {
    /// Starts measuring `pids` ("self" for this process).
    pub fn start(pids: Vec<String>) -> anyhow::Result<CpuWindow> {
        let before = pids.iter().map(|pid| cpu_ticks(pid)).collect::<anyhow::Result<_>>()?;
        Ok(CpuWindow { pids, before })
    }

    /// Each process's CPU since the start as % of one core, over `elapsed`.
    pub fn percent(&self, elapsed: Duration) -> anyhow::Result<Vec<f64>> {
        self.pids
            .iter()
            .zip(&self.before)
            .map(|(pid, before)| {
                let ticks = cpu_ticks(pid)? - before;
                Ok(ticks as f64 / ticks_per_second() / elapsed.as_secs_f64() * 100.0)
            })
            .collect()
    }
}

/// utime + stime of `/proc/{pid}/stat`, in clock ticks.
fn cpu_ticks(pid: &str) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces), from field 3 (state) on.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}
