"""From probes to WorkerState: a failed probe makes a worker unready but never forgets what it
was doing (an unknown in-flight count is not zero); a dead process is not alive; a worker
loading weights says so whether the executor or the runtime knows it first."""

from __future__ import annotations

import pytest

from loom_operator.control.probe import Probe, Seen
from loom_operator.local.observe import worker_state
from loom_operator.local.state import WorkerEntry
from loom_runtime.control_api.status import WorkerStatus

ENTRY = WorkerEntry(
    name="w", role="prefill", pid=1, ident=None, started_at=100.0, http_port=9000,
    control_port=9001, kv_events_port=9002, kv_replay_port=9003, kv_side_port=9004,
    version="v1", source="loom://tiny", restarts=2, last_exit_at=90.0,
)  # fmt: skip


def status(state: str = "serving", version: str = "v1", in_flight: int = 0) -> WorkerStatus:
    return WorkerStatus(
        model_name="tiny", role="prefill", weights_version=version, state=state,
        admission_open=state == "serving", in_flight=in_flight, num_running=in_flight,
        num_waiting=0, kv_usage=0.0, num_blocks=64, num_free_blocks=64, block_size=16,
    )  # fmt: skip


SEEN = Seen(status=status("draining", "v1", in_flight=3), kv_leases=2, last_seen=150.0)


@pytest.mark.parametrize(
    ("alive", "probe", "ready", "version", "in_flight", "admitting"),
    [
        (True, Probe(True, status("serving", "v2", 1)), True, "v2", 1, True),
        (True, None, False, "v1", 3, False),  # not probed: what was seen last
        (True, Probe(False, None, None, "timeout"), False, "v1", 3, False),  # failed probe
        (True, Probe(True, status("failed")), False, "v1", 0, False),  # engine thread died
        (True, Probe(False, status("serving")), False, "v1", 0, True),  # /health failing
        (False, None, False, "v1", 3, False),  # exited
    ],
)
def test_worker_state_from_probes(
    alive: bool, probe: Probe | None, ready: bool, version: str, in_flight: int, admitting: bool
) -> None:
    w = worker_state(ENTRY, alive, probe, SEEN, routed=True, loading=False)
    assert (w.alive, w.ready, w.weights_version) == (alive, ready, version)
    assert (w.in_flight, w.admission_open) == (in_flight, admitting)
    assert (w.pending_kv_pulls, w.last_seen, w.started_at) == (2, 150.0, 100.0)
    assert (w.restarts, w.last_exit_at, w.address) == (2, 90.0, "127.0.0.1:9000")


def test_loading_comes_from_the_executor_or_the_runtime() -> None:
    assert worker_state(ENTRY, True, Probe(True, status()), Seen(), True, loading=True).loading
    loading = Probe(True, status("loading"))
    assert worker_state(ENTRY, True, loading, Seen(), True, loading=False).loading
    assert not worker_state(ENTRY, True, Probe(True, status()), Seen(), True, False).loading


def test_a_worker_never_seen_has_no_version() -> None:
    w = worker_state(ENTRY, True, None, Seen(), routed=False, loading=False)
    assert (w.weights_version, w.in_flight, w.ready, w.routed) == (None, 0, False, False)
