//! Injected I/O errors: an `LD_PRELOAD` shim (built here with `cc`) makes every `fdatasync` and
//! `fsync` fail with `EIO` after the first N. The node answers 503 `storage_error`, exits
//! non-zero without retrying the fsync, and a restart without the shim recovers every
//! acknowledged write. Skipped with a message where `cc` is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::full_disk::{assert_recovered, write_until_it_stops};
use crate::common::Server;

/// Syncs that succeed before the shim fails them all: enough to start and serve a while.
const SYNCS_BEFORE_FAILING: &str = "300";
/// Concurrent writers.
const WORKERS: usize = 4;
/// Longest the writers may run before the injected failure must have stopped them.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_long calls;

static int failing(void) {
    const char *after = getenv("PERMIT_FAIL_SYNC_AFTER");
    return after != NULL && atomic_fetch_add(&calls, 1) >= atol(after);
}

static void note(const char *what) {
    const char *log = getenv("PERMIT_FAIL_SYNC_LOG");
    if (log == NULL) return;
    FILE *f = fopen(log, "a");
    if (f == NULL) return;
    fprintf(f, "%s\n", what);
    fclose(f);
}

int fdatasync(int fd) {
    if (failing()) { note("fdatasync failed"); errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

int fsync(int fd) {
    if (failing()) { note("fsync failed"); errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"#;

/// Builds the shim into `dir`; its path, or why it could not be built.
fn build_shim(dir: &Path) -> Result<PathBuf, String> {
    let source = dir.join("fail_sync.c");
    let library = dir.join("fail_sync.so");
    std::fs::write(&source, SHIM).map_err(|e| e.to_string())?;
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(library)
}

#[tokio::test]
async fn a_failed_fsync_stops_the_node_without_a_retry_and_a_restart_recovers_everything() {
    let temp = tempfile::tempdir().unwrap();
    let shim = match build_shim(temp.path()) {
        Ok(shim) => shim,
        Err(why) => {
            println!("skipped: cannot build the LD_PRELOAD shim ({why})");
            return;
        }
    };
    let data_dir = temp.path().join("data");
    let log = temp.path().join("failed-syncs.log");
    let (shim, log_path) = (shim.to_str().unwrap().to_owned(), log.to_str().unwrap().to_owned());
    let env = [
        ("LD_PRELOAD", shim.as_str()),
        ("PERMIT_FAIL_SYNC_AFTER", SYNCS_BEFORE_FAILING),
        ("PERMIT_FAIL_SYNC_LOG", log_path.as_str()),
    ];
    let mut server = Server::start_with_env(&data_dir, "127.0.0.1:0", &[], &env);

    let (status, seen, acked) = write_until_it_stops(&mut server, WORKERS, WRITE_TIMEOUT).await;
    let status = status.expect("the node exits after a failed fsync");
    assert!(!status.success(), "a failed node exits non-zero: {status}");
    let (body, retry_after) = seen.storage_error.expect("health answered 503 storage_error before the exit");
    let detail = body["detail"].as_str().unwrap();
    // `raft-log`: the segment log's directory.
    assert!(detail.contains("raft-log") && detail.contains("os error 5"), "{detail}");
    assert!(retry_after.is_some(), "503 carries Retry-After");
    // Never retried: exactly one sync failed (the node wrote nothing after it).
    let failed = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(failed.lines().count(), 1, "a failed fsync is never retried: {failed:?}");

    assert!(!acked.sessions.is_empty(), "some writes were acknowledged before the failure");
    drop(server);
    let restarted = Server::start_in(&data_dir, "127.0.0.1:0", &[]);
    assert_recovered(&restarted, &acked).await;
}
