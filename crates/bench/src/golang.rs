//! The Go client's W1/W2 rows: `clients/go/cmd/permit-bench-go`, built once with `go build`
//! (standard library only: nothing is downloaded) and run as a child process against the same
//! server as the Rust driver's rows, in alternation, so that the Go client's own overhead shows
//! as a ratio measured on the same machine at the same time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use crate::python::{figures, DriverRun};

/// The built Go driver.
pub struct Driver {
    exe: PathBuf,
}

impl Driver {
    /// Builds the driver into `work` with `go` (the toolchain given, else `go` on the PATH).
    pub fn build(go: Option<&Path>, work: &Path) -> anyhow::Result<Driver> {
        let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/go");
        anyhow::ensure!(module.join("go.mod").exists(), "{} has no go.mod", module.display());
        let exe = work.join("permit-bench-go");
        let go = go.unwrap_or(Path::new("go"));
        let output = Command::new(go)
            .args(["build", "-o"])
            .arg(&exe)
            .arg("./cmd/permit-bench-go")
            .current_dir(&module)
            .env("GOPROXY", "off")
            .env("GOFLAGS", "")
            .output()
            .with_context(|| format!("cannot start {}", go.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "go build of the Go driver failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(Driver { exe })
    }

    /// Runs one workload (`w1` or `w2`).
    pub async fn run(
        &self,
        url: &str,
        workload: &str,
        name: &str,
        duration: Duration,
    ) -> anyhow::Result<DriverRun> {
        let mut command = Command::new(&self.exe);
        command
            .args(["-url", url, "-workload", workload, "-name", name])
            .args(["-duration", &format!("{}ms", duration.as_millis())]);
        let output = tokio::task::spawn_blocking(move || command.output()).await??;
        anyhow::ensure!(
            output.status.success(),
            "the Go driver failed ({workload}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        figures(&String::from_utf8_lossy(&output.stdout), "the Go driver")
    }
}
