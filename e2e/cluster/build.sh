#!/usr/bin/env bash
# Builds Loom's e2e control plane (loom-k8s) and kwok from the official Go modules into a cache
# outside the repo, keyed by version; a second run finds them and returns at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/cluster/k8s_version.sh
. "$here/k8s_version.sh"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
key="$K8S_VERSION-$(cat "$here/go.mod" "$here/go.sum" "$here/cmd/main.go" | sha256sum | cut -c1-12)"
CACHE="${LOOM_E2E_CACHE:-$HOME/.cache/loom/e2e}/$key"
mkdir -p "$CACHE/bin"
export GOFLAGS="${GOFLAGS:--p=2} -buildvcs=false"

log() { printf '[e2e build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ ! -x "$CACHE/bin/loom-k8s" ]; then
  start=$(date +%s)
  log "building kube-apiserver, controller-manager, scheduler and etcd $K8S_VERSION (first build on a machine: ~12 min on 2 cores)"
  (cd "$here" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$CACHE/bin/loom-k8s.tmp" ./cmd) &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && log "still building loom-k8s ($(( $(date +%s) - start )) s)"
  done
  wait "$pid"
  mv "$CACHE/bin/loom-k8s.tmp" "$CACHE/bin/loom-k8s"
  log "built loom-k8s in $(( $(date +%s) - start )) s"
else
  log "loom-k8s $K8S_VERSION cached in $CACHE/bin"
fi

if [ ! -x "$CACHE/bin/kwok" ]; then
  start=$(date +%s)
  log "building kwok $KWOK_VERSION (~2.5 min)"
  GOBIN="$CACHE/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  log "built kwok in $(( $(date +%s) - start )) s"
fi

# kwok needs its stage definitions, which ship in its module.
if [ ! -d "$CACHE/kwok-stages" ]; then
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$CACHE/kwok-stages.tmp"
  for stage in node-initialize node-heartbeat-with-lease pod-create pod-init-container-running \
      pod-init-container-completed pod-ready pod-complete pod-delete; do
    cp "$(find "$dir/kustomize/stage" -name "$stage.yaml" | head -n1)" "$CACHE/kwok-stages.tmp/"
  done
  mv "$CACHE/kwok-stages.tmp" "$CACHE/kwok-stages"
fi
echo "$CACHE"
