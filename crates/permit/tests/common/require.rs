//! Suites that need something from the machine (a tool, a privilege), and what happens where it
//! is missing.
//!
//! Each such need has a switch, `PERMIT_REQUIRE_<NAME>=1`, that CI sets: with it a missing need
//! fails the test with what to install; without it the test prints why it did not run, and
//! passes. A test that needs one calls [`or_skip`] before doing anything else.
#![allow(dead_code)] // Each test binary has a need or two of the list.

/// Something a suite needs from the machine.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// python3 with the venv module, and pip access to PyPI (the Python client's suite).
    Python,
    /// Go ≥ 1.19 with its race detector (the Go client's suite; standard library only, so no
    /// module download).
    Go,
    /// Chromium and ChromeDriver (the dashboard's browser test).
    Browser,
    /// libfaketime (the fault suite's clock scenarios).
    Faketime,
    /// Root, to mount a small tmpfs (the full-disk test).
    Tmpfs,
    /// A C compiler, to build the `LD_PRELOAD` shim that fails or holds fsyncs.
    Cc,
    /// podman, and root (the container image's test builds it, then runs its filesystem in a
    /// chroot).
    Podman,
    /// The build a rolling upgrade starts from (the fault suite's F11): git history and an
    /// offline cargo to build it, or `PERMIT_UPGRADE_FROM_BIN`.
    UpgradeFrom,
}

impl Need {
    /// The environment variable that makes this need a requirement.
    pub fn switch(self) -> &'static str {
        match self {
            Need::Python => "PERMIT_REQUIRE_PYTHON",
            Need::Go => "PERMIT_REQUIRE_GO",
            Need::Browser => "PERMIT_REQUIRE_BROWSER",
            Need::Faketime => "PERMIT_REQUIRE_FAKETIME",
            Need::Tmpfs => "PERMIT_REQUIRE_TMPFS",
            Need::Cc => "PERMIT_REQUIRE_CC",
            Need::Podman => "PERMIT_REQUIRE_PODMAN",
            Need::UpgradeFrom => "PERMIT_REQUIRE_UPGRADE_FROM",
        }
    }

    /// What to install (or be) for it.
    pub fn remedy(self) -> &'static str {
        match self {
            Need::Python => "install python3 and its venv module (Debian: apt-get install python3-venv openssl), with access to PyPI",
            Need::Go => "install Go 1.19 or newer as `go`, and a C compiler for its race detector (Debian: apt-get install golang-go gcc)",
            Need::Browser => "install Chromium and ChromeDriver (Debian: apt-get install chromium chromium-driver)",
            Need::Faketime => {
                "install libfaketime (Debian: apt-get install faketime), or point PERMIT_LIBFAKETIME at libfaketime.so.1"
            }
            Need::Tmpfs => "run the tests as root (the test mounts a small tmpfs)",
            Need::Cc => "install a C compiler as `cc` (Debian: apt-get install gcc)",
            Need::Podman => "install podman (Debian: apt-get install podman) and run the tests as root",
            Need::UpgradeFrom => {
                "run from a clone with its git history (crates/permit/tests/faults/upgrade-from.sh builds the older build), or point PERMIT_UPGRADE_FROM_BIN at it"
            }
        }
    }

    /// Whether the switch is on (`=1`).
    pub fn required(self) -> bool {
        std::env::var(self.switch()).as_deref() == Ok("1")
    }
}

/// `Some(value)` where `available` is `Ok`. Otherwise a failure when `need` is required, or a
/// message that the test is skipped, and `None`, upon which the test returns.
#[track_caller]
pub fn or_skip<T>(need: Need, available: Result<T, String>) -> Option<T> {
    match available {
        Ok(value) => Some(value),
        Err(why) => {
            let remedy = need.remedy();
            assert!(!need.required(), "{}=1 but this test cannot run: {why}; {remedy}", need.switch());
            eprintln!(
                "SKIPPED: this test cannot run: {why}; {remedy} ({}=1 makes this a failure)",
                need.switch()
            );
            None
        }
    }
}
