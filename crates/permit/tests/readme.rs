//! The README, run as written: every command of its CLI tour against a real `permit serve`, and
//! every repository path and link it names.
//!
//! The tour's lines run word for word in `sh`; only the environment is the test's: `PERMIT_SERVER`
//! names a server on an ephemeral port, `PATH` starts with the directory of the `permit` binary
//! under test (for `cargo install`), and the working directory is a temp dir where `examples/` is
//! the repository's (the README runs the tour from the repository's root). A line marked
//! `# blocks` runs as if in another terminal (its own process group, without the tour's shell
//! variables) and is left running; the tour goes on once it has printed its first line, as a
//! reader would wait for it. Every other line must return within `LINE_TIMEOUT` with the code its
//! comment gives (`# exits N`), 0 when it gives none. The shell variables a line assigns
//! (`TOKEN=$(...)`) are carried to the lines after it, as one terminal would keep them.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{permit_bin, Server};

/// The repository's root.
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Longest a line that does not say it blocks may run.
const LINE_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a blocking line may take to print its first line, and to end after Ctrl-C.
const BLOCKING_TIMEOUT: Duration = Duration::from_secs(20);
/// The heading of the CLI tour.
const CLI_TOUR: &str = "## A five-minute tour with the CLI";
/// The folders whose paths the README names, which must exist.
const REPOSITORY_FOLDERS: &[&str] = &["examples", "docs", "crates", "clients", "deploy"];

fn readme() -> String {
    std::fs::read_to_string(Path::new(REPO).join("README.md")).expect("read README.md")
}

/// The lines of the ```sh blocks under the `##` heading `heading` (up to the next `##`), with
/// lines continued by a trailing `\` joined, and without empty and comment-only lines.
fn sh_lines(readme: &str, heading: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_section = false;
    let mut in_block = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if !in_block && line.starts_with("## ") {
            in_section = line == heading;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.starts_with("```") {
            in_block = !in_block && line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(start) = line.strip_suffix('\\') {
            pending.push_str(start);
            continue;
        }
        let joined = std::mem::take(&mut pending) + line;
        let trimmed = joined.trim();
        if !trimmed.is_empty() && !trimmed.starts_with('#') {
            lines.push(joined);
        }
    }
    lines
}

/// Whether the README says the line blocks.
fn blocks(line: &str) -> bool {
    line.contains("# blocks")
}

/// Whether a blocking line says that a later line of the tour ends it (`# blocks until ...`).
fn ends_in_the_tour(line: &str) -> bool {
    line.contains("# blocks until")
}

/// The exit code the line's comment gives (`# exits N`), 0 when it gives none.
fn expected_code(line: &str) -> i32 {
    code_after(line, "# exits ")
}

/// The number after `marker` in `line`, 0 when there is no marker.
fn code_after(line: &str, marker: &str) -> i32 {
    line.split_once(marker).map_or(0, |(_, rest)| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or_else(|_| panic!("`{marker}` without a number in {line:?}"))
    })
}

/// The shell variable a line assigns at its start (`NAME=...`), if any.
fn assigned(line: &str) -> Option<&str> {
    let (name, _) = line.split_once('=')?;
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some(name)
}

/// `value` quoted for `sh`.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// A process group started for one line, killed (by its id) when dropped.
struct Group {
    child: Child,
    line: String,
}

impl Group {
    fn pgid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling the process group this test started (its leader's id is the group's).
        unsafe { libc::kill(-self.pgid(), signal) };
    }

    /// Waits up to `timeout` for the group's leader (the `sh`) to exit.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Where the tour runs: the server, the working directory and the environment of every line.
struct Tour {
    server: Server,
    work: tempfile::TempDir,
    /// The files a line's assigned variables are written to.
    vars_dir: tempfile::TempDir,
    /// The shell variables assigned so far, carried to later lines.
    vars: BTreeMap<String, String>,
}

impl Tour {
    fn new() -> Tour {
        let server = Server::start();
        let work = tempfile::tempdir().expect("temp dir");
        let examples = Path::new(REPO).join("examples").canonicalize().expect("the repository has examples/");
        std::os::unix::fs::symlink(examples, work.path().join("examples")).expect("link examples/");
        Tour { server, work, vars_dir: tempfile::tempdir().expect("temp dir"), vars: BTreeMap::new() }
    }

    /// `sh -c script` in the tour's directory and environment, in a process group of its own.
    fn spawn(&self, script: &str) -> Child {
        let bin_dir = PathBuf::from(permit_bin()).parent().expect("the binary's directory").to_owned();
        let path = std::env::join_paths(
            std::iter::once(bin_dir)
                .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .expect("PATH");
        let mut command = Command::new("sh");
        command.arg("-c").arg(script).current_dir(self.work.path());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PERMIT_") {
                command.env_remove(name);
            }
        }
        // Ctrl-C and Ctrl-\ as a terminal's shell leaves them: a test run started in the
        // background of a shell without job control inherits SIGINT and SIGQUIT ignored, and a
        // command with no handler of its own (`permit events`) would then ignore Ctrl-C.
        // SAFETY: between fork and exec only `signal`, which is async-signal-safe, is called.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
        command
            .env("PATH", path)
            .env("PERMIT_SERVER", &self.server.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn sh")
    }

    /// Runs a line that returns, with the variables of the lines before it; its exit code and
    /// output.
    fn run(&mut self, line: &str) -> (i32, String) {
        let mut script: String =
            self.vars.iter().map(|(name, value)| format!("{name}={}\n", quoted(value))).collect();
        script.push_str(line);
        script.push_str("\nreadme_tour_code=$?\n");
        let assigned = assigned(line).map(str::to_owned);
        if let Some(name) = &assigned {
            let file = self.vars_dir.path().join(name);
            script.push_str(&format!("printf '%s' \"${name}\" > {}\n", quoted(&file.display().to_string())));
        }
        script.push_str("exit $readme_tour_code\n");
        let mut group = Group { child: self.spawn(&script), line: line.to_owned() };
        let output = collect(&mut group.child);
        let Some(status) = group.wait(LINE_TIMEOUT) else {
            panic!(
                "this README line did not return within {LINE_TIMEOUT:?}; a command that blocks must \
                 say so (`# blocks: ...`) and where to go next:\n{}",
                group.line
            );
        };
        // Bounded too: a process the line left behind could keep its output open.
        let output = output.recv_timeout(LINE_TIMEOUT).unwrap_or_else(|_| {
            panic!("this README line returned but left its output open for {LINE_TIMEOUT:?}:\n{line}")
        });
        if let Some(name) = assigned {
            let value =
                std::fs::read_to_string(self.vars_dir.path().join(&name)).expect("the variable's file");
            self.vars.insert(name, value);
        }
        (status.code().unwrap_or(-1), output)
    }

    /// Starts a line that blocks, as in another terminal, and waits for its first line of output.
    fn start_blocking(&self, line: &str) -> Group {
        let mut group = Group { child: self.spawn(line), line: line.to_owned() };
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(group.child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
            Box::new(group.child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        match rx.recv_timeout(BLOCKING_TIMEOUT) {
            Ok(_) => {}
            Err(_) => {
                panic!("this README line blocks but printed nothing within {BLOCKING_TIMEOUT:?}:\n{line}")
            }
        }
        assert!(
            group.child.try_wait().expect("try_wait").is_none(),
            "this README line says it blocks, but it returned:\n{line}"
        );
        group
    }
}

/// Reads the child's stdout and stderr to the end on threads (so that a full pipe never stops
/// it); both, stdout first, once both are closed.
fn collect(child: &mut Child) -> mpsc::Receiver<String> {
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let err = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = tx.send(text + &err.join().unwrap_or_default());
    });
    rx
}

#[test]
fn the_cli_tour_runs_as_written() {
    let text = readme();
    let lines = sh_lines(&text, CLI_TOUR);
    let (install, tour): (Vec<String>, Vec<String>) =
        lines.into_iter().partition(|line| line.starts_with("cargo install "));
    assert_eq!(install.len(), 1, "the tour installs permit first (the test puts its binary on PATH)");
    assert!(tour.len() >= 10, "the tour's block was found under {CLI_TOUR:?}: {tour:#?}");
    let mut session = Tour::new();
    let mut others = Vec::new();
    for line in &tour {
        if blocks(line) {
            others.push(session.start_blocking(line));
            continue;
        }
        let (code, output) = session.run(line);
        assert_eq!(code, expected_code(line), "this README line exited {code}:\n{line}\n{output}");
    }
    // The blocking lines are still running, and Ctrl-C ends each, as the README says; but for
    // those the tour itself ends (`# blocks until ...`), which exit with the code they give.
    for other in &mut others {
        if ends_in_the_tour(&other.line) {
            let status = other.wait(BLOCKING_TIMEOUT).unwrap_or_else(|| {
                panic!("this README line says the tour ends it, but it runs on:\n{}", other.line)
            });
            assert_eq!(
                status.code(),
                Some(code_after(&other.line, "exits ")),
                "this README line ended with another code than it gives:\n{}",
                other.line
            );
            continue;
        }
        assert!(
            other.child.try_wait().expect("try_wait").is_none(),
            "this README line says it blocks, but it ended during the tour:\n{}",
            other.line
        );
        other.signal(libc::SIGINT);
        assert!(
            other.wait(BLOCKING_TIMEOUT).is_some(),
            "Ctrl-C did not end this README line:\n{}",
            other.line
        );
    }
    assert!(others.len() >= 3, "the tour's blocking lines were recognised: {tour:#?}");
}

/// The paths under `REPOSITORY_FOLDERS` that `text` names (`examples/migrate.sh`,
/// `docs/operations.md#anchor`, `./examples/scheduler.sh`), without anchors.
fn repository_paths(text: &str) -> Vec<String> {
    let separators = |c: char| c.is_whitespace() || "`'\"()[]<>,;|=:*".contains(c);
    let mut paths: Vec<String> = text
        .split(separators)
        .map(|word| word.trim_start_matches("./").trim_end_matches('.'))
        .map(|word| word.split('#').next().unwrap_or_default())
        .filter(|word| {
            REPOSITORY_FOLDERS
                .iter()
                .any(|folder| word.strip_prefix(folder).is_some_and(|rest| rest.starts_with('/')))
        })
        .map(str::to_owned)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[test]
fn every_repository_path_the_readme_names_exists() {
    let paths = repository_paths(&readme());
    for expected in ["examples/migrate.sh", "examples/scheduler.sh", "docs/operations.md", "crates/permit"] {
        assert!(paths.iter().any(|path| path == expected), "{expected} is among the paths found: {paths:?}");
    }
    let missing: Vec<&String> = paths.iter().filter(|path| !Path::new(REPO).join(path).exists()).collect();
    assert!(missing.is_empty(), "the README names paths that do not exist: {missing:?}");
    for script in ["examples/migrate.sh", "examples/scheduler.sh"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(Path::new(REPO).join(script)).expect(script).permissions().mode();
        assert!(mode & 0o111 != 0, "{script} is executable, as the README runs it");
    }
}

/// The anchor GitHub gives a Markdown heading: lower case, spaces as `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    let text = heading.trim_start_matches('#').trim().to_lowercase();
    text.chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The targets of the Markdown links in `text` that carry an anchor: (file, anchor), the file
/// empty for the text's own headings.
fn anchored_links(text: &str) -> Vec<(String, String)> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .filter_map(|(target, _)| target.split_once('#'))
        .map(|(file, anchor)| (file.to_owned(), anchor.to_owned()))
        .collect()
}

#[test]
fn every_link_of_the_readme_leads_to_a_heading() {
    let text = readme();
    let links = anchored_links(&text);
    assert!(links.iter().any(|(file, _)| file.is_empty()), "the README links to its own headings: {links:?}");
    for (file, wanted) in links {
        let target = if file.is_empty() {
            text.clone()
        } else {
            std::fs::read_to_string(Path::new(REPO).join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"))
        };
        let found = target.lines().filter(|line| line.starts_with('#')).any(|line| anchor(line) == wanted);
        assert!(found, "the README links to {file}#{wanted}, a heading that does not exist");
    }
}

#[test]
fn the_readme_parser_finds_markers_codes_variables_and_paths() {
    assert_eq!(anchor("## CLI exit codes"), "cli-exit-codes");
    assert_eq!(anchor("### Restore, then grow (a node's secret)"), "restore-then-grow-a-nodes-secret");
    assert_eq!(
        anchored_links("see [a](#b-c), ![i](docs/i.png) and [d](docs/e.md#f)."),
        [("".to_owned(), "b-c".to_owned()), ("docs/e.md".to_owned(), "f".to_owned())]
    );
    assert!(blocks("permit lock x   # blocks: holds it"));
    assert!(ends_in_the_tour("permit lock x   # blocks until the revoke below, then exits 76"));
    assert_eq!(code_after("permit lock x   # blocks until the revoke below, then exits 76: y", "exits "), 76);
    assert!(!ends_in_the_tour("permit lock x   # blocks: holds it"));
    assert!(!blocks("permit ls   # every semaphore"));
    assert_eq!(expected_code("permit validate x 7   # exits 3: not current"), 3);
    assert_eq!(expected_code("permit ls"), 0);
    assert_eq!(assigned("TOKEN=$(permit run x -- true)"), Some("TOKEN"));
    assert_eq!(assigned("permit run x -- sh -c 'A=1'"), None);
    assert_eq!(quoted("it's"), r"'it'\''s'");
    let lines = sh_lines("## A\n```sh\na \\\n  b\n# comment\n\nc\n```\n## B\n```sh\nd\n```\n", "## A");
    assert_eq!(lines, ["a   b", "c"]);
    let paths = repository_paths("run `./examples/a.sh`, see [x](docs/b.md#c) and crates/d/e.rs.");
    assert_eq!(paths, ["crates/d/e.rs", "docs/b.md", "examples/a.sh"]);
}
