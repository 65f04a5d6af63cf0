//! Runs the Python client's checks (`mypy --strict` and the pytest suite in
//! `clients/python/tests`) against the `permit` binary built from this commit.
//!
//! The Python tools live in a venv at `.ci/venv-python` in the repository root, created and
//! filled on first use (pinned versions, the client installed editable). Without python3 or
//! the venv module, or when pip cannot install, the test says why and passes, unless
//! `PERMIT_REQUIRE_PYTHON=1` (CI), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/require.rs"]
mod require;
use require::{or_skip, Need};

/// What the venv holds; a change here reinstalls.
const REQUIREMENTS: &[&str] =
    &["httpx==0.29.0", "sniffio==1.3.1", "pytest==9.2.0", "pytest-xdist==3.8.0", "mypy==2.4.1"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn run(command: &mut Command) -> Result<(), String> {
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("{command:?} exited with {status}")),
        Err(error) => Err(format!("{command:?} could not start: {error}")),
    }
}

/// The venv's python, created and filled if needed.
fn venv(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join(".ci/venv-python");
    let python = dir.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    }
    let stamp = dir.join("permit-requirements.txt");
    let wanted = format!("{}\n-e clients/python\n", REQUIREMENTS.join("\n"));
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(REQUIREMENTS))?;
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e"])
            .arg(root.join("clients/python")))?;
        std::fs::write(&stamp, wanted).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    }
    Ok(python)
}

#[test]
fn python_client_suite() {
    let root = repo_root();
    let Some(python) = or_skip(Need::Python, venv(&root)) else { return };
    let client = root.join("clients/python");
    let cache = root.join(".ci/venv-python/mypy-cache");
    let typed = Command::new(&python)
        .args(["-m", "mypy", "--strict", "--cache-dir"])
        .arg(&cache)
        .arg("permit")
        .current_dir(&client)
        .status()
        .expect("run mypy");
    assert!(typed.success(), "mypy --strict found errors in clients/python/permit");
    let tests = Command::new(&python)
        // Three workers, each with its own session server: the suite mostly waits on servers
        // (outages, TTLs), so it overlaps well on two cores; more starve the 0.9 s TTL tests'
        // keepalives when the machine is busy.
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "tests"])
        .current_dir(&client)
        .env("PERMIT_BIN", env!("CARGO_BIN_EXE_permit"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .expect("run pytest");
    assert!(tests.success(), "the Python client's pytest suite failed");
}
