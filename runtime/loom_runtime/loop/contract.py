"""The loop contract: a request is a driven loop, init -> (next -> execute -> advance)* -> finalize.

Owns the records a loop hands the runtime (WorkPlan, ResourceRequest, Done) and the Executor
Protocol; never runs a kernel and never holds per-request state: that lives in each loop's state
object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

ResultT_co = TypeVar("ResultT_co", covariant=True)
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class ResourceRequest:
    """What running a plan costs, so a scheduler can decide when and with whom it runs.

    All counts are for running the whole plan; a scheduler that narrows a plan (see
    `WorkPlan.chunk`) gets the narrowed plan's own request. The engine's batcher reads
    both: `compute_tokens` against its token budget, `cache_blocks` against the free blocks it
    may still admit into (a family that needs another resource adds the field with its reader).
    """

    compute_tokens: int = 0  # tokens pushed through the model: the unit of the token budget
    cache_blocks: int = 0  # KV blocks the loop must add to what it holds before running

    def __post_init__(self) -> None:
        for name in ("compute_tokens", "cache_blocks"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"ResourceRequest.{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class WorkPlan(Generic[ResultT_co]):
    """The next step of one loop, described and not yet run.

    `shape` is the batching signature: every plan of one step with the same shape goes to the
    one `Executor` registered for that shape, in one call, which reads their `work` payloads
    (e.g. one varlen forward for all prefill chunks and decode tokens). A plan never runs
    itself: there is no other way to execute it. `split`, when present, narrows the plan to its
    first n compute tokens (chunked prefill); a plan without it is atomic.
    """

    kind: str  # "prefill_chunk", "decode_token", "diffusion_step", "vae_tile", ...
    shape: Hashable
    resources: ResourceRequest
    work: object = field(default=None, repr=False)
    split: Callable[[int], WorkPlan[ResultT_co]] | None = field(default=None, repr=False)
    request_id: str = ""

    @property
    def splittable(self) -> bool:
        return self.split is not None

    def chunk(self, num_tokens: int) -> WorkPlan[ResultT_co]:
        """This plan narrowed to its first `num_tokens` compute tokens (itself if they cover it)."""
        if num_tokens >= self.resources.compute_tokens:
            return self
        if self.split is None:
            raise ValueError(
                f"plan {self.kind!r} of request {self.request_id!r} is atomic: cannot run "
                f"{num_tokens} of its {self.resources.compute_tokens} tokens"
            )
        if num_tokens < 1:
            raise ValueError(f"a chunk needs at least one token, got {num_tokens}")
        return self.split(num_tokens)


class Executor(Protocol[ResultT]):
    """Runs every plan of one shape that a step scheduled, together (one batched call).

    Returns one result per plan, in the order given; raises when the batch cannot run (the
    scheduler then aborts the loops whose plans were in it).
    """

    def execute(self, plans: Sequence[WorkPlan[ResultT]]) -> list[ResultT]: ...


@dataclass(frozen=True)
class LoopContext:
    """What the runtime tells a loop at `init`: the weights it runs on and the clock it reads."""

    weights_version: str = ""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)


@dataclass(frozen=True)
class Done:
    """`next()` has nothing left to run; the loop may be finalized."""

    reason: str = ""
