from __future__ import annotations

import pytest

from loom_operator.control.probe import (
    Probe,
    Seen,
    is_loading,
    latest_status,
    metric_value,
    probed_ready,
)
from loom_runtime.control_api.status import StateName, WorkerStatus


def test_metric_value_reads_the_named_sample_only() -> None:
    text = (
        "# HELP loom:kv_leases x\n"
        'loom:kv_leases_total{model_name="tiny"} 9.0\n'
        'loom:kv_leases{model_name="tiny"} 3.0\n'
        "loom:kv_free_blocks 12\n"
    )
    assert metric_value(text, "loom:kv_leases") == 3.0
    assert metric_value(text, "loom:kv_free_blocks") == 12.0
    assert metric_value(text, "loom:missing") is None


def _status(state: StateName) -> WorkerStatus:
    return WorkerStatus(
        model_name="tiny", role="decode", weights_version="v1", state=state,
        admission_open=state == "serving", in_flight=0, num_running=0, num_waiting=0,
        kv_usage=0.0, num_blocks=8, num_free_blocks=8, block_size=16,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("alive", "probe", "ready"),
    [
        (True, Probe(True, _status("serving")), True),
        (True, Probe(True, _status("draining")), True),
        (True, Probe(True, _status("loading")), True),
        (False, Probe(True, _status("serving")), False),  # the process is gone
        (True, None, False),  # not probed this round
        (True, Probe(False, _status("serving")), False),  # /health failed
        (True, Probe(True, None), False),  # Status did not answer
        (True, Probe(True, _status("failed")), False),  # the engine thread died
    ],
)
def test_ready_needs_a_live_process_and_a_full_healthy_probe(
    alive: bool, probe: Probe | None, ready: bool
) -> None:
    assert probed_ready(alive, probe) is ready


def test_the_latest_status_falls_back_to_what_was_seen() -> None:
    seen = Seen(status=_status("draining"))
    fresh = _status("serving")
    assert latest_status(Probe(True, fresh), seen) is fresh
    assert latest_status(Probe(False, None), seen) is seen.status
    assert latest_status(None, seen) is seen.status
    assert latest_status(None, Seen()) is None


@pytest.mark.parametrize(
    ("loading", "state", "expected"),
    [(True, None, True), (False, "loading", True), (False, "serving", False), (False, None, False)],
)
def test_loading_is_the_substrates_word_or_the_workers(
    loading: bool, state: StateName | None, expected: bool
) -> None:
    assert is_loading(loading, None if state is None else _status(state)) is expected
