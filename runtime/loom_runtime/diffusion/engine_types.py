"""The diffusion engine's settings and the snapshots it hands out: progress and stats.

Owns the records only (frozen, plain values); never holds tensors or runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from loom_runtime.diffusion.step_cost import KindCost

ComponentName = Literal["transformer", "text_encoder", "vae"]
COMPONENTS: tuple[ComponentName, ...] = ("transformer", "text_encoder", "vae")
Status = Literal["queued", "in_progress"]


@dataclass(frozen=True)
class ComponentVersions:
    """The weights version of each component a Wan checkpoint is made of."""

    transformer: str = "v1"
    text_encoder: str = "v1"
    vae: str = "v1"

    def get(self, name: ComponentName) -> str:
        return str(getattr(self, name))


@dataclass(frozen=True)
class DiffusionEngineConfig:
    """How one diffusion engine runs; defaults documented next to each field."""

    model_name: str = "wan"
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    text_len: int = 512  # prompt tokens the encoder pads (and the server truncates) to
    default_steps: int = 50  # the card loop's steps: a request that names none runs these
    pinned_steps: int | None = None  # a distilled recipe's steps: the only count accepted
    max_running: int = 8  # requests whose plans share a step
    max_waiting: int = 64  # accepted requests not yet running (beyond: 503)
    memory_budget_bytes: int = 8 << 30  # what running requests' peaks may add up to
    text_cache_entries: int = 256  # encoded prompt rows kept (0: no cache)
    versions: ComponentVersions = field(default_factory=ComponentVersions)
    idle_wait_s: float = 0.5  # how long the idle step thread sleeps between checks
    # A step's predicted compute, seconds (the step cost model's): a queued request joins the
    # running ones only while their predicted denoise step stays within it (one always runs).
    # None: max_running alone limits a step.
    step_budget_s: float | None = 5.0

    def __post_init__(self) -> None:
        for name in ("text_len", "default_steps", "max_running", "memory_budget_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"DiffusionEngineConfig.{name} must be >= 1")
        if self.max_waiting < 0 or self.text_cache_entries < 0:
            raise ValueError("max_waiting and text_cache_entries must be >= 0")
        if self.step_budget_s is not None and not self.step_budget_s > 0:
            raise ValueError(
                f"DiffusionEngineConfig.step_budget_s must be > 0 or None: {self.step_budget_s}"
            )


@dataclass(frozen=True)
class DiffusionProgress:
    """Where one request is: queued (no memory held yet) or in progress, in denoise steps."""

    request_id: str
    status: Status
    steps_done: int
    steps_total: int
    reserved_bytes: int


@dataclass(frozen=True)
class DiffusionStats:
    """One snapshot of the engine, for /metrics and tests."""

    num_running: int
    num_waiting: int
    memory_reserved_bytes: int
    memory_budget_bytes: int
    denoise_steps: int  # denoise plans executed (one per request per step)
    engine_steps: int  # batched steps executed
    requests_finished: int
    requests_aborted: int
    text_cache_hits: int
    text_cache_misses: int
    text_cache_entries: int
    admission_open: bool
    versions: ComponentVersions
    step_costs: tuple[KindCost, ...] = ()  # the step cost model's fit of each measured kind
    predicted_step_s: float = 0.0  # the running requests' predicted denoise step, seconds
