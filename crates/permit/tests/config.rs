//! `permit serve --config FILE`, the `PERMIT_*` variables and their precedence (flag >
//! environment > file > default), and `permit config check` / `show`, against real processes.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{eventually, permit_bin, Server};

/// Longest a short `permit` command (or a server that refuses to start) may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// The exit code, stdout and stderr of a short `permit` command.
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `permit ARGS` with `env`, and no `PERMIT_*` variable of the test's own environment.
fn permit(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = clean(Command::new(permit_bin()))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn permit");
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for permit") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("permit {args:?} did not exit within {COMMAND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child.stdout.take().expect("stdout").read_to_string(&mut stdout).expect("read stdout");
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    Output { code: status.code(), stdout, stderr }
}

/// `command` without the `PERMIT_*` variables of the test's environment, which would set
/// `serve`'s flags.
fn clean(mut command: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PERMIT_") {
            command.env_remove(key);
        }
    }
    command
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a test file");
    path.to_str().expect("a UTF-8 temp path").to_owned()
}

async fn healthy(url: &str) -> bool {
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(20), async || {
        let answer = http.get(format!("{url}/v1/health")).timeout(Duration::from_secs(2)).send().await;
        answer.is_ok_and(|answer| answer.status() == 200)
    })
    .await
}

/// The file's `listen` and `data-dir` are the ones the server uses: it serves on the file's
/// address (another loopback address than the default's) with its data where the file says.
#[tokio::test]
async fn a_file_sets_the_address_and_data_dir_the_server_uses() {
    let temp = tempfile::tempdir().unwrap();
    let data = temp.path().join("from-file");
    let file = write(
        temp.path(),
        "permit.toml",
        &format!(
            "# a node\nlisten = \"127.0.0.2:0\"\ndata-dir = \"{}\"\nsnapshot-logs = 500\n",
            data.display()
        ),
    );
    let mut command = clean(Command::new(permit_bin()));
    command.args(["serve", "--config", &file]);
    let server = Server::spawn(command);
    assert!(server.addr.starts_with("127.0.0.2:"), "serving on {}", server.addr);
    assert!(healthy(&server.url).await, "{} never healthy", server.url);
    assert!(data.join("raft-log").is_dir(), "no log in the file's data dir {}", data.display());

    // PERMIT_CONFIG names the file as --config does.
    let env_data = temp.path().join("env-file");
    let env_file = write(
        temp.path(),
        "env.toml",
        &format!("listen = \"127.0.0.5:0\"\ndata-dir = \"{}\"\n", env_data.display()),
    );
    let mut command = clean(Command::new(permit_bin()));
    command.arg("serve").env("PERMIT_CONFIG", &env_file);
    let server = Server::spawn(command);
    assert!(server.addr.starts_with("127.0.0.5:"), "serving on {}", server.addr);
    assert!(healthy(&server.url).await);
    assert!(env_data.join("raft-log").is_dir());
}

/// A flag beats its environment variable, which beats the file: three sources, three loopback
/// addresses and three data dirs, and the server uses the winners.
#[tokio::test]
async fn a_flag_beats_the_environment_which_beats_the_file() {
    let temp = tempfile::tempdir().unwrap();
    let dir = |name: &str| temp.path().join(name).to_str().unwrap().to_owned();
    let file = write(
        temp.path(),
        "permit.toml",
        &format!(
            "listen = \"127.0.0.2:0\"\ndata-dir = \"{}\"\nmetrics-public = true\nauth = false\n",
            dir("file-data")
        ),
    );
    let mut command = clean(Command::new(permit_bin()));
    command
        .args(["serve", "--config", &file, "--data-dir", &dir("flag-data")])
        .env("PERMIT_LISTEN", "127.0.0.3:0")
        .env("PERMIT_DATA_DIR", dir("env-data"));
    let server = Server::spawn(command);
    assert!(
        server.addr.starts_with("127.0.0.3:"),
        "the environment's address wins over the file's: {}",
        server.addr
    );
    assert!(healthy(&server.url).await);
    assert!(Path::new(&dir("flag-data")).join("raft-log").is_dir(), "the flag's data dir wins");
    assert!(!Path::new(&dir("env-data")).exists() && !Path::new(&dir("file-data")).exists());

    // The same precedence in `config show`, with each value's source; a boolean of the file is
    // overridden by its variable too.
    let shown = permit(
        &["config", "show", "--config", &file, "--data-dir", &dir("flag-data")],
        &[("PERMIT_LISTEN", "127.0.0.3:0"), ("PERMIT_DATA_DIR", &dir("env-data")), ("PERMIT_AUTH", "true")],
    );
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    let lines: Vec<&str> = shown.stdout.lines().collect();
    for expected in [
        "listen = \"127.0.0.3:0\"  # from PERMIT_LISTEN".to_owned(),
        format!("data-dir = \"{}\"  # from --data-dir", dir("flag-data")),
        "metrics-public = true  # from the file".to_owned(),
        "auth = true  # from PERMIT_AUTH".to_owned(),
        "connections-max = 4096  # default".to_owned(),
    ] {
        assert!(lines.contains(&expected.as_str()), "no line {expected:?} in:\n{}", shown.stdout);
    }
}

/// An unknown key or a bad value stops `serve` and fails `config check`, with the file, the
/// line and the key; a good file passes the check.
#[test]
fn an_unknown_key_or_a_bad_value_names_the_file_line_and_key() {
    let temp = tempfile::tempdir().unwrap();
    let data = temp.path().join("data");
    let data = data.to_str().unwrap();
    let cases = [
        (
            "unknown.toml",
            "listen = \"127.0.0.1:0\"\n\nlisten-address = \"127.0.0.1:0\"\n",
            3,
            "key `listen-address`: unknown key",
        ),
        (
            "value.toml",
            "listen = \"127.0.0.1:0\"\nconnections-max = \"many\"\n",
            2,
            "key `connections-max`: invalid value 'many'",
        ),
        ("type.toml", "auth = \"yes\"\n", 1, "key `auth`: expected true or false, not string"),
        ("peer.toml", "peers = [\"1=127.0.0.1:1\", \"two\"]\n", 1, "key `peers`: invalid value 'two'"),
        ("address.toml", "listen = 7376\n", 1, "key `listen`: invalid value '7376'"),
    ];
    for (name, text, line, message) in cases {
        let file = write(temp.path(), name, text);
        let expected = format!("{file}:{line}: {message}");
        let checked = permit(&["config", "check", &file], &[]);
        assert_eq!(checked.code, Some(2), "{name}: {}", checked.stderr);
        assert!(checked.stderr.contains(&expected), "{name}: expected {expected:?} in {:?}", checked.stderr);
        let served = permit(&["serve", "--config", &file, "--data-dir", data], &[]);
        assert_eq!(served.code, Some(1), "{name}: {}", served.stderr);
        assert!(served.stderr.contains(&expected), "{name}: expected {expected:?} in {:?}", served.stderr);
        assert!(!Path::new(data).exists(), "{name}: the server started");
    }
    // A relation between flags is checked too, and a syntax error names the line.
    let file = write(temp.path(), "relation.toml", "join = true\npeers = [\"1=127.0.0.1:1\"]\n");
    let checked = permit(&["config", "check", &file], &[]);
    assert_eq!(checked.code, Some(2));
    assert!(
        checked.stderr.contains(&file) && checked.stderr.contains("cannot be used with"),
        "{}",
        checked.stderr
    );
    let file = write(temp.path(), "syntax.toml", "auth = true\nlisten = \"127.0.0.1:0\n");
    let checked = permit(&["config", "check", &file], &[]);
    assert_eq!(checked.code, Some(2));
    assert!(checked.stderr.contains(&file) && checked.stderr.contains("line 2"), "{}", checked.stderr);
    // The server's own checks of the values: a public address without --auth is refused.
    let file = write(temp.path(), "open.toml", "listen = \"0.0.0.0:7376\"\n");
    let checked = permit(&["config", "check", &file], &[]);
    assert_eq!(checked.code, Some(2));
    assert!(checked.stderr.contains("without --auth"), "{}", checked.stderr);

    // The secret a file names is checked; the environment's PERMIT_ROOT_TOKEN is not the file's.
    let weak = write(temp.path(), "weak.secret", "weak\n");
    let file = write(temp.path(), "weak.toml", &format!("auth = true\nroot-token-file = \"{weak}\"\n"));
    let checked = permit(&["config", "check", &file], &[]);
    assert_eq!(checked.code, Some(2));
    assert!(checked.stderr.contains("too easy to guess"), "{}", checked.stderr);
    let file = write(temp.path(), "auth.toml", "auth = true\n");
    let checked = permit(&["config", "check", &file], &[("PERMIT_ROOT_TOKEN", "weak")]);
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);

    let file = write(
        temp.path(),
        "good.toml",
        &format!("listen = \"127.0.0.1:0\"\ndata-dir = \"{data}\"\nauth = true\n"),
    );
    let checked = permit(&["config", "check", &file], &[]);
    assert_eq!(
        (checked.code, checked.stdout.trim()),
        (Some(0), format!("{file}: ok").as_str()),
        "{}",
        checked.stderr
    );
}

/// `config show` prints the paths of secret files and never a secret: not the cluster
/// secret's or the root token file's contents, and not `PERMIT_ROOT_TOKEN`.
#[test]
fn config_show_hides_the_secrets() {
    let temp = tempfile::tempdir().unwrap();
    let cluster_secret = "c2VjcmV0LWNsdXN0ZXIta2V5LW5vdC10by1iZS1wcmludGVk";
    let root_secret = "4f9a7c21e0b35d68a1c9e7f203b6d5a84c1e9f7a2b3d6c5e";
    let env_secret = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f";
    let secret_file = write(temp.path(), "cluster.secret", cluster_secret);
    let root_file = write(temp.path(), "root.secret", root_secret);
    let file = write(
        temp.path(),
        "permit.toml",
        &format!("join = true\ncluster-secret-file = \"{secret_file}\"\nauth = true\nroot-token-file = \"{root_file}\"\n"),
    );
    let shown = permit(&["config", "show", "--config", &file], &[("PERMIT_ROOT_TOKEN", env_secret)]);
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    let output = format!("{}{}", shown.stdout, shown.stderr);
    for secret in [cluster_secret, root_secret, env_secret] {
        assert!(!output.contains(secret), "a secret is printed:\n{output}");
    }
    assert!(
        shown.stdout.contains(&format!("cluster-secret-file = \"{secret_file}\"  # from the file")),
        "{output}"
    );
    assert!(shown.stdout.contains("set by PERMIT_ROOT_TOKEN (not shown)"), "{output}");
    // What it prints is a configuration file that gives the same configuration.
    let again = write(temp.path(), "shown.toml", &shown.stdout);
    let checked = permit(&["config", "check", &again], &[]);
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
}
