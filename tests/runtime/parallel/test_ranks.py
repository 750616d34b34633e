"""Rank processes: a world of gloo ranks runs a program and returns its results; a rank that
dies, fails or hangs takes the others down with a clear error, within a bounded time, and no
process is left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from loom_runtime.parallel.ranks import (
    EXIT_FAILED,
    RankConfig,
    RankFailure,
    RankGroup,
    run_ranks,
)
from loom_runtime.testing.processes import poll
from loom_runtime.testing.rank_programs import raise_on, sum_forever, world_sum

BOUND_S = 20.0  # a survivor must be gone this soon after its peer died


def test_every_rank_runs_the_program_and_returns_its_result(tmp_path: Path) -> None:
    assert run_ranks(RankConfig(world=2), world_sum, workdir=tmp_path, timeout_s=120) == [1, 1]


def test_a_killed_rank_takes_the_others_down_with_a_clear_error(tmp_path: Path) -> None:
    config = RankConfig(world=2, collective_timeout_s=60.0, grace_s=60.0)
    with RankGroup(config, sum_forever, (str(tmp_path),), tmp_path / "ranks") as group:
        poll(lambda: len(list(tmp_path.glob("*.ready"))) == 2, 120, "both ranks summing")
        killed_at = time.monotonic()
        os.kill(group.pids[1], signal.SIGKILL)
        outcomes = group.wait(timeout_s=120)
    survivor = outcomes[0]
    assert outcomes[1].exitcode == -signal.SIGKILL
    # It went by itself (not stopped by the supervisor), well before the collective timeout.
    assert survivor.exitcode == EXIT_FAILED and not survivor.stopped
    assert survivor.exited_at is not None and survivor.exited_at - killed_at < BOUND_S
    assert survivor.error is not None and survivor.error.startswith("rank 0 of 2 failed:")
    assert all(not p.is_alive() for p in group.processes)


def test_a_frozen_rank_makes_the_others_time_out(tmp_path: Path) -> None:
    config = RankConfig(world=2, collective_timeout_s=3.0, grace_s=1.0)
    with RankGroup(config, sum_forever, (str(tmp_path),), tmp_path / "ranks") as group:
        poll(lambda: len(list(tmp_path.glob("*.ready"))) == 2, 120, "both ranks summing")
        frozen_at = time.monotonic()
        os.kill(group.pids[1], signal.SIGSTOP)
        outcomes = group.wait(timeout_s=120)
    survivor = outcomes[0]
    assert survivor.exitcode == EXIT_FAILED and not survivor.stopped
    assert survivor.exited_at is not None and survivor.exited_at - frozen_at < BOUND_S
    assert outcomes[1].stopped  # the frozen one is stopped by the supervisor
    assert all(not p.is_alive() for p in group.processes)


def test_a_failing_program_raises_rank_failure_naming_the_rank(tmp_path: Path) -> None:
    config = RankConfig(world=2, collective_timeout_s=30.0, grace_s=30.0)
    with pytest.raises(RankFailure, match="rank 1 of 2 failed: RuntimeError: rank 1 fails") as info:
        run_ranks(config, raise_on, 1, workdir=tmp_path, timeout_s=120)
    assert [o.exitcode for o in info.value.outcomes] == [EXIT_FAILED, EXIT_FAILED]
