"""Chaos under steady load: 4 `openai` clients stream greedy completions through the router of a
real P/D fleet (`loom up`: 1 prefill + 2 decode workers) while a decode or prefill worker is
killed with SIGKILL, a Rolling or a Barrier weight sync runs, or the controller itself is killed
mid-sync and restarted.

In every case: no client request fails, every stream is token-identical (chunk by chunk) to the
greedy reference of the weights version that served it, no stream carries two versions, and
afterwards every KV pool is whole (all blocks free, no prefill lease left)."""

from __future__ import annotations

import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom_operator.control.probe import metric_value
from loom_operator.local.snapshot import FleetStatus, WorkerRow
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet, wait_for
from loom_operator.testing.load import Stream, StreamingLoad, check_streams
from loom_operator.testing.weights import Weights, two_versions
from loom_runtime.models.tiny import init_tiny

MODEL = "tiny"
MAX_TOKENS = 24
CLIENTS = 4
ROLES = {"prefill": 1, "decode": 2}
PROMPTS = tuple(
    f"Chaos prompt {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 3)
    for i in range(8)
)


@pytest.fixture(scope="session")
def weights(tmp_path_factory: pytest.TempPathFactory, child_env: dict[str, str]) -> Weights:
    root = tmp_path_factory.mktemp("chaos-weights")
    paths = (init_tiny(root / "a", seed=0), init_tiny(root / "b", seed=1))
    return two_versions(paths, MODEL, PROMPTS, MAX_TOKENS, root, child_env)


def fleet_card(weights: Weights, version: str, strategy: str = "Rolling") -> str:
    return card_text(
        weights.source(version), version=version, roles=ROLES, name="chaos", model=MODEL,
        strategy=strategy, drain=30, health_timeout=5.0, min_uncached=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, weights: Weights, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("chaos-fleet")
    card = root / "card.yaml"
    card.write_text(fleet_card(weights, "v1"))
    with run_fleet(card, root / "state", child_env) as f:
        yield f


SETTLE_TIMEOUT_S = 180.0
STREAMS_BEFORE = 6  # streams finished before the fault, so the load is steady when it hits
STREAMS_AFTER = 6  # and after recovery, so the fleet is seen serving again


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def counter_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample of counter `name` (with `labels` among its labels)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] not in (name, name + "_total"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def migrations(fleet: FleetProcess) -> float:
    text = scrape(f"http://127.0.0.1:{fleet.port}")
    return sum(
        counter_sum(text, "loom_router:migrations", outcome=o) for o in ("resumed", "restarted")
    )


def pools_whole(workers: tuple[WorkerRow, ...]) -> list[str]:
    """What is not whole: a worker with blocks in use or prefill leases left."""
    problems = []
    for w in workers:
        text = scrape(f"http://{w.address}")
        free = metric_value(text, "loom:kv_free_blocks")
        info = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', text)
        leases = metric_value(text, "loom:kv_leases") or 0.0
        in_flight = metric_value(text, "loom:in_flight_requests") or 0.0
        total = float(info.group(1)) if info else -1.0
        if free != total or leases or in_flight:
            problems.append(
                f"{w.name}: {free}/{total} blocks free, {leases} leases, {in_flight} in flight"
            )
    return problems


def assert_clean(
    fleet: FleetProcess, streams: list[Stream], expected: dict[str, list[tuple[str, ...]]]
) -> None:
    problems = check_streams(streams, expected)
    assert not problems, f"{len(problems)} of {len(streams)} streams wrong:\n" + "\n".join(
        problems[:10]
    )
    status = fleet.status()
    assert status is not None
    left: list[list[str]] = [[]]

    def whole() -> bool:
        left[0] = pools_whole(status.workers)
        return not left[0]

    wait_for(whole, 60.0, "every KV pool to be whole")  # prefill leases end when pulled


def settled(fleet: FleetProcess) -> FleetStatus:
    return fleet.wait_settled(SETTLE_TIMEOUT_S)


def kill_busy(fleet: FleetProcess, role: str) -> WorkerRow:
    """SIGKILL a worker of `role` while it has requests in flight (or leases, for prefill)."""
    victim = next(w for w in settled(fleet).workers if w.role == role)

    def busy() -> bool:
        text = scrape(f"http://{victim.address}")
        work = (metric_value(text, "loom:in_flight_requests") or 0) + (
            metric_value(text, "loom:kv_leases") or 0
        )
        return work > 0

    wait_for(busy, 60.0, f"{victim.name} to be busy", interval=0.005)
    os.kill(victim.pid, signal.SIGKILL)
    return victim


def worker_processes(fleet: FleetProcess) -> list[int]:
    """Pids of every `loom runtime` process started from this fleet's state directory."""
    root = str(fleet.state.root.resolve())
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "loom_runtime" in text and any(a.startswith(root) for a in text):
            pids.append(int(proc.name))
    return pids


def run_kill(fleet: FleetProcess, weights: Weights, role: str) -> None:
    version = settled(fleet).target_version
    before = migrations(fleet)
    with StreamingLoad(fleet.endpoint, MODEL, PROMPTS, MAX_TOKENS, CLIENTS) as load:
        load.wait_completed(STREAMS_BEFORE, 120)
        victim = kill_busy(fleet, role)
        fleet.wait(
            lambda s: any(w.name == victim.name and w.restarts == victim.restarts + 1
                          and w.ready and w.routed for w in s.workers),
            SETTLE_TIMEOUT_S, f"{victim.name} to be restarted and routed",
        )  # fmt: skip
        load.wait_completed(STREAMS_AFTER, 120)
        streams = load.stop()
    assert_clean(fleet, streams, weights.expected(version))
    if role == "decode":  # a stream was cut mid-way and continued elsewhere
        assert migrations(fleet) > before
    settled(fleet)


def run_sync(
    fleet: FleetProcess, weights: Weights, strategy: str, kill_controller: bool = False
) -> list[Stream]:
    old = settled(fleet).target_version
    new = f"v{int(old.removeprefix('v')) + 1}"
    with StreamingLoad(fleet.endpoint, MODEL, PROMPTS, MAX_TOKENS, CLIENTS) as load:
        load.wait_completed(STREAMS_BEFORE, 120)
        fleet.edit_card(fleet_card(weights, new, strategy))
        if kill_controller:
            fleet.wait(
                lambda s: s.target_version == new and any(w.version == new for w in s.workers)
                and any(w.version == old for w in s.workers),
                SETTLE_TIMEOUT_S, "the sync to be half-way",
            )  # fmt: skip
            fleet.kill_controller()
            load.wait_completed(2, 120)  # the fleet serves on without a controller
            fleet.start()
        fleet.wait_settled(SETTLE_TIMEOUT_S, new)
        load.wait_completed(STREAMS_AFTER, 120)
        streams = load.stop()
    assert_clean(fleet, streams, weights.expected(old, new))
    served = {v for s in streams for v in s.versions}
    assert served == {old, new}, f"the load should span the sync, saw {served}"
    return streams


def test_kill_decode_worker_under_load(fleet: FleetProcess, weights: Weights) -> None:
    run_kill(fleet, weights, "decode")


def test_kill_prefill_worker_under_load(fleet: FleetProcess, weights: Weights) -> None:
    run_kill(fleet, weights, "prefill")


def test_rolling_weight_sync_under_load(fleet: FleetProcess, weights: Weights) -> None:
    run_sync(fleet, weights, "Rolling")


def test_barrier_weight_sync_under_load(fleet: FleetProcess, weights: Weights) -> None:
    run_sync(fleet, weights, "Barrier")


def test_controller_killed_mid_sync_resumes_it(fleet: FleetProcess, weights: Weights) -> None:
    pids = {w.name: w.pid for w in settled(fleet).workers}
    run_sync(fleet, weights, "Rolling", kill_controller=True)
    status = settled(fleet)
    # The restarted controller adopted the running workers (none restarted or duplicated) …
    assert {w.name: w.pid for w in status.workers} == pids
    assert fleet.starts == 2 and sorted(worker_processes(fleet)) == sorted(pids.values())
    # … and no worker was sent LoadWeights twice for the target (each log says it once).
    for w in status.workers:
        log = fleet.state.log(w.name).read_text()
        assert (
            len(
                re.findall(
                    rf"control_service: weights loaded \S+ version={status.target_version}\b", log
                )
            )
            == 1
        ), w.name
