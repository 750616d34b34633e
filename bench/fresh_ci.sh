#!/usr/bin/env bash
# A fresh-machine .ci/run on this machine, timed (log: $FRESH_DIR/ci.log, default /tmp/fresh).
# DESTRUCTIVE to this machine's caches: a clean clone of this checkout, every cache Loom's build
# fills emptied (pip, Go, e2e builds and containerd's image store, vLLM's venv, kernels, models), Loom's
# Docker images and Docker's build cache removed and dockerd stopped (images/engine.sh starts it).
# Left installed: Debian's docker.io, runc, nftables, prometheus (apt, ~1-2 min on a fresh machine).
set -uo pipefail
out="${FRESH_DIR:-/tmp/fresh}"; src="$(cd "$(dirname "$0")/.." && pwd)"
if pgrep -f "loom-node|loom-k8s" >/dev/null; then echo "an e2e cluster runs: stop it first"; exit 1; fi
# dockerd must answer for its images and build cache to go (it may not run after a restart).
bash "$src/images/engine.sh" >/dev/null || exit 1
docker rmi -f ghcr.io/loom-serving/loom-runtime:0.1.0 ghcr.io/loom-serving/loom-operator:0.1.0 \
  $(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^loom-base:|^loom.dev/e2e/pause') >/dev/null
docker builder prune -af >/dev/null
pid="$(cat ~/.cache/loom/docker/dockerd.pid 2>/dev/null || true)"
if [ -n "$pid" ]; then kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 1; done; fi
rm -rf ~/.cache/loom ~/.cache/go-build ~/go ~/.cache/pip "$out/loom"
df -h / | tail -1
git clone -q "$src" "$out/loom" && cd "$out/loom" && git log --oneline -1
start=$(date +%s); echo "start $(date +%T)"
/usr/bin/time -v bash .ci/run > "$out/ci.log" 2>&1
rc=$?
echo "rc=$rc end $(date +%T) wall $(( $(date +%s) - start )) s"
