"""Weights on a PersistentVolumeClaim for the real node's pods: two tiny checkpoints (v1: seed 0,
v2: seed 1) in a host folder every user may read, and a hostPath PersistentVolume bound ahead to
one claim over it.

Owns that folder and those two objects' manifests; never applies them (the suite does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from e2e.providers import REPO
from loom_operator.testing.weights import Weights, two_versions
from loom_runtime.models.tiny import init_tiny

CLAIM = "tiny-weights"
"""The claim's name; the checkpoints are pvc://tiny-weights/v1 and pvc://tiny-weights/v2."""


@contextmanager
def claim_weights(
    model: str, prompts: Sequence[str], max_tokens: int, refs: Path
) -> Iterator[Weights]:
    """v1 and v2 under one folder (its path is `Weights.paths[0].parent`) that the pods' user
    (65532) may read — pytest's temporary folders are root's alone —, with each version's greedy
    references from a plain fp64 worker on the host (its card and log under `refs`); the folder
    is removed afterwards."""
    cache = REPO / ".cache" / "e2e"
    cache.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pvc-weights-", dir=cache))
    try:
        paths = (init_tiny(root / "v1", seed=0), init_tiny(root / "v2", seed=1))
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        yield two_versions(paths, model, prompts, max_tokens, refs, dict(os.environ))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def volume_name(namespace: str) -> str:
    return f"{CLAIM}-{namespace}"


def claim_manifests(folder: Path, namespace: str) -> str:
    """A PersistentVolume on `folder` bound ahead to claim CLAIM of `namespace` (no storage class:
    nothing provisions), and that claim; ReadOnlyMany, as the operator mounts it read-only."""
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume_name(namespace)},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                 "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(folder), "type": "Directory"},
                 "claimRef": {"namespace": namespace, "name": CLAIM}},
    }  # fmt: skip
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": namespace},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "volumeName": volume_name(namespace),
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    return yaml.safe_dump_all([pv, pvc])
