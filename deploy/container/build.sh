#!/bin/sh
# Builds the Permit container image (deploy/container/Containerfile) from a permit binary,
# without pulling a base image: stages a root filesystem in a temporary build context (the
# binary, the shared libraries `ldd` lists with the dynamic loader, the passwd and group lines
# of the non-root user, the image's configuration, the machine's CA bundle) and runs
# `podman build` on it.
#
#   deploy/container/build.sh PERMIT_BINARY [TAG]      (TAG: localhost/permit:latest)
#
# podman uses the vfs storage driver (works where overlay mounts are not allowed); its storage
# is the usual one unless CONTAINERS_STORAGE_CONF names another.
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 PERMIT_BINARY [TAG]" >&2
  exit 64
fi
binary=$1
tag=${2:-localhost/permit:latest}
here=$(cd "$(dirname "$0")" && pwd)
# The non-root user of the image (uid = gid), the `nonroot` id of distroless images.
uid=65532

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT INT TERM
root=$context/rootfs
mkdir -p "$root/usr/bin" "$root/etc/permit" "$root/tmp" "$context/data"
chmod 1777 "$root/tmp"

install -m 0755 "$binary" "$root/usr/bin/permit"
# Every shared library the binary loads, and the loader, at the paths it looks for them.
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
if [ -z "$(ls -A "$root/lib64" "$root/lib" 2>/dev/null)" ] && ! ldd "$binary" 2>&1 | grep -q "statically linked"; then
  echo "$0: ldd listed no library for $binary" >&2
  exit 1
fi

printf 'root:x:0:0:root:/nonexistent:/nonexistent\npermit:x:%s:%s:Permit:/var/lib/permit:/nonexistent\n' "$uid" "$uid" >"$root/etc/passwd"
printf 'root:x:0:\npermit:x:%s:\n' "$uid" >"$root/etc/group"
install -m 0644 "$here/permit.toml" "$root/etc/permit/permit.toml"
# The CA bundle the client (`permit health`) and the peers' HTTPS without --peer-ca verify with:
# the client refuses to start without system roots.
bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -f "$bundle" ]; then
  echo "$0: $bundle is missing (Debian: apt-get install ca-certificates)" >&2
  exit 1
fi
install -D -m 0644 "$bundle" "$root$bundle"

cp "$here/Containerfile" "$context/Containerfile"
# The docker format keeps the HEALTHCHECK (the OCI format has no field for it).
podman --storage-driver vfs build --layers=false --format docker --tag "$tag" --file "$context/Containerfile" "$context"
