//! The Python client's W1/W2 rows: `clients/python/bench_driver.py` run as a child process
//! against the same server as the Rust driver's rows, in alternation, so that the Python
//! client's own overhead shows as a ratio measured on the same machine at the same time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

/// The figures one client driver run prints (milliseconds): the Python and Go drivers print the
/// same JSON line.
pub struct DriverRun {
    pub cycles_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The Python interpreter and driver script to use, or why there is none.
pub struct Driver {
    python: PathBuf,
    script: PathBuf,
}

impl Driver {
    /// `python` if given, else the repository's test venv (`.ci/venv-python`, which has httpx),
    /// else `python3` on the PATH; the driver imports the client from `clients/python`.
    pub fn find(python: Option<&Path>) -> anyhow::Result<Driver> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let script = root.join("clients/python/bench_driver.py");
        anyhow::ensure!(script.exists(), "{} not found", script.display());
        let venv = root.join(".ci/venv-python/bin/python");
        let python = match python {
            Some(path) => path.to_owned(),
            None if venv.exists() => venv,
            None => PathBuf::from("python3"),
        };
        let check = Command::new(&python)
            .args(["-c", "import httpx"])
            .status()
            .with_context(|| format!("cannot start {}", python.display()))?;
        anyhow::ensure!(check.success(), "{} cannot import httpx (pip install httpx)", python.display());
        Ok(Driver { python, script })
    }

    /// Runs one workload (`w1` or `w2`) in one mode (`threads` or `asyncio`).
    pub async fn run(
        &self,
        url: &str,
        workload: &str,
        mode: &str,
        name: &str,
        duration: Duration,
    ) -> anyhow::Result<DriverRun> {
        let mut command = Command::new(&self.python);
        command
            .arg(&self.script)
            .args(["--url", url, "--workload", workload, "--mode", mode, "--name", name])
            .args(["--duration", &format!("{:.3}", duration.as_secs_f64())])
            .env("PYTHONPATH", self.script.parent().expect("clients/python"));
        let output = tokio::task::spawn_blocking(move || command.output()).await??;
        anyhow::ensure!(
            output.status.success(),
            "the Python driver failed ({workload} {mode}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        figures(&String::from_utf8_lossy(&output.stdout), "the Python driver")
    }
}

/// The figures of a driver's last output line (`{"cycles_per_second":..,"p50_ms":..,"p99_ms":..}`).
pub fn figures(text: &str, who: &str) -> anyhow::Result<DriverRun> {
    let line = text.lines().last().with_context(|| format!("{who} printed nothing"))?;
    let figures: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{who}'s JSON"))?;
    let number = |key: &str| figures[key].as_f64().with_context(|| format!("no {key} in {line}"));
    Ok(DriverRun {
        cycles_per_second: number("cycles_per_second")?,
        p50_ms: number("p50_ms")?,
        p99_ms: number("p99_ms")?,
    })
}
