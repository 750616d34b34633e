"""Weight sync on Kubernetes under a streaming load: `kubectl apply` a new weightsVersion and the
operator rolls it out drain-correct, with the fleet controller core driving pods.

One P/D fleet (1 prefill + 2 decode, the tiny model in fp64, two checkpoints that answer
differently) serves greedy streams from 2 `openai` clients through its router pod while the
weights change. In every case: no request fails, every stream carries exactly one weights
version and is token-identical, chunk by chunk, to a plain single worker's greedy run on that
version (so no response mixes versions, and no prefill of one version is ever paired with a
decode of another: its KV would give other tokens), and the fleet ends Ready with every pod
annotated with the target version. Rolling syncs never take more than `maxUnavailable` workers
out of routing at once, whatever the edits (a revert mid-sync, three changes in a row).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import wait_for
from e2e.fleet_helpers import (
    MAX_TOKENS,
    MODEL,
    PROMPTS,
    ROLES,
    SETTLE_S,
    Operator,
    admin_token,
    card,
    free_port,
    operator_namespace,
    pushed_tensors,
    router_url,
    settled,
)
from e2e.providers import Cluster
from loom_operator.k8s.kube import object_path
from loom_operator.testing.cards import card_text
from loom_operator.testing.load import Stream, StreamingLoad, check_streams
from loom_operator.testing.weights import Weights
from loom_trainer import PushRefused, WeightSync

pytestmark = pytest.mark.timeout(600)

NAME = "sync"
CLIENTS = 2


class Fleet:
    """The sync fleet's namespace, its operator, and how to change and read its card."""

    def __init__(self, cluster: Cluster, weights: Weights, root: Path) -> None:
        self.cluster, self.weights, self.root = cluster, weights, root
        self.ns = operator_namespace(cluster)
        self.push_port = free_port()
        self.operator = self.start_operator("sync")

    def start_operator(self, tag: str) -> Operator:
        """An operator that also serves the weight-push API (on 127.0.0.1: the test's trainer)."""
        flags = ("--push-port", str(self.push_port), "--push-address", "127.0.0.1")
        return Operator(self.cluster, self.ns, tag, flags)

    def apply(self, version: str, strategy: str = "Rolling") -> None:
        """`kubectl apply -f` the cards with `version` (a new file per version, as a user has)."""
        path = self.root / f"{NAME}-{version}-{strategy}.yaml"
        path.write_text(card_text(
            self.weights.source(version), version=version, roles=ROLES, name=NAME, model=MODEL,
            strategy=strategy, drain=30, min_uncached=0,
        ))  # fmt: skip
        self.cluster.kubectl("apply", "-n", self.ns, "-f", str(path))

    def settled(self, version: str) -> dict[str, Any] | None:
        return settled(self.cluster, self.ns, NAME, version)

    def syncing(self) -> dict[str, Any] | None:
        """The card's weightSync while some worker has been frozen or loaded."""
        sync = (card(self.cluster, self.ns, NAME).get("status") or {}).get("weightSync") or {}
        moving = {"Draining", "Transferring", "Resuming", "Done"}
        steps = set((sync.get("workers") or {}).values())
        return sync if sync.get("phase") == "Syncing" and steps & moving else None

    def worker_pods(self) -> list[dict[str, Any]]:
        path = object_path("Pod", self.ns)
        selector = f"loom.dev/deployment={NAME},loom.dev/role"
        items: list[dict[str, Any]] = self.cluster.kube.get(path, labelSelector=selector)["items"]
        return items

    def load(self) -> StreamingLoad:
        url = router_url(self.cluster, self.ns, NAME)
        return StreamingLoad(url, MODEL, PROMPTS, MAX_TOKENS, clients=CLIENTS)

    def version(self) -> int:
        """The number of the version the card's status says every worker serves (vN)."""
        status = card(self.cluster, self.ns, NAME).get("status") or {}
        return int(str(status["weightsVersion"]).removeprefix("v"))

    def trainer(self) -> WeightSync:
        """A trainer on this machine, connected to the operator's push API for the card."""
        token = admin_token(self.cluster, self.ns, NAME)
        url = f"http://127.0.0.1:{self.push_port}/cards/{self.ns}/{NAME}"
        return WeightSync.connect(url, token, store_host="127.0.0.1")


class OutOfRouting:
    """Polls the worker pods on a thread; remembers the most that were out of routing at once
    (annotated draining, or Terminating)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = 0
            for pod in self._fleet.worker_pods():
                meta = pod["metadata"]
                notes = meta.get("annotations") or {}
                if notes.get("loom.dev/draining") == "true" or meta.get("deletionTimestamp"):
                    out += 1
            self.most = max(self.most, out)
            time.sleep(0.1)

    def __enter__(self) -> OutOfRouting:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="module")
def fleet(
    cluster: Cluster, weights: Weights, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    if not cluster.runs_pods_as_processes:
        pytest.skip("needs pod IPs reachable from the test (the local provider)")
    f = Fleet(cluster, weights, tmp_path_factory.mktemp("sync-cards"))
    try:
        f.apply("v1")
        wait_for(lambda: f.settled("v1"), SETTLE_S, "the sync fleet Ready on v1")
        yield f
    finally:
        cluster.kubectl("delete", "namespace", f.ns, "--wait=false", check=False)
        f.operator.stop()


def assert_served(fleet: Fleet, streams: list[Stream], *versions: str) -> None:
    problems = check_streams(streams, fleet.weights.expected(*versions))
    assert not problems, "\n".join(problems[:10])
    final = versions[-1]
    assert any(final in s.versions for s in streams), f"no stream was served by {final}"
    for pod in fleet.worker_pods():
        notes = pod["metadata"].get("annotations") or {}
        assert notes.get("loom.dev/weights-version") == final, pod["metadata"]["name"]
        assert notes.get("loom.dev/draining") != "true", pod["metadata"]["name"]


def sync_under_load(fleet: Fleet, old: str, new: str, strategy: str) -> tuple[list[Stream], int]:
    with fleet.load() as load, OutOfRouting(fleet) as out:
        load.wait_completed(4, 120)
        fleet.apply(new, strategy)
        wait_for(lambda: fleet.settled(new), SETTLE_S, f"a {strategy} sync to {new}")
        load.wait_completed(4, 120)  # and it serves on the new version
    return load.stop(), out.most


def test_a_rolling_sync_fails_no_request_and_keeps_max_unavailable(fleet: Fleet) -> None:
    streams, most = sync_under_load(fleet, "v1", "v2", "Rolling")
    assert_served(fleet, streams, "v1", "v2")
    assert most == 1, f"{most} workers were out of routing at once (maxUnavailable is 1)"
    table = fleet.cluster.kubectl("get", "deploymentcards", "-n", fleet.ns).stdout.split()
    header = ["NAME", "PHASE", "READY", "VERSION", "REPLICAS", "AGE"]  # the printer columns
    assert table[:6] == header
    assert table[6:10] == [NAME, "Ready", "2/2", "v2"]


def test_a_barrier_sync_fails_no_request(fleet: Fleet) -> None:
    streams, _ = sync_under_load(fleet, "v2", "v3", "Barrier")
    assert_served(fleet, streams, "v2", "v3")


def test_an_operator_killed_mid_sync_is_resumed_by_the_next(fleet: Fleet) -> None:
    with fleet.load() as load:
        load.wait_completed(4, 120)
        fleet.apply("v4")
        wait_for(fleet.syncing, 120, "the sync to v4 to start moving workers")
        fleet.operator.proc.kill()  # kill -9: no cleanup, the lease must expire
        fleet.operator.proc.wait()
        fleet.operator = fleet.start_operator("resumed")
        wait_for(lambda: fleet.settled("v4"), SETTLE_S, "the restarted operator to finish v4")
        load.wait_completed(4, 120)
    assert_served(fleet, load.stop(), "v3", "v4")
    assert fleet.operator.said("acquired lease")


def test_a_revert_mid_sync_converges_back_within_max_unavailable(fleet: Fleet) -> None:
    with fleet.load() as load, OutOfRouting(fleet) as out:
        load.wait_completed(4, 120)
        fleet.apply("v5")
        wait_for(fleet.syncing, 120, "the sync to v5 to start moving workers")
        fleet.apply("v4")  # the user thinks better of it
        wait_for(lambda: fleet.settled("v4"), SETTLE_S, "the fleet back on v4")
        load.wait_completed(4, 120)
    assert_served(fleet, load.stop(), "v4", "v5", "v4")
    assert out.most <= 1, f"{out.most} workers were out of routing at once"


def test_three_changes_in_a_row_end_on_the_last_within_max_unavailable(fleet: Fleet) -> None:
    with fleet.load() as load, OutOfRouting(fleet) as out:
        load.wait_completed(4, 120)
        for version in ("v5", "v6", "v7"):
            fleet.apply(version)
            time.sleep(1.0)
        wait_for(lambda: fleet.settled("v7"), SETTLE_S, "the fleet on v7")
        load.wait_completed(4, 120)
    assert_served(fleet, load.stop(), "v4", "v5", "v6", "v7")
    assert out.most <= 1, f"{out.most} workers were out of routing at once"


def test_a_trainer_pushes_twice_under_load_through_the_operator(fleet: Fleet) -> None:
    """The trainer outside the cluster opens each push at the operator's API; every worker pod
    joins it, stages it, and the Barrier sync swaps it in: no request fails, none mixes
    versions, and the card's status follows the push to done."""
    n = fleet.version()
    old, first, second = f"v{n}", f"v{n + 1}", f"v{n + 2}"
    trainer = fleet.trainer()
    with fleet.load() as load:
        load.wait_completed(4, 120)
        for version in (first, second):
            result = trainer.push(pushed_tensors(fleet.weights, version), version, timeout_s=60)
            assert result.version == version and len(result.workers) == 3
            load.wait_completed(4, 120)  # and it serves the pushed version
    assert_served(fleet, load.stop(), old, first, second)
    status = card(fleet.cluster, fleet.ns, NAME)["status"]
    assert status["weightsVersion"] == second
    assert status["push"]["state"] == "done" and status["push"]["version"] == second
    assert status["servedPush"]["updateId"] == status["push"]["updateId"]
    assert sorted(status["push"]["staged"]) == sorted(status["push"]["workers"])
    with pytest.raises(PushRefused, match="already has weights version"):
        trainer.push(pushed_tensors(fleet.weights, second), second, timeout_s=10)
    wrong = WeightSync(trainer.url, "not-the-token", store_host="127.0.0.1")
    with pytest.raises(PushRefused, match="wrong token"):
        wrong.latest()


def test_a_pod_replaced_after_a_push_rebuilds_the_pushed_version_from_a_peer(
    fleet: Fleet,
) -> None:
    """A worker pod deleted after a push comes back from the card's checkpoint; before it is
    routed, the sync has it receive the pushed version from a pod that serves it."""
    pushed = (card(fleet.cluster, fleet.ns, NAME).get("status") or {}).get("servedPush") or {}
    version = str(pushed.get("version") or "")
    if not pushed or fleet.version() != int(version.removeprefix("v")):  # run alone: push one
        version = f"v{fleet.version() + 1}"
        fleet.trainer().push(pushed_tensors(fleet.weights, version), version, timeout_s=60)
        wait_for(lambda: fleet.settled(version), SETTLE_S, f"the pushed {version} served")
    (victim,) = [p for p in fleet.worker_pods() if p["metadata"]["name"] == f"{NAME}-decode-1"]
    old_uid = victim["metadata"]["uid"]
    with fleet.load() as load:
        load.wait_completed(4, 120)
        fleet.cluster.kubectl("delete", "pod", "-n", fleet.ns, f"{NAME}-decode-1", "--wait=false")

        def back_on_version() -> bool:
            pods = {p["metadata"]["name"]: p for p in fleet.worker_pods()}
            new = pods.get(f"{NAME}-decode-1")
            if new is None or new["metadata"]["uid"] == old_uid:
                return False
            notes = new["metadata"].get("annotations") or {}
            return notes.get("loom.dev/weights-version") == version

        wait_for(back_on_version, SETTLE_S, f"the new pod routed as {version}")
        wait_for(lambda: fleet.settled(version), SETTLE_S, f"the fleet settled on {version}")
        load.wait_completed(4, 120)
    assert_served(fleet, load.stop(), version)
    events = fleet.cluster.kubectl("get", "events", "-n", fleet.ns).stdout
    assert f"{NAME}-decode-1 loaded {version}" in events
