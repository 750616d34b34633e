#!/usr/bin/env bash
# Builds Loom's e2e control plane (loom-k8s) and kwok from the official Go modules into a cache
# outside the repo, keyed by version; a second run finds them and returns at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/cluster/k8s_version.sh
. "$here/k8s_version.sh"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
key="$K8S_VERSION-$(cat "$here/go.mod" "$here/go.sum" "$here/cmd/main.go" | sha256sum | cut -c1-12)"
BUILD_TAG="e2e build"
# shellcheck source=e2e/cluster/build_cache.sh
. "$here/build_cache.sh"
CACHE="$(cache_dir "$key")"

if [ ! -x "$CACHE/bin/loom-k8s" ]; then
  timed "kube-apiserver, controller-manager, scheduler and etcd $K8S_VERSION (loom-k8s; first build on a machine: ~12 min on 2 cores)" \
    bash -c "cd '$here' && go build -trimpath -ldflags '$K8S_LDFLAGS' -o '$CACHE/bin/loom-k8s.tmp' ./cmd"
  mv "$CACHE/bin/loom-k8s.tmp" "$CACHE/bin/loom-k8s"
else
  log "loom-k8s $K8S_VERSION cached in $CACHE/bin"
fi

if [ ! -x "$CACHE/bin/kwok" ]; then
  timed "kwok $KWOK_VERSION (~2.5 min)" env GOBIN="$CACHE/bin" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
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
prune_older 'v[0-9]*' "$CACHE"
echo "$CACHE"
