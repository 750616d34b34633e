# Progress lines for the e2e build scripts, sourced after setting LOG_TAG: `log MESSAGE` and
# `timed WHAT COMMAND...`, which runs COMMAND, printing a line every 30 s and then its wall time.
# shellcheck shell=bash
log() { printf '[e2e %s build %s] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" "$*" >&2; }
timed() {
  local what="$1" start pid; shift; start=$(date +%s)
  log "building $what"
  "$@" & pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30; kill -0 "$pid" 2>/dev/null && log "still building $what ($(( $(date +%s) - start )) s)"
  done
  wait "$pid"; log "built $what in $(( $(date +%s) - start )) s"
}
