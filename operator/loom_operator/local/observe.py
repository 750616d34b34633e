"""Observing a local fleet: a worker process's probes (`loom_operator.control.probe`) and its
process facts as a `WorkerState`.

Owns the rule from probe results to `WorkerState` (`worker_state`, pure); never probes or acts
on a worker. A worker whose probe failed counts as not ready.
"""

from __future__ import annotations

from loom_operator.control.probe import Probe, Seen, is_loading, latest_status, probed_ready
from loom_operator.fleet.observed import WorkerState
from loom_operator.local.state import WorkerEntry


def worker_state(
    entry: WorkerEntry,
    alive: bool,
    probe: Probe | None,
    seen: Seen,
    routed: bool,
    loading: bool,
) -> WorkerState:
    """The WorkerState of `entry` from this round's probe and what was seen before (pure)."""
    status = latest_status(probe, seen)
    return WorkerState(
        name=entry.name,
        role=entry.role,
        weights_version=None if status is None else status.weights_version,
        address=entry.address,
        alive=alive,
        ready=probed_ready(alive, probe),
        in_flight=0 if status is None else status.in_flight,
        pending_kv_pulls=seen.kv_leases,
        admission_open=True if status is None else status.admission_open,
        routed=routed,
        loading=is_loading(loading, status),
        restarts=entry.restarts,
        started_at=entry.started_at,
        last_exit_at=entry.last_exit_at,
        last_seen=seen.last_seen,
    )
