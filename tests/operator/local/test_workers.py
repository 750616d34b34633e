"""A real worker under the local substrate's process set, observer and control client (no router):
started from the card with its own log, observed ready on its version, paused, loaded with new
weights, resumed, adopted by a second controller, and seen exited after kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom_operator.control.client import ControlClient, ControlError
from loom_operator.control.probe import Observer
from loom_operator.local.cards import parse_fleet_cards
from loom_operator.local.launch import LaunchOptions
from loom_operator.local.observe import worker_state
from loom_operator.local.state import StatePaths, load_or_create_secrets, load_processes
from loom_operator.local.workers import ProcessSet
from loom_operator.testing.cards import card_text

NAME = "tiny-local-aggregated-0"
READY_TIMEOUT_S = 120.0


@pytest.fixture
def processes(tmp_path: Path, child_env: dict[str, str]) -> Iterator[ProcessSet]:
    paths = StatePaths(tmp_path / "state")
    ps = ProcessSet(paths, load_or_create_secrets(paths), LaunchOptions(), child_env)
    try:
        yield ps
    finally:
        asyncio.run(ps.stop_all_workers(10.0))


async def wait_ready(observer: Observer, ps: ProcessSet) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        entry = ps.table.get(NAME)
        assert entry is not None and ps.alive(NAME), (ps._paths.log(NAME)).read_text()[-2000:]
        probe = (await observer.probe_all([entry], {NAME: True}, time.time()))[NAME]
        if probe.health_ok and probe.status is not None:
            return
        assert time.monotonic() < deadline, f"worker not ready: {probe.error}"
        await asyncio.sleep(0.1)


def test_worker_lifecycle_under_the_substrate(
    processes: ProcessSet, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}"))
    cards = parse_fleet_cards(card)
    secrets = load_or_create_secrets(StatePaths(tmp_path / "state"))

    async def scenario() -> None:
        observer = Observer(secrets.control_token)
        try:
            now = time.time()
            entry = processes.start_worker(cards, NAME, "aggregated", cards.desired.source_uri,
                                           "v1", now, workers=1)  # fmt: skip
            assert load_processes(StatePaths(tmp_path / "state")).get(NAME) == entry
            await wait_ready(observer, processes)
            probe = (await observer.probe_all([entry], {NAME: True}, time.time()))[NAME]
            w = worker_state(entry, True, probe, observer.seen(NAME), routed=False, loading=False)
            assert (w.ready, w.alive, w.weights_version, w.admission_open) == (
                True,
                True,
                "v1",
                True,
            )
            assert (w.in_flight, w.routed, w.address) == (0, False, f"127.0.0.1:{entry.http_port}")

            control = observer.control(entry)
            paused = await control.pause("wait", 0.01)
            assert not paused.admission_open and paused.state == "paused"
            loaded = await control.load_weights(f"file://{checkpoints[1]}", "v2", timeout=60)
            assert loaded.weights_version == "v2" and not loaded.admission_open
            resumed = await control.resume()
            assert resumed.admission_open and resumed.state == "serving"
            assert resumed.num_free_blocks == resumed.num_blocks > 0

            async with ControlClient(entry.control, "wrong-token") as bad:
                with pytest.raises(ControlError) as err:
                    await bad.status()
            assert err.value.code == "UNAUTHENTICATED"
        finally:
            await observer.close()

    asyncio.run(scenario())

    # A second controller adopts the running worker instead of starting another one.
    paths = StatePaths(tmp_path / "state")
    second = ProcessSet(paths, secrets, LaunchOptions(), {})
    adopted, gone = second.adopt(time.time())
    assert (adopted, gone) == ([NAME], [])
    assert second.alive(NAME)

    # kill -9: both see it exit; the exit time is recorded for failover.
    entry = processes.table.get(NAME)
    assert entry is not None
    os.kill(entry.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while processes.alive(NAME) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not second.alive(NAME)
    before = time.time()
    assert processes.notice_exits(before) == [NAME]
    exited = processes.table.get(NAME)
    assert exited is not None and exited.last_exit_at == before
    assert processes.notice_exits(time.time()) == []  # noticed once
    assert processes.exit_code(NAME) == -signal.SIGKILL
