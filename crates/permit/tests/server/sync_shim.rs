//! An `LD_PRELOAD` shim over `fdatasync` and `fsync`, built here with `cc`, for a node that
//! must meet a failing or a stalled disk.
//!
//! - `PERMIT_FAIL_SYNC_AFTER=N`: every sync after the first N fails with `EIO`, each failure
//!   noted as a line in the file `PERMIT_FAIL_SYNC_LOG` (if set).
//! - `PERMIT_HOLD_SYNC_DIR=<dir>`: while the file `<dir>/hold` exists, every sync waits (for at
//!   most two minutes) before it runs, having created `<dir>/held`, so that a test knows a sync
//!   is waiting and decides when it ends.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::require::{or_skip, Need};

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

static void hold(void) {
    const char *dir = getenv("PERMIT_HOLD_SYNC_DIR");
    if (dir == NULL) return;
    char gate[PATH_MAX], held[PATH_MAX];
    snprintf(gate, sizeof gate, "%s/hold", dir);
    snprintf(held, sizeof held, "%s/held", dir);
    if (access(gate, F_OK) != 0) return;
    int fd = open(held, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    for (int waited_ms = 0; waited_ms < 120000 && access(gate, F_OK) == 0; waited_ms++) usleep(1000);
}

int fdatasync(int fd) {
    hold();
    if (failing()) { note("fdatasync failed"); errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

int fsync(int fd) {
    hold();
    if (failing()) { note("fsync failed"); errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"#;

/// Builds the shim into `dir` and returns its path; `None` (the test returns) where there is no
/// C compiler and `PERMIT_REQUIRE_CC` is not set. A compiler that rejects the shim is a failure.
pub fn build(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("sync_shim.c");
    let library = dir.join("sync_shim.so");
    std::fs::write(&source, SOURCE).expect("write the shim's source");
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cannot run cc: {e}"));
    let output = or_skip(Need::Cc, output)?;
    assert!(output.status.success(), "cc rejected the shim: {}", String::from_utf8_lossy(&output.stderr));
    Some(library)
}
