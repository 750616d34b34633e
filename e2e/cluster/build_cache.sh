# Sourced by the e2e build scripts (build.sh, build_node.sh, build_netpol.sh, build_coredns.sh):
# where they cache what they build (outside the repo; LOOM_E2E_CACHE moves it), the Go flags they
# build with, and their progress lines on stderr, tagged with $BUILD_TAG. Builds nothing itself.

export GOFLAGS="${GOFLAGS:--p=2} -buildvcs=false"

E2E_CACHE="${LOOM_E2E_CACHE:-$HOME/.cache/loom/e2e}"

cache_dir() {  # cache_dir NAME: makes and prints the cache folder NAME (with its bin/), marked used
  local dir="$E2E_CACHE/$1"
  mkdir -p "$dir/bin" && touch "$dir" && echo "$dir"
}

prune_older() {  # prune_older GLOB CURRENT: of the other builds named GLOB (older keys), keeps the
  # last used (switching between two checkouts rebuilds nothing) and removes the rest, unless a
  # process runs from one. Bounds the cache: each key is a few hundred MB.
  local old
  # shellcheck disable=SC2086  # GLOB is a pattern
  for old in $(ls -dt "$E2E_CACHE"/$1 2>/dev/null | grep -vxF "$2" | tail -n +2); do
    if pgrep -f "$old/" >/dev/null; then continue; fi
    log "removing an older build no longer used: $old"
    rm -rf "$old"
  done
}

log() { printf '[%s %s] %s\n' "$BUILD_TAG" "$(date +%H:%M:%S)" "$*" >&2; }

timed() {  # timed WHAT COMMAND...: runs it, printing progress every 30 s and its wall time
  local what="$1" start pid; shift; start=$(date +%s)
  log "building $what"
  "$@" & pid=$!
  while ! timeout 30 tail --pid="$pid" -f /dev/null; do
    log "still building $what ($(( $(date +%s) - start )) s)"
  done
  wait "$pid"; log "built $what in $(( $(date +%s) - start )) s"
}
