#!/usr/bin/env bash
# make images: Loom's images, tagged as the chart's defaults, built from a Debian root filesystem
# (images/base) and PyPI. IMAGES="operator runtime-cpu" (default) or add runtime-cuda (vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[make images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
ENGINE="$("$BASH" images/engine.sh)"
export ENGINE
BASE="$("$BASH" images/base/rootfs.sh)"
REGISTRY="${REGISTRY:-ghcr.io/loom-serving}"
TAG="${TAG:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/loom/Chart.yaml)}"
# PyPI is reached through this machine's trust store (a TLS-inspecting proxy here): the build sees
# the bundle as a BuildKit secret, so it never enters a layer of an image.
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
[ -r "$CA_BUNDLE" ] || { log "no CA bundle at $CA_BUNDLE (set CA_BUNDLE)"; exit 1; }

build() {  # build DIR NAME
  local start; start=$(date +%s)
  log "building $REGISTRY/$2 (images/$1/Dockerfile, FROM $BASE)"
  DOCKER_BUILDKIT=1 "$ENGINE" build --progress=plain --secret "id=ca-bundle,src=$CA_BUNDLE" \
    --build-arg "BASE=$BASE" -f "images/$1/Dockerfile" -t "$REGISTRY/$2" . \
    > ".cache/images/$1.log" 2>&1 || { tail -n 30 ".cache/images/$1.log" >&2; log "see .cache/images/$1.log"; exit 1; }
  local bytes; bytes=$("$ENGINE" image inspect -f '{{.Size}}' "$REGISTRY/$2")
  log "built $REGISTRY/$2 in $(( $(date +%s) - start )) s: $(( bytes / 1000000 )) MB"
}
mkdir -p .cache/images
trap prune EXIT
prune() {  # a rebuild leaves the previous image's layers behind: keep the disk bounded
  "$ENGINE" image prune -f >/dev/null 2>&1 || true
  "$ENGINE" builder prune -f --keep-storage "${BUILD_CACHE_KEEP:-6GB}" >/dev/null 2>&1 || true
}
for image in ${IMAGES:-operator runtime-cpu}; do
  case "$image" in
    operator) build operator "loom-operator:$TAG" ;;
    runtime-cpu) build runtime-cpu "loom-runtime:$TAG" ;;
    runtime-cuda) build runtime-cuda "loom-runtime:$TAG-cuda" ;;
    *) log "unknown image $image: operator, runtime-cpu or runtime-cuda"; exit 1 ;;
  esac
done
