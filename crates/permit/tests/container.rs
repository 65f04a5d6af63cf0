//! The container image (`deploy/container/`): `build.sh` builds it with podman from the binary
//! under test, and its unpacked filesystem runs on its own. podman here can build images but not
//! start containers, so the image's entrypoint runs in a chroot of the image's filesystem, as
//! the image's user, with a temporary volume bound at its `VOLUME`; it must serve, keep its data
//! in the volume, pass its own `HEALTHCHECK`, and hold no shell. Needs podman and root (skipped
//! without them unless `PERMIT_REQUIRE_PODMAN=1`).

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::require::{or_skip, Need};
use crate::common::{eventually, permit_bin, Server};

/// Longest the image's build (or a podman command) may take.
const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy")).join(path)
}

/// podman with its storage in `storage` (vfs), so the test leaves nothing in the machine's.
struct Podman {
    conf: PathBuf,
}

impl Podman {
    fn new(storage: &Path) -> Podman {
        let conf = storage.join("storage.conf");
        let text = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            storage.join("graph").display(),
            storage.join("run").display()
        );
        std::fs::write(&conf, text).unwrap();
        Podman { conf }
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.env("CONTAINERS_STORAGE_CONF", &self.conf);
        command
    }

    /// `podman --storage-driver vfs ARGS`'s stdout; fails the test on a non-zero exit.
    fn run(&self, args: &[&str]) -> String {
        let mut command = self.command("podman");
        command.arg("--storage-driver").arg("vfs").args(args);
        let output = bounded(command, PODMAN_TIMEOUT);
        assert!(output.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }
}

/// Runs `command` to its end, at most `timeout` (then kills it by its PID and fails).
fn bounded(mut command: Command, timeout: Duration) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

fn podman_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the test is not running as root (it chroots into the image)".into());
    }
    let version =
        Command::new("podman").arg("--version").output().map_err(|e| format!("cannot run podman: {e}"))?;
    version.status.success().then_some(()).ok_or_else(|| "podman --version failed".into())
}

/// Every path under `root`, relative to it.
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut paths = BTreeSet::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                pending.push(path.clone());
            }
            paths.insert(path.strip_prefix(root).unwrap().to_owned());
        }
    }
    paths
}

#[tokio::test]
async fn the_image_builds_and_its_filesystem_serves_on_its_own_without_a_shell() {
    let Some(()) = or_skip(Need::Podman, podman_available()) else { return };
    let temp = tempfile::tempdir().unwrap();
    let podman = Podman::new(temp.path());
    let tag = format!("localhost/permit-test:{}", std::process::id());

    let mut build = podman.command(deploy("container/build.sh"));
    build.arg(permit_bin()).arg(&tag);
    let built = bounded(build, PODMAN_TIMEOUT);
    assert!(built.status.success(), "build.sh: {}", String::from_utf8_lossy(&built.stderr));

    let config: Value =
        serde_json::from_str(&podman.run(&["image", "inspect", &tag, "--format", "{{json .Config}}"]))
            .unwrap();
    let health: Value =
        serde_json::from_str(&podman.run(&["image", "inspect", &tag, "--format", "{{json .HealthCheck}}"]))
            .unwrap();
    let strings = |value: &Value| -> Vec<String> {
        value.as_array().unwrap_or(&vec![]).iter().map(|item| item.as_str().unwrap().to_owned()).collect()
    };
    let entrypoint = strings(&config["Entrypoint"]);
    assert_eq!(entrypoint, ["/usr/bin/permit", "serve"], "{config}");
    assert!(config["Volumes"].get("/var/lib/permit").is_some(), "no volume at /var/lib/permit: {config}");
    assert!(config["ExposedPorts"].get("7376/tcp").is_some(), "7376 not exposed: {config}");
    let user = config["User"].as_str().expect("a USER").to_owned();
    let uid: u32 = user.split(':').next().unwrap().parse().expect("a numeric user");
    assert_ne!(uid, 0, "the image runs as root");
    let check = strings(&health["Test"]);
    assert_eq!(check.first().map(String::as_str), Some("CMD"), "a HEALTHCHECK without a shell: {health}");

    let root = PathBuf::from(podman.run(&["image", "mount", &tag]).trim());
    let _unmount = Unmount { podman: &podman, tag: &tag };

    // Nothing but the binary, its libraries, the user's lines, the configuration and the CA
    // bundle: no shell.
    let paths = tree(&root);
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash", "bin/busybox"] {
        assert!(!root.join(shell).exists(), "the image has /{shell}");
    }
    for path in paths.iter().filter(|path| root.join(path).is_file()) {
        let name = path.file_name().unwrap().to_str().unwrap();
        let expected = [
            "usr/bin/permit",
            "etc/passwd",
            "etc/group",
            "etc/permit/permit.toml",
            "etc/ssl/certs/ca-certificates.crt",
        ]
        .contains(&path.to_str().unwrap())
            || name.contains(".so");
        assert!(expected, "the image holds /{}", path.display());
    }
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd.lines().any(|line| line.split(':').nth(2) == Some(&uid.to_string())),
        "no user {uid} in {passwd}"
    );
    assert_eq!(
        std::fs::metadata(root.join("var/lib/permit")).unwrap().uid(),
        uid,
        "the data dir is not the user's"
    );

    // The entrypoint with the image's environment, on an ephemeral port (the flag beats the
    // image's configuration file), in a private mount namespace where the volume is bound.
    let volume = temp.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    std::os::unix::fs::chown(&volume, Some(uid), Some(uid)).unwrap();
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$2/var/lib/permit" && shift 2 && exec "$@""#)
        .arg("sh")
        .arg(&volume)
        .arg(&root)
        .arg("chroot")
        .arg(format!("--userspec={user}"))
        .arg(&root)
        .args(&entrypoint)
        .args(["--listen", "0.0.0.0:0"]);
    let image_env: Vec<(String, String)> = strings(&config["Env"])
        .iter()
        .map(|pair| pair.split_once('=').map(|(key, value)| (key.to_owned(), value.to_owned())).unwrap())
        .collect();
    command.env_clear().envs(image_env.iter().cloned());
    let server = Server::spawn(command);
    let port = server.addr.strip_prefix("0.0.0.0:").expect("the image's server listens on 0.0.0.0");
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let healthy = eventually(Duration::from_secs(20), async || {
        let answer = http.get(format!("{url}/v1/health")).timeout(Duration::from_secs(2)).send().await;
        answer.is_ok_and(|answer| answer.status() == 200)
    })
    .await;
    assert!(healthy, "the image's server never answered /v1/health with 200");
    for kept in ["raft-log", "root-token"] {
        let path = volume.join(kept);
        assert_eq!(
            std::fs::metadata(&path).map(|m| m.uid()).ok(),
            Some(uid),
            "{} not the user's",
            path.display()
        );
    }

    // The image's HEALTHCHECK command, in the image, as its user.
    let mut probe = Command::new("chroot");
    probe
        .arg(format!("--userspec={user}"))
        .arg(&root)
        .args(&check[1..])
        .env_clear()
        .envs(image_env.iter().cloned())
        .env("PERMIT_SERVER", &url);
    let probed = bounded(probe, Duration::from_secs(30));
    assert!(probed.status.success(), "the HEALTHCHECK failed: {}", String::from_utf8_lossy(&probed.stderr));
    drop(server);
}

/// Unmounts the image when the test ends, passed or failed.
struct Unmount<'a> {
    podman: &'a Podman,
    tag: &'a str,
}

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let mut command = self.podman.command("podman");
        command.args(["--storage-driver", "vfs", "image", "unmount", self.tag]);
        let _ = command.output();
    }
}
