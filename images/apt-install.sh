#!/usr/bin/env bash
# Installs Debian packages on this machine, one apt at a time: `make`'s preparations run side by
# side (CI: make -j4), and a second apt-get refuses at once instead of waiting for the first.
set -euo pipefail
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
# shellcheck disable=SC2016
exec $sudo flock /tmp/loom-apt.lock bash -c '
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -o DPkg::Lock::Timeout=300 "$@" >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y -o DPkg::Lock::Timeout=300 "$@" >/dev/null; }
' _ "$@"
