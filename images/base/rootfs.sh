#!/usr/bin/env bash
# The base of Loom's images without Docker Hub: a Debian bookworm root filesystem made by
# debootstrap from Debian's own packages (Python 3.11 and venv), imported as one image layer.
# Prints the image's name; a second run finds it and returns at once (~4 min the first time).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ENGINE="${ENGINE:-docker}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3,python3-venv
key="$(cat "$here/rootfs.sh" | sha256sum | cut -c1-12)"
IMAGE="loom-base:$SUITE-$key"
log() { printf '[make images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1; then
  log "base $IMAGE cached"
  echo "$IMAGE"; exit 0
fi
command -v debootstrap >/dev/null 2>&1 || {
  log "installing Debian's debootstrap"
  "$BASH" "$here/../apt-install.sh" debootstrap
}
work="$(mktemp -d "${TMPDIR:-/tmp}/loom-rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
log "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR (~4 min the first time)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" "$MIRROR" \
  > "$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
# An image carries no package lists, caches or logs of its making.
rm -rf "$work/root"/var/lib/apt/lists/* "$work/root"/var/cache/apt/*.bin \
       "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/log/*.log
tar -C "$work/root" --numeric-owner -c . | "$ENGINE" import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
log "base $IMAGE imported in $(( $(date +%s) - start )) s"
# Older bases (another version of this script) are not used again.
"$ENGINE" images --format '{{.Repository}}:{{.Tag}}' loom-base | grep -vxF "$IMAGE" \
  | xargs -r "$ENGINE" rmi >/dev/null 2>&1 || true
echo "$IMAGE"
