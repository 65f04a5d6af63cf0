#!/usr/bin/env bash
# Builds the `permit` binary that the rolling-upgrade scenario (F11) starts from: the commit
# before versioned clusters, taken from this repository's git history. Prints its path.
#
#   crates/permit/tests/faults/upgrade-from.sh
#
# The binary lands in target/upgrade-from/permit and is reused while its commit stays the same.
# The build's own target dir is $CARGO_TARGET_DIR when set (CI points it at the workspace's
# target dir before the test build, so that the dependencies compiled here serve that build
# too), else target/upgrade-from/target.
set -euo pipefail

# The last commit before versioned clusters (issue 31).
UPGRADE_FROM=d9fc6e47880945c55786de7e5d38df4c0cbc9cfc

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$repo/target/upgrade-from
bin=$out/permit
if [[ -x $bin && $(cat "$out/commit" 2>/dev/null) == "$UPGRADE_FROM" ]]; then
  echo "$bin"
  exit 0
fi
if ! git -C "$repo" cat-file -e "$UPGRADE_FROM^{commit}" 2>/dev/null; then
  echo "upgrade-from.sh: commit $UPGRADE_FROM is not in this clone (a shallow clone?); fetch the history" >&2
  exit 2
fi
rm -rf "$out/src"
mkdir -p "$out/src"
git -C "$repo" archive "$UPGRADE_FROM" | tar -x -C "$out/src"
target=${CARGO_TARGET_DIR:-$out/target}
# The outer cargo's variables (a test run's) must not steer this build.
env -u CARGO_MANIFEST_DIR -u CARGO_PKG_NAME -u CARGO_PRIMARY_PACKAGE -u RUSTC_WRAPPER \
  CARGO_TARGET_DIR="$target" CARGO_INCREMENTAL=0 \
  cargo build --locked --quiet --manifest-path "$out/src/Cargo.toml" -p permit --bin permit >&2
cp "$target/debug/permit" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$UPGRADE_FROM" > "$out/commit"
rm -rf "$out/src"
echo "$bin"
