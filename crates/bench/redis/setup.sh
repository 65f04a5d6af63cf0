#!/bin/sh
# Installs Debian's redis-server for the benchmark's `redis` part (the durable peer row) when it
# is missing. The benchmark starts its own instance (loopback, temp dir, appendfsync always) and
# never uses a system service; the package's service is not needed.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    redis-server --version
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server
redis-server --version
