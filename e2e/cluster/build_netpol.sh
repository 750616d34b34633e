#!/usr/bin/env bash
# Builds the e2e node's NetworkPolicy enforcement, loom-netpol (e2e/cluster/netpol: the controller
# of sigs.k8s.io/kube-network-policies, nftables + NFQUEUE, as a host process), into a cache
# outside the repo keyed by its version and sources. A second run finds it and returns at once.
# These machines' kernels lack nftables' queue expression (CONFIG_NFT_QUEUE), so the build uses
# a copy of github.com/google/nftables whose expr/queue.go is netpol/_nftables/expr/queue.go: the
# same queue, sent as the xtables NFQUEUE target through nft_compat (see that file).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/netpol"
NETPOL_VERSION="$(awk '$1 == "sigs.k8s.io/kube-network-policies" {print $2; exit}' "$src/go.mod")"
NFTABLES_VERSION=v0.3.0  # the release _nftables/expr/queue.go was written against
key="$NETPOL_VERSION-$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" "$src/_nftables/expr/queue.go" "$here/build_netpol.sh" | sha256sum | cut -c1-12)"
BUILD_TAG="e2e netpol build"
# shellcheck source=e2e/cluster/build_cache.sh
. "$here/build_cache.sh"
CACHE="$(cache_dir "netpol-$key")"

if [ ! -x "$CACHE/bin/loom-netpol" ]; then
  build="$CACHE/src"  # the module, with google/nftables's copy beside it
  rm -rf "$build"; mkdir -p "$build"
  cp "$src/go.mod" "$src/go.sum" "$src/main.go" "$build/"
  (cd "$build" && go mod download github.com/google/nftables)
  nftables="$(cd "$build" && go list -m -f '{{.Version}} {{.Dir}}' github.com/google/nftables)"
  [ "${nftables%% *}" = "$NFTABLES_VERSION" ] || {
    log "go.mod needs github.com/google/nftables ${nftables%% *}, _nftables/expr/queue.go is $NFTABLES_VERSION's: port it"
    exit 1
  }
  cp -r "${nftables#* }" "$build/nftables"; chmod -R u+w "$build/nftables"
  cp "$src/_nftables/expr/queue.go" "$build/nftables/expr/queue.go"
  (cd "$build" && go mod edit -replace github.com/google/nftables=./nftables)
  timed "loom-netpol (kube-network-policies $NETPOL_VERSION; ~5 min on 2 cores, once)" \
    bash -c "cd '$build' && go build -trimpath -ldflags '-s -w' -o '$CACHE/bin/loom-netpol.tmp' ."
  mv "$CACHE/bin/loom-netpol.tmp" "$CACHE/bin/loom-netpol"
fi
command -v nft >/dev/null 2>&1 || {  # down lists and deletes the controller's table with it
  log "installing Debian's nftables"
  bash "$here/../../images/apt-install.sh" nftables
}
prune_older 'netpol-*' "$CACHE"
echo "$CACHE"
