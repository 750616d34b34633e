#!/usr/bin/env bash
# Builds the e2e node's cluster DNS, CoreDNS, from its Go module with only the plugins the node's
# Corefile uses (e2e/cluster/coredns: kubernetes, template, ready, errors, bind; ~3 min on 2 cores once,
# where `go install github.com/coredns/coredns` with every in-tree plugin took ~8) into a cache
# outside the repo keyed by its version and sources. A second run finds it and returns at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/coredns"
COREDNS_VERSION="$(cd "$src" && go list -m -f "{{.Version}}" github.com/coredns/coredns)"
key="$COREDNS_VERSION-$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)"
BUILD_TAG="e2e coredns build"
# shellcheck source=e2e/cluster/build_cache.sh
. "$here/build_cache.sh"
CACHE="$(cache_dir "coredns-$key")"

if [ ! -x "$CACHE/bin/coredns" ]; then
  timed "CoreDNS $COREDNS_VERSION (its kubernetes, template, ready, errors and bind plugins; ~3 min on 2 cores, once)" \
    bash -c "cd '$src' && go build -trimpath -ldflags '-s -w' -o '$CACHE/bin/coredns.tmp' ."
  mv "$CACHE/bin/coredns.tmp" "$CACHE/bin/coredns"
fi
prune_older 'coredns-*' "$CACHE"
echo "$CACHE"
