"""Sharding the cards across operator replicas: a card's shard is stable, one look's plan keeps,
takes and gives back shard Leases toward a fair share, and replicas that follow the plan (over
a Lease store that keeps the API server's rule: a write carries the version it read) end with
every shard held by exactly one live replica — after joins, a death and a clean stop."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loom_operator.k8s.lease import holder, lease_body, live
from loom_operator.k8s.shard_keeper import Shards
from loom_operator.k8s.shards import (
    PUSH_URL_ANNOTATION,
    fair_share,
    member_lease,
    plan_shards,
    shard_of,
    shard_urls,
)

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def lease(who: str | None, renewed_ago_s: float = 1.0) -> dict[str, Any]:
    then = NOW - timedelta(seconds=renewed_ago_s)
    body = lease_body("x", "ns", who, 15.0, None, then, acquire=True)
    return body | {"metadata": {"name": "x", "resourceVersion": "1"}}


def test_a_cards_shard_is_stable_and_spreads() -> None:
    uids = [f"3f2c-{i:04d}" for i in range(1200)]
    assert [shard_of(u, 12) for u in uids] == [shard_of(u, 12) for u in uids]
    counts = [sum(1 for u in uids if shard_of(u, 12) == k) for k in range(12)]
    assert min(counts) > 60 and max(counts) < 140  # 100 each on average


@pytest.mark.parametrize(("shards", "members", "share"), [(12, 1, 12), (12, 3, 4), (12, 5, 3),
                                                          (2, 3, 1), (12, 0, 12)])  # fmt: skip
def test_fair_share(shards: int, members: int, share: int) -> None:
    assert fair_share(shards, members) == share


def test_alone_it_takes_every_shard() -> None:
    plan = plan_shards(4, {}, set(), "a", NOW)
    assert sorted(plan.acquire) == [0, 1, 2, 3] and not plan.renew and not plan.give_back


def test_it_keeps_its_own_and_waits_for_live_shards_of_others() -> None:
    leases = {0: lease("a"), 1: lease("b"), 2: lease("b"), 3: lease("a")}
    plan = plan_shards(4, leases, {"a", "b"}, "a", NOW)
    assert plan.renew == {0, 3} and plan.acquire == () and not plan.give_back


def test_an_expired_shard_is_taken_up_to_the_share() -> None:
    leases = {0: lease("a"), 1: lease("dead", 20), 2: lease("dead", 20), 3: lease("b")}
    plan = plan_shards(4, leases, {"a", "b"}, "a", NOW)
    assert plan.renew == {0} and len(plan.acquire) == 1 and set(plan.acquire) <= {1, 2}


def test_a_replica_over_its_share_gives_the_rest_back() -> None:
    leases = {k: lease("a") for k in range(6)}
    plan = plan_shards(6, leases, {"a", "b", "c"}, "a", NOW)
    assert plan.renew == {0, 1} and plan.give_back == {2, 3, 4, 5} and plan.acquire == ()


def test_a_released_shard_is_free() -> None:
    leases = {0: lease(None), 1: lease("b")}
    assert not live(leases[0], NOW) and holder(leases[0]) is None
    assert plan_shards(2, leases, {"a", "b"}, "a", NOW).acquire == (0,)


class LeaseStore:
    """The API server's Lease rule in memory (a test double: the e2e suite runs the keeper
    against a real API server): a PUT names the resourceVersion it read and loses to a newer
    write."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0

    def write(self, name: str, body: dict[str, Any], read: Mapping[str, Any] | None) -> bool:
        now = self.leases.get(name)
        if (read is None) != (now is None):
            return False
        if (
            read is not None
            and now is not None
            and read["metadata"]["resourceVersion"] != (now["metadata"]["resourceVersion"])
        ):
            return False
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = body
        return True


class Replica:
    """A replica following the keeper's steps over the store (what ShardKeeper.step does over
    the API server), its clock given."""

    def __init__(self, me: str, store: LeaseStore, shards: int) -> None:
        self.me, self.store, self.shards = me, store, shards
        self.acting: set[int] = set()

    def step(self, now: datetime) -> None:
        snapshot = {n: dict(v) for n, v in self.store.leases.items()}
        by_shard = {int(n[6:]): v for n, v in snapshot.items() if n.startswith("shard-")}
        members = {str(holder(v)) for n, v in snapshot.items()
                   if n.startswith("member-") and live(v, now)}  # fmt: skip
        plan = plan_shards(self.shards, by_shard, members, self.me, now)
        me = "member-" + member_lease(self.me)
        self.store.write(me, lease_body(me, "ns", self.me, 15, snapshot.get(me), now,
                                        acquire=False), snapshot.get(me))  # fmt: skip
        self.acting -= plan.give_back

        def put(k: int, who: str | None, acquire: bool) -> bool:
            name = f"shard-{k}"
            body = lease_body(name, "ns", who, 15, snapshot.get(name), now, acquire=acquire)
            return self.store.write(name, body, snapshot.get(name))

        kept = {k for k in plan.renew if put(k, self.me, False)}
        for k in plan.give_back:
            put(k, None, False)
        taken = {k for k in plan.acquire if put(k, self.me, True)}
        self.acting = kept | taken

    def stop(self, now: datetime) -> None:
        for name, v in list(self.store.leases.items()):
            if holder(v) == self.me:
                self.store.write(name, lease_body(name, "ns", None, 15, v, now, acquire=False), v)
        self.acting = set()


def run(replicas: list[Replica], start: datetime, seconds: int, seed: int) -> datetime:
    """Every replica looks every 5 s, in a random order each time."""
    rng, now = random.Random(seed), start
    for _ in range(seconds // 5):
        order = replicas[:]
        rng.shuffle(order)
        for r in order:
            r.step(now)
            assert_disjoint(replicas)
        now += timedelta(seconds=5)
    return now


def assert_disjoint(replicas: list[Replica]) -> None:
    seen: set[int] = set()
    for r in replicas:
        assert not (r.acting & seen), "two replicas act on one shard"
        seen |= r.acting


@pytest.mark.parametrize("seed", range(20))
def test_replicas_split_the_shards_and_take_over_from_a_dead_one(seed: int) -> None:
    store = LeaseStore()
    a, b, c = (Replica(x, store, 12) for x in "abc")
    now = run([a], NOW, 10, seed)
    assert a.acting == set(range(12))
    now = run([a, b, c], now, 30, seed)  # two join: the shares even out
    assert sorted(len(r.acting) for r in (a, b, c)) == [4, 4, 4]
    assert a.acting | b.acting | c.acting == set(range(12))
    # b dies (stops looking): its shards expire and the others take them, one owner each
    now = run([a, c], now, 40, seed)
    assert a.acting | c.acting == set(range(12)) and len(a.acting) == len(c.acting) == 6
    # c stops cleanly (gives its Leases back): a takes everything at its next looks
    c.stop(now)
    run([a], now, 10, seed)
    assert a.acting == set(range(12))


def test_shards_view_holds_a_given_back_shard_while_a_handler_acts() -> None:
    view = Shards(4)
    uid = next(u for u in (f"u{i}" for i in range(100)) if shard_of(u, 4) == 2)
    assert not view.owns(uid)
    view.set_acting(frozenset({2}), 60.0)
    changed = threading.Event()
    view.on_change(changed.set)
    with view.acting(uid) as mine:
        assert mine and view.busy(2)
        view.set_acting(frozenset())
        assert changed.is_set() and not view.owns(uid) and view.busy(2)
    assert not view.busy(2)
    with view.acting(uid) as mine:
        assert not mine and not view.busy(2)


def test_shards_not_renewed_in_time_are_no_longer_ours_until_renewed() -> None:
    view = Shards(4)
    uid = next(u for u in (f"u{i}" for i in range(100)) if shard_of(u, 4) == 1)
    renewed = threading.Event()
    view.on_change(renewed.set)
    view.set_acting(frozenset({1}), 0.05)
    assert view.owns(uid)
    renewed.clear()
    time.sleep(0.1)  # the keeper did not renew within the deadline
    assert not view.owns(uid) and view.acting_on == frozenset()
    assert view.assigned == {1}  # still this replica's (its card loops are kept, idle)
    view.set_acting(frozenset({1}), 60.0)  # renewed: the waiting daemons are woken
    assert view.owns(uid) and renewed.is_set()


def test_an_unsharded_view_owns_every_card() -> None:
    view = Shards()
    with view.acting("any") as mine:
        assert mine and view.owns("any")


def test_each_shard_leads_to_the_push_api_its_live_holder_publishes() -> None:
    def member(who: str, url: str | None, renewed_ago_s: float = 1.0) -> dict[str, Any]:
        m = lease(who, renewed_ago_s)
        m["metadata"] = {"annotations": {PUSH_URL_ANNOTATION: url} if url else {}}
        return m

    members = {
        member_lease(w): member(w, u)
        for w, u in (("a", "http://10.0.0.1:8093"), ("b", None), ("c", "http://10.0.0.3:8093"))
    }
    shards = {0: lease("a"), 1: lease("b"), 2: lease("c", 20), 3: lease(None), 4: lease("a")}
    urls = shard_urls(shards, members, NOW)
    assert urls == {0: "http://10.0.0.1:8093", 4: "http://10.0.0.1:8093"}  # fmt: skip
    view = Shards(6)
    view.set_urls(urls)
    uid = next(u for u in (f"uid-{i}" for i in range(100)) if shard_of(u, 6) == 4)
    assert view.owner_url(uid) == "http://10.0.0.1:8093"
    assert Shards().owner_url(uid) is None  # not sharded: every card is this replica's
