"""Three operator replicas share the cards of one namespace by shard Leases (`loom operator
--shards 12`): every card is acted on by exactly one replica, and a replica killed with kill -9
hands its cards to the others once its Leases expire — a weight sync in progress on one of them
completes under a streaming load with no failed request — and a trainer's push sent to a
replica that does not hold the card is forwarded to the one that does.

One real fleet (the tiny model, 1 prefill + 2 decode on the stand-in kubelet, syncing between two
checkpoints) and 29 small GLM-5-class cards whose pods kwok marks Running on fake GPU nodes (they
never serve; their cards converge with every role ready). Which replica acted on a card is read
from the replicas' logs (each apply and each fleet action is a line naming the card), who holds a
shard from its Lease.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

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
from e2e.providers import REPO, Cluster
from loom_operator.k8s.kube import object_path
from loom_operator.k8s.lease import holder, leases_path
from loom_operator.k8s.shards import LEASE_LABEL, SHARD_PREFIX, shard_of
from loom_operator.testing.cards import card_text, small_glm
from loom_operator.testing.load import StreamingLoad, check_streams
from loom_operator.testing.weights import Weights
from loom_trainer import WeightSync

pytestmark = pytest.mark.timeout(1200)

SHARDS = 12
LEASE_S = 15.0
RENEW_S = 5.0
NAME = "sync"
KWOK_CARDS = 29
GPU_NODE = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti"}
ROUTER_NODE = {"cpu": "64", "memory": "256Gi"}


def acted(op: Operator, namespace: str, since: int = 0) -> set[str]:
    """The cards this replica acted on (applied objects, or a fleet action) after line `since`."""
    pattern = re.compile(
        rf"applied \d+ of \d+ objects of {namespace}/(\S+)$|{namespace}/(\S+): [A-Z][A-Za-z]+: "
    )
    out = set()
    for line in op.lines()[since:]:
        if (m := pattern.search(line)) is not None:
            out.add(m.group(1) or m.group(2))
    return out


def shard_holders(cluster: Cluster, namespace: str) -> dict[int, str | None]:
    items = cluster.kube.get(leases_path(namespace), labelSelector=f"{LEASE_LABEL}=shard")["items"]
    return {int(i["metadata"]["name"].removeprefix(SHARD_PREFIX)): holder(i) for i in items}


def balanced(cluster: Cluster, namespace: str, replicas: int) -> bool:
    """Every shard held, by `replicas` replicas, evenly."""
    holders = shard_holders(cluster, namespace)
    held = [h for h in holders.values() if h is not None]
    counts = sorted(held.count(h) for h in set(held))
    return len(held) == SHARDS and counts == [SHARDS // replicas] * replicas


def identity(op: Operator) -> str:
    """The replica's identity outside a pod (cli/operate.py: host name and process id)."""
    return f"{socket.gethostname()}-{op.proc.pid}"


def converged(cluster: Cluster, namespace: str) -> bool:
    cards = cluster.kube.get(object_path("DeploymentCard", namespace))["items"]
    if len(cards) < KWOK_CARDS + 1:
        return False
    for c in cards:
        status = c.get("status") or {}
        roles = (status.get("roles") or {}).values()
        if status.get("observedGeneration") != c["metadata"].get("generation") or not roles:
            return False
        if any(r.get("ready") != r.get("desired") for r in roles):
            return False
    return True


@pytest.fixture
def cordoned(cluster: Cluster) -> Iterator[None]:
    """The stand-in kubelet's node takes no new pod (the kwok cards' routers go to kwok nodes;
    the real fleet's pods are placed before)."""
    nodes = cluster.kube.get("/api/v1/nodes", labelSelector="type!=kwok")["items"]
    names = [n["metadata"]["name"] for n in nodes]
    yield None
    for name in names:
        cluster.kubectl("uncordon", name, check=False)


def test_three_replicas_share_thirty_cards_and_a_killed_ones_cards_move_mid_sync(
    cluster: Cluster, weights: Weights, tmp_path: Path, cordoned: None
) -> None:
    if not cluster.runs_pods_as_processes or cluster.root is None:
        pytest.skip("needs the local provider (pod IPs reachable, kwok nodes)")
    ns = operator_namespace(cluster)
    ports = {tag: free_port() for tag in "abc"}
    ops = {
        tag: Operator(cluster, ns, tag, ("--shards", str(SHARDS), "--push-port", str(port),
                                         "--push-address", "127.0.0.1"))
        for tag, port in ports.items()
    }  # fmt: skip
    fake: list[str] = []
    try:
        wait_for(lambda: balanced(cluster, ns, 3), 90, "three replicas holding four shards each")

        def apply_sync(version: str) -> None:
            path = tmp_path / f"{NAME}-{version}.yaml"
            path.write_text(card_text(weights.source(version), version=version, roles=ROLES,
                                      name=NAME, model=MODEL, drain=30))  # fmt: skip
            cluster.kubectl("apply", "-n", ns, "-f", str(path))

        apply_sync("v1")
        wait_for(lambda: settled(cluster, ns, NAME, "v1"), SETTLE_S, "the real fleet Ready on v1")
        for node in cluster.kube.get("/api/v1/nodes", labelSelector="type!=kwok")["items"]:
            cluster.kubectl("cordon", node["metadata"]["name"])
        fake += cluster.add_fake_nodes(16, GPU_NODE)
        for name in cluster.add_fake_nodes(3, ROUTER_NODE, prefix="kwok-shard-router"):
            cluster.kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
            fake.append(name)
        docs = list(yaml.safe_load_all((REPO / "examples" / "glm-5-class.yaml").read_text()))
        cards = [docs[0], *(small_glm(docs[1], f"glm-{i:02d}") for i in range(KWOK_CARDS))]
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(cards))
        wait_for(lambda: converged(cluster, ns), 600, "30 cards converged", interval=2.0)

        # every card acted on by exactly one replica
        by_replica = {tag: acted(op, ns) for tag, op in ops.items()}
        names = {NAME, *(f"glm-{i:02d}" for i in range(KWOK_CARDS))}
        for name in names:
            actors = [tag for tag, seen in by_replica.items() if name in seen]
            assert len(actors) == 1, f"{name} was acted on by {actors or 'no replica'}"
        assert all(by_replica.values()), f"a replica acted on no card: {by_replica}"

        # kill the real fleet's replica while its sync moves workers
        owner = next(tag for tag, seen in by_replica.items() if NAME in seen)
        uid = card(cluster, ns, NAME)["metadata"]["uid"]
        shard = shard_of(uid, SHARDS)
        url = router_url(cluster, ns, NAME)
        with StreamingLoad(url, MODEL, PROMPTS, MAX_TOKENS, clients=2) as load:
            load.wait_completed(4, 120)
            apply_sync("v2")

            def syncing() -> bool:
                sync = (card(cluster, ns, NAME).get("status") or {}).get("weightSync") or {}
                moving = {"Draining", "Transferring", "Resuming", "Done"}
                return sync.get("phase") == "Syncing" and bool(
                    set((sync.get("workers") or {}).values()) & moving
                )

            wait_for(syncing, 120, "the sync to v2 to start moving workers")
            marks = {tag: len(op.lines()) for tag, op in ops.items()}
            dead = ops[owner].proc
            dead.kill()  # kill -9: no release, its Leases must expire
            dead.wait()
            killed = time.monotonic()
            alive = {tag: op for tag, op in ops.items() if tag != owner}

            def moved() -> bool:
                who = shard_holders(cluster, ns).get(shard)
                taken = who is not None and who != identity(ops[owner])
                return taken and any(NAME in acted(op, ns, marks[t]) for t, op in alive.items())

            wait_for(moved, LEASE_S + 3 * RENEW_S + 10, "another replica to act on the sync card")
            took_s = time.monotonic() - killed
            wait_for(lambda: settled(cluster, ns, NAME, "v2"), SETTLE_S, "the sync to finish")
            load.wait_completed(4, 120)
        problems = check_streams(load.stop(), weights.expected("v1", "v2"))
        assert not problems, "\n".join(problems[:10])
        assert took_s <= LEASE_S + 3 * RENEW_S + 10

        # every shard held by a live replica once the dead one's Leases expired (each expires
        # on its own clock: the sync card's shard can move before the others do), and after the
        # kill still one actor per card
        live = {identity(op) for op in alive.values()}

        def all_live() -> bool:
            holders = shard_holders(cluster, ns)
            return (
                sorted(holders) == list(range(SHARDS))
                and {str(h) for h in holders.values()} == live
            )

        left_s = LEASE_S + 3 * RENEW_S + 10 - (time.monotonic() - killed)
        wait_for(all_live, max(left_s, 1.0), "every shard held by a live replica")
        holders = shard_holders(cluster, ns)
        assert balanced(cluster, ns, 2)
        after = {tag: acted(op, ns, marks[tag]) for tag, op in alive.items()}
        a, b = after.values()
        assert not (a & b), f"cards acted on by both live replicas after the kill: {a & b}"

        # a trainer pushes through the replica that does not hold the card: it forwards there
        now_owner = next(t for t, op in alive.items() if identity(op) == holders[shard])
        other = next(t for t in alive if t != now_owner)
        push_url = f"http://127.0.0.1:{ports[other]}/cards/{ns}/{NAME}"
        trainer = WeightSync.connect(push_url, admin_token(cluster, ns, NAME), "127.0.0.1")
        result = trainer.push(pushed_tensors(weights, "v3"), "v3", timeout_s=60)
        assert result.version == "v3"
        wait_for(lambda: settled(cluster, ns, NAME, "v3"), SETTLE_S, "the pushed v3 served")
        assert any("WeightPush" in line for line in alive[now_owner].lines())
        assert not any("WeightPush" in line for line in alive[other].lines())
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for name in fake:
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        for op in ops.values():
            op.stop()
