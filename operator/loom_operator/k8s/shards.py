"""Sharding the cards across operator replicas: which shard a card is in, and what one replica
does with the shard Leases at each look — keep its own, take free or expired ones up to its fair
share of the live replicas, give back what is over that share.

Pure decisions over plain data; the shard keeper (shard_keeper.py) reads and writes the Leases.
Every card is in exactly one shard (a hash of its UID, stable across restarts), every shard is
held by at most one replica (a Lease, taken with optimistic concurrency), and a replica acts on a
card only while it holds the card's shard: two replicas never act on one card.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass
from datetime import datetime

from loom_operator.k8s.lease import Lease, holder, live

SHARD_PREFIX = "loom-operator-shard-"
MEMBER_PREFIX = "loom-operator-member-"
LEASE_LABEL = "loom.dev/operator-lease"
"""On every Lease of a sharded operator: `shard` or `member` (one list finds them all)."""
PUSH_URL_ANNOTATION = "loom.dev/push-url"
"""On a member Lease: the replica's weight-push API (the others forward a card's push there)."""


def shard_of(uid: str, shards: int) -> int:
    """The card's shard: a stable hash of its UID (its name may be reused, its UID is not)."""
    digest = hashlib.sha256(uid.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shard_lease(shard: int) -> str:
    return f"{SHARD_PREFIX}{shard}"


def member_lease(identity: str) -> str:
    """A replica's member Lease name (its identity may not be a valid object name)."""
    return MEMBER_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:16]


def fair_share(shards: int, members: int) -> int:
    """The most shards one of `members` live replicas holds once balanced."""
    return math.ceil(shards / max(members, 1))


@dataclass(frozen=True)
class ShardPlan:
    """One look's steps for one replica."""

    renew: frozenset[int]
    """Held and kept."""
    acquire: tuple[int, ...]
    """Free or expired, to take (in this order: the replica's own order, so that replicas
    joining at once mostly try different shards)."""
    give_back: frozenset[int]
    """Held but over the fair share: stop acting on their cards, then release them."""


def _order(me: str, shard: int) -> bytes:
    return hashlib.sha256(f"{me}/{shard}".encode()).digest()


def plan_shards(
    shards: int,
    leases: Mapping[int, Lease | None],
    members: Set[str],
    me: str,
    now: datetime,
) -> ShardPlan:
    """What `me` does with the shard Leases this look. `leases`: each shard's Lease as read (None:
    not made yet); `members`: the identities whose member Lease is live (`me` counts whether or
    not its own is yet). Pure."""
    share = fair_share(shards, len(members | {me}))
    mine = sorted(k for k in range(shards) if holder(leases.get(k)) == me)
    keep, over = mine[:share], mine[share:]
    free = [k for k in range(shards) if not live(leases.get(k), now) and k not in mine]
    room = max(0, share - len(keep))
    take = tuple(sorted(free, key=lambda k: _order(me, k))[:room])
    return ShardPlan(frozenset(keep), take, frozenset(over))


def shard_urls(
    shards: Mapping[int, Lease], members: Mapping[str, Lease], now: datetime
) -> dict[int, str]:
    """Shard -> the push API URL its live holder publishes on its member Lease (annotation
    PUSH_URL_ANNOTATION); shards whose holder is gone or publishes none are absent. Pure."""
    out = {}
    for k, lease in shards.items():
        who = holder(lease)
        if who is None or not live(lease, now):
            continue
        member = members.get(member_lease(who)) or {}
        url = ((member.get("metadata") or {}).get("annotations") or {}).get(PUSH_URL_ANNOTATION)
        if url:
            out[k] = str(url)
    return out
