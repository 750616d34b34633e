#!/usr/bin/env bash
# Builds the e2e node's cluster DNS, CoreDNS, from its Go module (`go install
# github.com/coredns/coredns@VERSION`, every in-tree plugin: the node uses kubernetes, template,
# ready and errors) into a cache outside the repo keyed by its version. A second run finds it and
# returns at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
COREDNS_VERSION=v1.15.0  # needs Go 1.26.0 or newer
BUILD_TAG="e2e coredns build"
# shellcheck source=e2e/cluster/build_cache.sh
. "$here/build_cache.sh"
CACHE="$(cache_dir "coredns-$COREDNS_VERSION")"

if [ ! -x "$CACHE/bin/coredns" ]; then
  rm -rf "$CACHE/tmp"; mkdir -p "$CACHE/tmp"
  timed "CoreDNS $COREDNS_VERSION (~8 min on 2 cores, once)" env GOBIN="$CACHE/tmp" \
    go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  mv "$CACHE/tmp/coredns" "$CACHE/bin/coredns"
  rm -rf "$CACHE/tmp"
fi
prune_older 'coredns-*' "$CACHE"
echo "$CACHE"
