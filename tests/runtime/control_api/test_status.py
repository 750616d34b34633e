"""The worker status record: the state rule, and one mapping to and from protobuf that keeps
every field (the engine fills it, the operator reads it)."""

from __future__ import annotations

import pytest

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api.status import (
    PHASES,
    STATE_NAMES,
    WorkerStatus,
    drain_phase,
    worker_state,
)
from loom_runtime.engine.types import EngineStats


def _stats(admission_open: bool) -> EngineStats:
    return EngineStats(0, 0, 0.0, 8, 8, 16, admission_open, "v1")


STATES = [
    # (admission open, in flight, loading, healthy, state)
    (True, 3, False, True, pb.WORKER_STATE_SERVING),
    (False, 3, False, True, pb.WORKER_STATE_DRAINING),
    (False, 0, False, True, pb.WORKER_STATE_PAUSED),
    (False, 0, True, True, pb.WORKER_STATE_LOADING),
    (True, 0, False, False, pb.WORKER_STATE_FAILED),
    (False, 0, True, False, pb.WORKER_STATE_FAILED),
]


@pytest.mark.parametrize(("open_", "in_flight", "loading", "healthy", "state"), STATES)
def test_worker_state(
    open_: bool, in_flight: int, loading: bool, healthy: bool, state: int
) -> None:
    assert worker_state(open_, in_flight, loading, healthy) == STATE_NAMES[state]
    status = WorkerStatus.of_engine(
        _stats(open_), model_name="m", role="decode", in_flight=in_flight, loading=loading,
        healthy=healthy,
    )  # fmt: skip
    assert status.to_pb().state == state


@pytest.mark.parametrize(
    ("admission_open", "busy", "phase"),
    [(True, True, "serving"), (True, False, "serving"), (False, True, "draining"),
     (False, False, "paused")],
)  # fmt: skip
def test_the_drain_rule(admission_open: bool, busy: bool, phase: str) -> None:
    assert drain_phase(admission_open, busy) == phase
    assert phase in PHASES and phase in STATE_NAMES.values()


def test_the_record_round_trips_through_protobuf_with_every_field() -> None:
    stats = EngineStats(2, 1, 0.25, 64, 48, 16, True, "v7", num_preemptions=3)
    status = WorkerStatus.of_engine(
        stats, model_name="tiny", role="prefill", in_flight=3, loading=False, healthy=True
    )
    message = status.to_pb()
    assert WorkerStatus.from_pb(pb.WorkerStatus.FromString(message.SerializeToString())) == status
    fields = {f.name for f in pb.WorkerStatus.DESCRIPTOR.fields}
    assert fields == set(WorkerStatus.__dataclass_fields__)
    assert (status.state, status.num_preemptions, status.kv_usage) == ("serving", 3, 0.25)
