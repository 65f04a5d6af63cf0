//! The codemap of `docs/ARCHITECTURE.md`, enforced: which crate may depend on which. A new edge
//! between crates, or a crate without a rule, fails here, so the map cannot drift silently. And
//! every dependency a crate declares is used by its code.

use std::path::Path;

/// One crate's rule: the Permit crates it may depend on, and either the only outside crates it
/// may use (`Only`) or those it must never use (`Never`).
struct Rule {
    dir: &'static str,
    permit_deps: &'static [&'static str],
    outside: Outside,
}

enum Outside {
    Only(&'static [&'static str]),
    Never(&'static [&'static str]),
}

const RULES: &[Rule] = &[
    // imbl (MPL-2.0): persistent ordered maps, so a snapshot is encoded from an O(1) copy.
    Rule {
        dir: "core",
        permit_deps: &[],
        outside: Outside::Only(&["serde", "postcard", "thiserror", "imbl"]),
    },
    Rule { dir: "wire", permit_deps: &[], outside: Outside::Only(&["serde", "serde_json", "utoipa"]) },
    Rule { dir: "server", permit_deps: &["permit-core", "permit-wire"], outside: Outside::Never(&["clap"]) },
    Rule {
        dir: "client",
        permit_deps: &["permit-wire"],
        outside: Outside::Never(&["openraft", "axum", "hyper", "postcard"]),
    },
    Rule {
        dir: "cli",
        permit_deps: &["permit-client"],
        outside: Outside::Never(&["reqwest", "openraft", "axum"]),
    },
    Rule { dir: "permit", permit_deps: &["permit-server", "permit-cli"], outside: Outside::Never(&[]) },
    Rule { dir: "check", permit_deps: &[], outside: Outside::Only(&["serde", "serde_json", "thiserror"]) },
    Rule { dir: "faults", permit_deps: &["permit-check"], outside: Outside::Never(&["openraft"]) },
    Rule {
        dir: "sim",
        permit_deps: &["permit-core", "permit-server", "permit-check"],
        outside: Outside::Never(&[]),
    },
    Rule { dir: "bench", permit_deps: &[], outside: Outside::Never(&["openraft"]) },
];

/// The names under `[dependencies]` of a Cargo.toml (not dev- or build-dependencies).
fn dependencies(manifest: &str) -> Vec<String> {
    let mut in_section = false;
    let mut names = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[dependencies]";
            continue;
        }
        if in_section && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(|c: char| c == '=' || c == '.' || c.is_whitespace()).next().unwrap_or("");
            names.push(name.to_owned());
        }
    }
    names
}

#[test]
fn every_crate_depends_only_on_what_the_codemap_allows() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut dirs: Vec<String> = std::fs::read_dir(crates)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join("Cargo.toml").exists())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut ruled: Vec<String> = RULES.iter().map(|rule| rule.dir.to_owned()).collect();
    ruled.sort();
    assert_eq!(dirs, ruled, "every crate has a rule here and a row in docs/ARCHITECTURE.md's codemap");
    let mut broken = Vec::new();
    for rule in RULES {
        let manifest = std::fs::read_to_string(crates.join(rule.dir).join("Cargo.toml")).unwrap();
        for dependency in dependencies(&manifest) {
            let allowed = if dependency.starts_with("permit-") {
                rule.permit_deps.contains(&dependency.as_str())
            } else {
                match rule.outside {
                    Outside::Only(only) => only.contains(&dependency.as_str()),
                    Outside::Never(never) => !never.contains(&dependency.as_str()),
                }
            };
            if !allowed {
                broken.push(format!("crates/{} depends on {dependency}", rule.dir));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "edges the codemap does not allow (a new edge is a change of its own):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_codemap_names_every_crate() {
    let map =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ARCHITECTURE.md")).unwrap();
    for rule in RULES {
        assert!(
            map.contains(&format!("`crates/{}`", rule.dir)),
            "docs/ARCHITECTURE.md has no row for crates/{}",
            rule.dir
        );
    }
}

/// Files of `crates/server/src` outside `raft/` that may write the replica (the lessor's
/// bookkeeping of session deadlines). Handlers only read it.
const REPLICA_WRITERS_OUTSIDE_RAFT: &[&str] = &["expiry.rs"];

/// Where the server may name a library, by path prefix under `crates/server/src`.
const SERVER_LIBRARIES: &[(&str, &[&str])] = &[
    ("axum", &["api/", "auth.rs", "error.rs", "listener.rs", "peer.rs"]),
    ("hyper", &["listener.rs", "peer_conn.rs", "raft/network.rs"]),
];

/// Every `.rs` file under `dir`, as paths relative to `root`.
fn rust_files(root: &Path, dir: &Path, files: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(root, &path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
        }
    }
}

fn names(source: &str, library: &str) -> bool {
    source.contains(&format!("{library}::")) || source.contains(&format!("use {library}"))
}

#[test]
fn the_server_names_openraft_axum_and_hyper_and_writes_the_replica_only_where_the_codemap_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src");
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    files.sort();
    assert!(files.len() > 20, "the scan found the server's sources: {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(root.join(file)).unwrap();
        let in_raft = file.starts_with("raft/");
        if names(&source, "openraft") && !in_raft {
            broken.push(format!("{file} names openraft"));
        }
        let writes = source.contains("replica.write()") || source.contains("replica().write()");
        if writes && !in_raft && !REPLICA_WRITERS_OUTSIDE_RAFT.contains(&file.as_str()) {
            broken.push(format!("{file} writes the replica"));
        }
        for (library, allowed) in SERVER_LIBRARIES {
            if names(&source, library) && !allowed.iter().any(|prefix| file.starts_with(prefix)) {
                broken.push(format!("{file} names {library}"));
            }
        }
    }
    assert!(broken.is_empty(), "outside the codemap:\n{}", broken.join("\n"));
}

/// The layers of `crates/server/src`, by path prefix: what a file there must not name. The HTTP
/// layer (`api/`) reaches the consensus layer only through its one state, `api/app.rs`, and never
/// the node that builds that state; the authorisation rules, the error answer and the fail-stop
/// latch sit below both; nothing but the node wiring (and `lib.rs` above it) names the node.
/// Together they keep the import circle that once tied `api/`, `auth.rs` and `node.rs` from
/// coming back.
const SERVER_LAYERS: &[(&str, &[&str])] = &[
    ("api/app.rs", &["crate::node", "crate::Node"]),
    ("api/", &["crate::raft", "crate::node", "crate::Node"]),
    ("auth.rs", &["crate::api", "crate::node", "crate::Node", "crate::raft"]),
    ("error.rs", &["crate::api", "crate::node", "crate::Node", "crate::raft", "crate::auth"]),
    ("failstop.rs", &["crate::api", "crate::node", "crate::Node", "crate::raft"]),
    ("raft/", &["crate::api", "crate::node", "crate::Node"]),
    ("", &["crate::node", "crate::Node"]),
];

/// Files that may name what [`SERVER_LAYERS`] forbids everywhere else: the node wiring and the
/// crate root above it.
const SERVER_TOP: &[&str] = &["node.rs", "lib.rs"];

/// `source` without its comment lines (doc comments name modules in links).
fn code_lines(source: &str) -> impl Iterator<Item = &str> {
    source.lines().filter(|line| !line.trim_start().starts_with("//"))
}

#[test]
fn the_server_is_layered_with_the_http_layer_on_its_app() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src");
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    files.sort();
    assert!(files.iter().any(|file| file == "api/app.rs"), "the scan found the server's sources: {files:?}");
    let mut broken = Vec::new();
    for file in files.iter().filter(|file| !SERVER_TOP.contains(&file.as_str())) {
        let source = std::fs::read_to_string(root.join(file)).unwrap();
        // The first (most specific) layer whose prefix the file has.
        let (layer, forbidden) = SERVER_LAYERS.iter().find(|(prefix, _)| file.starts_with(prefix)).unwrap();
        for line in code_lines(&source) {
            for name in forbidden
                .iter()
                .filter(|name| line.contains(&format!("{name}::")) || line.contains(&format!("{name};")))
            {
                broken.push(format!("{file} (layer `{layer}`) names {name}: {}", line.trim()));
            }
        }
    }
    assert!(broken.is_empty(), "across the server's layers:\n{}", broken.join("\n"));
}

/// The names a Cargo.toml declares in its dependency sections (normal, dev and build).
fn declared(manifest: &str) -> Vec<String> {
    let mut in_section = false;
    let mut names = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = matches!(line, "[dependencies]" | "[dev-dependencies]" | "[build-dependencies]");
            continue;
        }
        if in_section && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(|c: char| c == '=' || c == '.' || c.is_whitespace()).next().unwrap_or("");
            names.push(name.to_owned());
        }
    }
    names
}

/// Whether `source` names the crate `ident` as a path or in a `use`/`extern crate`: the word
/// followed by `::`, or after `use ` / `extern crate `.
fn uses_crate(source: &str, ident: &str) -> bool {
    let word_at = |at: usize| at == 0 || !source[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
    source.match_indices(ident).any(|(at, _)| {
        let after = &source[at + ident.len()..];
        word_at(at)
            && (after.starts_with("::")
                || (source[..at].ends_with("use ") || source[..at].ends_with("extern crate "))
                    && !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    })
}

/// A dependency that no code of its crate names is dead weight in every build (CI used to run
/// `cargo machete` for this; the same check here costs no install).
#[test]
fn every_declared_dependency_is_used() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut unused = Vec::new();
    for rule in RULES {
        let dir = crates.join(rule.dir);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let mut sources = String::new();
        for sub in ["src", "tests", "benches", "examples"] {
            if dir.join(sub).is_dir() {
                let mut files = Vec::new();
                rust_files(&dir, &dir.join(sub), &mut files);
                for file in files {
                    sources.push_str(&std::fs::read_to_string(dir.join(file)).unwrap());
                    sources.push('\n');
                }
            }
        }
        if let Ok(build) = std::fs::read_to_string(dir.join("build.rs")) {
            sources.push_str(&build);
        }
        assert!(!sources.is_empty(), "crates/{} has sources", rule.dir);
        for dependency in declared(&manifest) {
            if !uses_crate(&sources, &dependency.replace('-', "_")) {
                unused.push(format!("crates/{} declares {dependency}", rule.dir));
            }
        }
    }
    assert!(unused.is_empty(), "dependencies no code names (remove them):\n{}", unused.join("\n"));
}

#[test]
fn a_crate_counts_as_used_only_as_a_path_or_an_import() {
    assert!(uses_crate("let x = serde_json::to_vec(&v);", "serde_json"));
    assert!(uses_crate("use tokio;", "tokio"));
    assert!(uses_crate("use tokio::sync::Mutex;", "tokio"));
    assert!(uses_crate("extern crate libc;", "libc"));
    assert!(!uses_crate("let tokio_thing = 1; // tokio", "tokio"));
    assert!(!uses_crate("my_serde::x()", "serde"));
    assert!(!uses_crate("use serde_json::Value;", "serde"));
}

/// Every Rust file `docs/ARCHITECTURE.md` names (in backticks, with or without its crate's
/// prefix) exists, so that the map follows renames and deletions.
#[test]
fn every_file_the_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let named: Vec<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            span.ends_with(".rs") && span.chars().all(|c| c.is_ascii_alphanumeric() || "_/.".contains(c))
        })
        .collect();
    assert!(named.len() > 40, "the scan found the map's file names: {named:?}");
    let mut everywhere = Vec::new();
    rust_files(&root.join("crates"), &root.join("crates"), &mut everywhere);
    let mut missing = Vec::new();
    for path in named {
        // A name without its crate's path (`raft.rs`, `log/sync.rs`) stands for a file of the
        // module the text is describing.
        if everywhere.iter().any(|file| file.ends_with(&format!("/{path}"))) {
            continue;
        }
        let (first, rest) = path.split_once('/').unwrap_or(("", path));
        let candidates = [
            root.join(path),
            root.join("crates").join(path),
            root.join("crates").join(first).join("src").join(rest),
            root.join("crates").join(first).join(rest),
        ];
        let in_some_crate = ["server", "core", "client", "cli", "sim", "check", "faults", "bench", "permit"]
            .iter()
            .any(|krate| root.join("crates").join(krate).join("src").join(path).exists());
        if !in_some_crate && !candidates.iter().any(|candidate| candidate.exists()) {
            missing.push(path);
        }
    }
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md names files that do not exist: {missing:?}");
}

/// The names under which `crates/server/src/bugs.rs` injects its bugs (`PERMIT_INJECT_BUG`).
fn bug_names(root: &Path) -> Vec<String> {
    let source = std::fs::read_to_string(root.join("crates/server/src/bugs.rs")).unwrap();
    let names: Vec<String> = source
        .lines()
        .filter_map(|line| {
            line.trim().strip_prefix("(\"")?.split_once("\", Bug::").map(|(name, _)| name.to_owned())
        })
        .collect();
    assert!(names.len() >= 5, "the scan found the bugs' names: {names:?}");
    names
}

/// Whether cargo enables `permit-server`'s `bug-injection` feature in a build of `permit` that
/// follows the dependency `edges` (`normal`: `cargo build`; with `dev`: `cargo test`).
fn bug_injection_enabled(root: &Path, edges: &str) -> bool {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .current_dir(root)
        .args(["tree", "--offline", "-p", "permit", "--prefix", "none", "-e"])
        .arg(format!("features,{edges}"))
        .output()
        .unwrap();
    assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .any(|line| line == "permit-server feature \"bug-injection\"")
}

/// The injected bugs of the fault suite's self-test are compiled into test builds only: a
/// normal build of `permit` (the release binary) never enables `bug-injection`, and the binary
/// that `PERMIT_RELEASE_BIN` names, if set, holds none of the bugs' names.
#[test]
fn the_release_build_has_no_injectable_bugs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    assert!(
        bug_injection_enabled(&root, "normal,dev"),
        "a test build enables bug-injection (else this check looks for the wrong line)"
    );
    assert!(
        !bug_injection_enabled(&root, "normal"),
        "a normal build of permit enables permit-server's bug-injection feature"
    );
    let names = bug_names(&root);
    let Some(binary) = std::env::var_os("PERMIT_RELEASE_BIN") else { return };
    // Lossy: the names are ASCII, and the bytes around them do not change them.
    let text = String::from_utf8_lossy(&std::fs::read(&binary).unwrap()).into_owned();
    let found: Vec<&String> = names.iter().filter(|name| text.contains(name.as_str())).collect();
    assert!(found.is_empty(), "{} holds the injectable bugs {found:?}", Path::new(&binary).display());
}
