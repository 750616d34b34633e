#!/usr/bin/env bash
# Builds the e2e cluster's real node from official Go modules into a cache outside the repo, keyed
# by version: the kubelet and kube-proxy (loom-node, same k8s.io/kubernetes module as loom-k8s),
# containerd 2.x with ctr and its runc shim, the CNI plugins, and a static pause program. runc is
# Debian's (installed when missing). A second run finds everything and returns at once. With
# --deps it builds all but loom-node, which compiles fastest after loom-k8s (the same packages).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=e2e/cluster/k8s_version.sh
. "$here/k8s_version.sh"
CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.9.1
key="$K8S_VERSION-$(cat "$here/go.mod" "$here/go.sum" "$here/cmd/node/main.go" "$here/pause/pause.c" "$here/build_node.sh" "$here/k8s_version.sh" | sha256sum | cut -c1-12)"
BUILD_TAG="e2e node build"
# shellcheck source=e2e/cluster/build_cache.sh
. "$here/build_cache.sh"
CACHE="$(cache_dir "node-$key")"
mkdir -p "$CACHE/cni"

if [ ! -x "$CACHE/bin/containerd-shim-runc-v2" ]; then
  mod="github.com/containerd/containerd/v2/cmd"
  timed "containerd $CONTAINERD_VERSION and ctr (~3 min)" env GOBIN="$CACHE/bin" go install -trimpath \
    -ldflags "-s -w" -tags "no_btrfs urfave_cli_no_docs" "$mod/containerd@$CONTAINERD_VERSION" "$mod/ctr@$CONTAINERD_VERSION"
  timed "the containerd runc shim" env GOBIN="$CACHE/bin" go install -trimpath -ldflags "-s -w" \
    -tags "no_btrfs urfave_cli_no_docs no_grpc" "$mod/containerd-shim-runc-v2@$CONTAINERD_VERSION"
fi
if [ ! -x "$CACHE/cni/firewall" ]; then
  mod="github.com/containernetworking/plugins/plugins"
  timed "CNI plugins $CNI_VERSION" env GOBIN="$CACHE/cni" go install -trimpath -ldflags "-s -w" \
    "$mod/main/bridge@$CNI_VERSION" "$mod/ipam/host-local@$CNI_VERSION" "$mod/main/loopback@$CNI_VERSION" \
    "$mod/meta/portmap@$CNI_VERSION" "$mod/meta/firewall@$CNI_VERSION"
fi
if [ ! -x "$CACHE/bin/pause" ]; then
  gcc -static -O2 -o "$CACHE/bin/pause.tmp" "$here/pause/pause.c"
  mv "$CACHE/bin/pause.tmp" "$CACHE/bin/pause"
fi
command -v runc >/dev/null 2>&1 || {
  log "installing Debian's runc"
  bash "$here/../../images/apt-install.sh" runc
}
# --deps: only what does not share loom-k8s's module (CI builds it beside loom-k8s, not after)
if [ "${1:-}" != "--deps" ] && [ ! -x "$CACHE/bin/loom-node" ]; then
  timed "kubelet and kube-proxy $K8S_VERSION (loom-node; ~5 min on 2 cores after loom-k8s)" \
    bash -c "cd '$here' && go build -trimpath -ldflags '$K8S_LDFLAGS' -o '$CACHE/bin/loom-node.tmp' ./cmd/node"
  mv "$CACHE/bin/loom-node.tmp" "$CACHE/bin/loom-node"
fi
prune_older 'node-*' "$CACHE"
echo "$CACHE"
