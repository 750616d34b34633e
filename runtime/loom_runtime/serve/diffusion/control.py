"""The diffusion engine as the control service sees it: the worker status numbers, drain, and a
whole-checkpoint LoadWeights turned into the component syncs it implies.

Owns the mapping of a checkpoint version onto component versions (a component whose files did
not change keeps its version, so the text-feature cache keyed by the encoder's version survives
a DiT-only sync); never swaps weights itself (DiffusionEngine.load_component does).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Literal

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import COMPONENTS, ComponentName
from loom_runtime.engine.types import EngineStats
from loom_runtime.errors import CheckpointError

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".json")  # what a component folder's outputs depend on
_CHUNK = 1 << 20


def component_digest(folder: Path) -> str:
    """sha256 over a component folder's config and weight files (names and bytes, in name
    order): equal digests mean the component computes the same thing."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise CheckpointError(f"{folder}: no config or safetensors files")
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def checkpoint_digests(root: Path) -> dict[ComponentName, str]:
    """The digest of each component folder of a diffusers-format Wan checkpoint."""
    missing = [name for name in COMPONENTS if not (root / name).is_dir()]
    if missing:
        raise CheckpointError(f"{root}: not a Wan checkpoint (no {', '.join(missing)} folder)")
    return {name: component_digest(root / name) for name in COMPONENTS}


def changed_components(
    old: dict[ComponentName, str], new: dict[ComponentName, str]
) -> list[ComponentName]:
    """The components whose digest differs, in checkpoint order (pure)."""
    return [name for name in COMPONENTS if old.get(name) != new[name]]


class DiffusionControl:
    """What the control service drives (its ControlledEngine) over one DiffusionEngine.

    The worker's weights version is the checkpoint's: the version of the last LoadWeights (or
    the one it started with). The status's KV figures stand for the diffusion memory budget:
    `kv_usage` is the reserved fraction of it; a diffusion worker has no KV blocks."""

    def __init__(self, engine: DiffusionEngine, checkpoint: Path, version: str) -> None:
        self.engine = engine
        self._digests = checkpoint_digests(checkpoint)
        self._version = version
        self._lock = threading.Lock()  # one LoadWeights at a time; guards the two fields above

    @property
    def weights_version(self) -> str:
        with self._lock:
            return self._version

    def stats(self) -> EngineStats:
        s = self.engine.stats()
        usage = s.memory_reserved_bytes / s.memory_budget_bytes if s.memory_budget_bytes else 0.0
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_usage=min(1.0, usage),
            num_blocks=0,
            num_free_blocks=0,
            block_size=0,
            admission_open=s.admission_open,
            weights_version=self.weights_version,
            num_requests_finished=s.requests_finished,
            num_requests_aborted=s.requests_aborted,
        )

    def in_flight(self) -> int:
        return self.engine.in_flight()

    def pause(self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None) -> bool:
        return self.engine.pause(mode, timeout)

    def resume(self) -> None:
        self.engine.resume()

    def load_weights(self, path: str, version: str) -> None:
        """Load checkpoint `path` as `version`: each component whose files changed is swapped
        and takes `version`; the others keep theirs (and what is cached under them)."""
        root = Path(path)
        with self._lock:
            digests = checkpoint_digests(root)
            changed = changed_components(self._digests, digests)
            for name in changed:
                self.engine.load_component(name, root / name, version)
                self._digests[name] = digests[name]
            self._version = version
        logger.info(
            "checkpoint loaded",
            extra={"version": version, "components": ",".join(changed) or "none changed"},
        )
