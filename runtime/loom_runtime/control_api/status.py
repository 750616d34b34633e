"""The worker status record (what Status, WatchStatus and every control call answer) as plain
data, and its one mapping to and from the protobuf `WorkerStatus`.

Owns the field list and the state names; never reads an engine (the control service fills the
record) and never decides what a fleet does with it (the operator does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from loom_runtime.control_api import control_pb2 as pb

StateName = Literal["unknown", "serving", "draining", "paused", "loading", "failed"]
STATE_NAMES: dict[int, StateName] = {
    pb.WORKER_STATE_UNSPECIFIED: "unknown",
    pb.WORKER_STATE_SERVING: "serving",
    pb.WORKER_STATE_DRAINING: "draining",
    pb.WORKER_STATE_PAUSED: "paused",
    pb.WORKER_STATE_LOADING: "loading",
    pb.WORKER_STATE_FAILED: "failed",
}
_STATE_CODES = {name: code for code, name in STATE_NAMES.items()}
PhaseName = Literal["serving", "draining", "paused"]
PHASES: tuple[PhaseName, ...] = ("serving", "draining", "paused")
"""Where a live worker is in a drain: the states a healthy, loaded worker can be in."""


class EngineCounts(Protocol):
    """The engine numbers a status shows (the engine's EngineStats has them)."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def admission_open(self) -> bool: ...
    @property
    def weights_version(self) -> str: ...
    @property
    def num_preemptions(self) -> int: ...


def drain_phase(admission_open: bool, busy: bool) -> PhaseName:
    """The one drain rule (pure): serving while admission is open; closed, draining while work
    is left (`busy`) and paused once idle."""
    if admission_open:
        return "serving"
    return "draining" if busy else "paused"


def worker_state(admission_open: bool, in_flight: int, loading: bool, healthy: bool) -> StateName:
    """The state a worker is in (pure): failed > loading > serving > draining > paused."""
    if not healthy:
        return "failed"
    if loading:
        return "loading"
    return drain_phase(admission_open, in_flight > 0)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's status snapshot."""

    model_name: str
    role: str
    """aggregated | prefill | decode"""
    weights_version: str
    state: StateName
    admission_open: bool
    in_flight: int
    num_running: int
    num_waiting: int
    kv_usage: float
    """Fraction of KV blocks in use, 0..1."""
    num_blocks: int
    num_free_blocks: int
    block_size: int
    num_preemptions: int = 0

    @classmethod
    def of_engine(
        cls,
        counts: EngineCounts,
        *,
        model_name: str,
        role: str,
        in_flight: int,
        loading: bool,
        healthy: bool,
    ) -> WorkerStatus:
        state = worker_state(counts.admission_open, in_flight, loading, healthy)
        return cls(
            model_name=model_name,
            role=role,
            weights_version=counts.weights_version,
            state=state,
            admission_open=counts.admission_open,
            in_flight=in_flight,
            num_running=counts.num_running,
            num_waiting=counts.num_waiting,
            kv_usage=counts.kv_usage,
            num_blocks=counts.num_blocks,
            num_free_blocks=counts.num_free_blocks,
            block_size=counts.block_size,
            num_preemptions=counts.num_preemptions,
        )

    def to_pb(self) -> pb.WorkerStatus:
        return pb.WorkerStatus(
            model_name=self.model_name,
            role=self.role,
            weights_version=self.weights_version,
            state=_STATE_CODES[self.state],  # type: ignore[arg-type]
            admission_open=self.admission_open,
            in_flight=self.in_flight,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_usage=self.kv_usage,
            num_blocks=self.num_blocks,
            num_free_blocks=self.num_free_blocks,
            block_size=self.block_size,
            num_preemptions=self.num_preemptions,
        )

    @classmethod
    def from_pb(cls, s: pb.WorkerStatus) -> WorkerStatus:
        return cls(
            model_name=s.model_name,
            role=s.role,
            weights_version=s.weights_version,
            state=STATE_NAMES.get(s.state, "unknown"),
            admission_open=s.admission_open,
            in_flight=s.in_flight,
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_usage=s.kv_usage,
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            block_size=s.block_size,
            num_preemptions=s.num_preemptions,
        )
