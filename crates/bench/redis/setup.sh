#!/bin/sh
# Installs Debian's redis-server and beanstalkd for the benchmark's durable peers (the `redis`
# and `queue` parts) when they are missing. The benchmark starts its own instances (loopback,
# temp dirs, Redis with appendfsync always, beanstalkd with -b DIR -f0) and never uses a system
# service; the packages' services are not needed.
set -eu
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v beanstalkd >/dev/null 2>&1 || missing="$missing beanstalkd"
if [ -n "$missing" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi
redis-server --version
beanstalkd -v
