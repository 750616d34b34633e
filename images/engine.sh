#!/usr/bin/env bash
# Finds a container engine that answers, or installs and starts one: Debian's docker.io, with
# dockerd run by hand (these machines have no init system to start it). Prints the client to use.
set -euo pipefail
log() { printf '[make images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
answers() { "$1" info >/dev/null 2>&1; }
dockerd_path() { command -v dockerd || { [ -x /usr/sbin/dockerd ] && echo /usr/sbin/dockerd; }; }

if [ -n "${CONTAINER_ENGINE:-}" ]; then
  answers "$CONTAINER_ENGINE" || { log "CONTAINER_ENGINE=$CONTAINER_ENGINE does not answer"; exit 1; }
  echo "$CONTAINER_ENGINE"; exit 0
fi
# Debian's client first: it builds with BuildKit by itself (a newer client wants buildx for that).
for candidate in /usr/bin/docker docker podman; do
  if command -v "$candidate" >/dev/null 2>&1 && answers "$candidate"; then
    echo "$candidate"; exit 0
  fi
done
if [ -n "${LOOM_NO_ENGINE_START:-}" ] || { ! command -v apt-get >/dev/null 2>&1 && \
    [ -z "$(dockerd_path)" ]; }; then
  log "no Docker or Podman engine answers on this machine, and none can be installed or started"
  log "here: install Docker or Podman (CONTAINER_ENGINE=docker|podman to choose one)"
  exit 1
fi
if [ -z "$(dockerd_path)" ]; then
  log "installing Debian's docker.io (dockerd, containerd 1.6, runc)"
  "$BASH" "$(dirname "$0")/apt-install.sh" docker.io
fi
state="${LOOM_DOCKER_STATE:-$HOME/.cache/loom/docker}"
mkdir -p "$state"
# A dockerd that was killed leaves its pid file; dockerd refuses to start while that pid lives,
# and after a kill it may be another process (or a zombie): drop it unless a dockerd runs there.
if [ -f "$state/dockerd.pid" ]; then
  pid="$(cat "$state/dockerd.pid")"
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ] || \
     grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
    rm -f "$state/dockerd.pid"
  fi
fi
log "starting dockerd (log: $state/dockerd.log)"
setsid "$(dockerd_path)" --pidfile "$state/dockerd.pid" >>"$state/dockerd.log" 2>&1 < /dev/null &
client=/usr/bin/docker
[ -x "$client" ] || client=docker
for _ in $(seq 60); do
  answers "$client" && { echo "$client"; exit 0; }
  sleep 1
done
log "dockerd did not answer within 60 s; see $state/dockerd.log"
tail -n 20 "$state/dockerd.log" >&2
exit 1
