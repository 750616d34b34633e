"""Loom's own CPU kernels: C++ compiled once per machine and loaded as torch ops.

Owns building, caching and loading them and the Python signatures of the ops; never decides
when a model uses one (the model code does, and keeps a torch path for every op).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import torch

from loom_runtime.kernels.build import BUILD_TIMEOUT_S, library_path

log = logging.getLogger(__name__)

DISABLE_ENV = "LOOM_CPU_KERNELS"  # "0": never build or load them; every op takes its torch path


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernels are loaded in this process, and if not, why."""

    loaded: bool
    reason: str


_lock = threading.Lock()
_status: KernelStatus | None = None


def status() -> KernelStatus:
    """Load the kernels on first call (building them first when this machine has no build yet);
    later calls return the first answer. Never raises: a failed build is a reason."""
    global _status
    if _status is not None:
        return _status
    with _lock:
        if _status is None:
            _status = _load()
            if not _status.loaded:
                log.warning("Loom's CPU kernels are off (%s); using the torch path", _status.reason)
        return _status


def status_so_far() -> KernelStatus | None:
    """The first `status()` call's answer, or None before any (never loads or builds)."""
    return _status


def available() -> bool:
    return status().loaded


def paged_decode(
    q: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    blocks: torch.Tensor,
    starts: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention over the paged pool, read in place (paged_decode.cpp): q [B, heads, D]
    contiguous, pool [num_blocks, layers, 2, block_size, kv_heads, D] (kv/cache.py), blocks [N]
    every sequence's blocks one after another, starts [B + 1] where each sequence's begin,
    context_lens [B] -> [B, heads, D]. Loads the kernels on first use; raises when they are off."""
    if not available():
        raise RuntimeError(f"Loom's CPU kernels are not loaded: {status().reason}")
    out: torch.Tensor = torch.ops.loom.paged_decode(
        q, pool, layer, blocks, starts, context_lens, scale
    )
    return out


def _load() -> KernelStatus:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return KernelStatus(False, f"{DISABLE_ENV}=0")
    path = library_path()
    if not path.exists():
        log.info("compiling Loom's CPU kernels once for this machine into %s (~15 s)", path.parent)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "loom_runtime.kernels"],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return KernelStatus(False, f"the build ran past {BUILD_TIMEOUT_S} s")
        if done.returncode != 0 or not path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return KernelStatus(False, "the build failed: " + " | ".join(tail))
    try:
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]  # torch leaves it untyped
    except OSError as e:
        return KernelStatus(False, f"{path} does not load: {e}")
    return KernelStatus(True, f"loaded from {path}")
