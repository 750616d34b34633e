#!/usr/bin/env bash
# make images: build Loom's three images with Docker or Podman, tagged as the chart's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE="${CONTAINER_ENGINE:-}"
if [ -z "$ENGINE" ]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" info >/dev/null 2>&1; then
      ENGINE="$candidate"; break
    fi
  done
fi
if [ -z "$ENGINE" ]; then
  echo "make images: no Docker or Podman engine answers on this machine, so no image was built." >&2
  echo "The Dockerfiles are images/{operator,runtime-cpu,runtime-cuda}/Dockerfile; build them" >&2
  echo "where an engine runs (CONTAINER_ENGINE=docker|podman to choose one)." >&2
  exit 1
fi
REGISTRY="${REGISTRY:-ghcr.io/loom-serving}"
TAG="${TAG:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/loom/Chart.yaml)}"
build() {  # build DIR NAME
  echo "building $REGISTRY/$2 (images/$1) with $ENGINE"
  "$ENGINE" build -f "images/$1/Dockerfile" -t "$REGISTRY/$2" .
}
build operator "loom-operator:$TAG"
build runtime-cpu "loom-runtime:$TAG"
build runtime-cuda "loom-runtime:$TAG-cuda"
