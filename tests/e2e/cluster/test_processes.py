"""e2e/cluster/processes: a started child reads as alive from the moment `start` returns."""

from __future__ import annotations

import time
from pathlib import Path

from e2e.cluster import processes


def test_a_started_child_is_alive_as_soon_as_start_returns(tmp_path: Path) -> None:
    # Popen returns before the loader publishes the new argv (/proc/PID/cmdline reads empty for a
    # moment); a check in that window read CoreDNS as "exited at start" in CI.
    for i in range(30):
        child = processes.start(f"sleeper-{i}", ["/bin/sleep", "30"], tmp_path)
        try:
            assert child.alive()
        finally:
            processes.stop(child)
        assert not child.alive()


def test_a_child_that_exits_at_once_is_not_alive(tmp_path: Path) -> None:
    child = processes.start("quitter", ["/bin/sh", "-c", "echo bye; exit 3"], tmp_path)
    deadline = time.monotonic() + 10
    while child.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not child.alive()  # a zombie reads as gone
    assert (tmp_path / "quitter.log").read_text() == "bye\n"
