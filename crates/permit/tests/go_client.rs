//! Runs the Go client's checks in `clients/go` (`gofmt -l` finds nothing, `go vet` is clean,
//! `go test -race ./...` passes) against the `permit` binary built from this commit.
//!
//! The client uses the standard library only: `go` never needs the network (`GOPROXY=off`
//! makes sure of it); its build cache is `target/go-cache`. Without a Go of at least 1.19 the test says why and passes, unless
//! `PERMIT_REQUIRE_GO=1` (CI), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/require.rs"]
mod require;
use require::{or_skip, Need};

fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/go").canonicalize().expect("clients/go")
}

/// `go` with an environment that keeps it offline and independent of the caller's settings. Its
/// build cache is `target/go-cache` in the repository (ignored by git, and no need for a home
/// directory), unless the caller sets `GOCACHE`.
fn go(dir: &Path) -> Command {
    let mut command = Command::new("go");
    if std::env::var_os("GOCACHE").is_none() {
        command.env("GOCACHE", Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/go-cache"));
    }
    command
        .current_dir(dir)
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "1");
    command
}

fn output(command: &mut Command) -> Result<Output, String> {
    command.output().map_err(|error| format!("{command:?} could not start: {error}"))
}

/// The Go toolchain's version, checked to be at least 1.19 and to have a race detector.
fn toolchain(dir: &Path) -> Result<String, String> {
    let version = output(go(dir).args(["env", "GOVERSION"]))?;
    if !version.status.success() {
        return Err(format!("`go env GOVERSION` failed: {}", String::from_utf8_lossy(&version.stderr)));
    }
    let text = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let minor = text
        .strip_prefix("go1.")
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse::<u32>().ok());
    match minor {
        Some(minor) if minor >= 19 => {}
        _ => return Err(format!("Go {text} is older than 1.19 (or unknown)")),
    }
    if Command::new("cc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Err("no C compiler as `cc` for Go's race detector".to_owned());
    }
    Ok(text)
}

#[test]
fn go_client_suite() {
    let dir = client_dir();
    let Some(version) = or_skip(Need::Go, toolchain(&dir)) else { return };
    eprintln!("Go client suite with {version}");
    let gofmt = Command::new(Path::new(&go_root(&dir)).join("bin/gofmt"))
        .args(["-l", "."])
        .current_dir(&dir)
        .output()
        .expect("run gofmt");
    assert!(gofmt.status.success(), "gofmt failed: {}", String::from_utf8_lossy(&gofmt.stderr));
    let listed = String::from_utf8_lossy(&gofmt.stdout);
    assert!(
        listed.trim().is_empty(),
        "gofmt -l lists files that are not formatted (run gofmt -w .):\n{listed}"
    );
    let vet = go(&dir).args(["vet", "./..."]).status().expect("run go vet");
    assert!(vet.success(), "go vet found problems in clients/go");
    let tests = go(&dir)
        // The tests mostly wait on servers (TTLs, a failover): more of them at once than the
        // default (GOMAXPROCS) halves the suite's time.
        .args(["test", "-race", "-count=1", "-parallel", "8", "./..."])
        .env("PERMIT_BIN", env!("CARGO_BIN_EXE_permit"))
        .status()
        .expect("run go test");
    assert!(tests.success(), "the Go client's suite failed (go test -race ./... in clients/go)");
}

/// `go env GOROOT`: gofmt lives in its bin directory (it may not be on the PATH).
fn go_root(dir: &Path) -> String {
    let root = go(dir).args(["env", "GOROOT"]).output().expect("go env GOROOT");
    String::from_utf8_lossy(&root.stdout).trim().to_owned()
}
