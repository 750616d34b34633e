# Sourced by the e2e build scripts (build.sh, build_node.sh, build_netpol.sh, build_coredns.sh):
# where they cache what they build (outside the repo; LOOM_E2E_CACHE moves it), the Go flags they
# build with, and their progress lines on stderr, tagged with $BUILD_TAG. Builds nothing itself.

export GOFLAGS="${GOFLAGS:--p=2} -buildvcs=false"

cache_dir() {  # cache_dir NAME: makes and prints the cache folder NAME (with its bin/)
  local dir="${LOOM_E2E_CACHE:-$HOME/.cache/loom/e2e}/$1"
  mkdir -p "$dir/bin" && echo "$dir"
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
