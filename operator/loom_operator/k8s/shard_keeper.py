"""One operator replica's share of the cards: the shard Leases it holds, renewed every few
seconds, rebalanced when replicas join or die (shards.py decides), and the view the handlers ask
before they act on a card.

Owns the Lease calls of a sharded operator and the set of shards its handlers may act on; a
shard being given back is released only once no handler is acting on one of its cards, and a
replica that cannot renew stops acting before its Leases can expire.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from loom_operator.k8s.kube import Kube, KubeError
from loom_operator.k8s.lease import Lease, holder, lease_body, leases_path, live
from loom_operator.k8s.shards import (
    LEASE_LABEL,
    MEMBER_PREFIX,
    PUSH_URL_ANNOTATION,
    SHARD_PREFIX,
    member_lease,
    plan_shards,
    shard_lease,
    shard_of,
    shard_urls,
)

logger = logging.getLogger(__name__)

DEFAULT_SHARDS = 12
"""Splits evenly over 1, 2, 3, 4 or 6 replicas."""


@dataclass(frozen=True)
class ShardSettings:
    namespace: str
    """Where the Leases are (the operator's own namespace)."""
    identity: str
    shards: int = DEFAULT_SHARDS
    duration_s: float = 15.0
    """A replica that has not renewed a Lease for this long has lost it."""
    renew_s: float = 5.0
    push_url: str = ""
    """This replica's weight-push API, published on its member Lease ("": it serves none)."""


class Shards:
    """The shards this replica acts on now. Written by the keeper's thread, read by the handlers
    (kopf's loop and its handler threads); `None` shards: not sharded, every card is ours."""

    def __init__(self, shards: int | None = None) -> None:
        self.shards = shards
        self._lock = threading.Lock()
        self._acting: frozenset[int] = frozenset()
        self._until = 0.0
        """time.monotonic() after which the shards are no longer ours unless renewed again: a
        keeper stuck on a slow API server cannot act past its Leases."""
        self._busy: dict[int, int] = {}
        self._listeners: list[Callable[[], None]] = []
        self._urls: dict[int, str] = {}

    def shard(self, uid: str) -> int | None:
        return None if self.shards is None else shard_of(uid, self.shards)

    def owns(self, uid: str) -> bool:
        k = self.shard(uid)
        with self._lock:
            return k is None or k in self._current()

    def _current(self) -> frozenset[int]:
        return self._acting if time.monotonic() < self._until else frozenset()

    @contextlib.contextmanager
    def acting(self, uid: str) -> Iterator[bool]:
        """Whether this replica may act on the card; while the block runs its shard is not
        released (a give-back waits for it)."""
        k = self.shard(uid)
        if k is None:
            yield True
            return
        with self._lock:
            mine = k in self._current()
            if mine:
                self._busy[k] = self._busy.get(k, 0) + 1
        try:
            yield mine
        finally:
            if mine:
                with self._lock:
                    self._busy[k] -= 1

    def busy(self, shard: int) -> bool:
        with self._lock:
            return self._busy.get(shard, 0) > 0

    @property
    def acting_on(self) -> frozenset[int]:
        with self._lock:
            return self._current()

    @property
    def assigned(self) -> frozenset[int]:
        """The shards this replica keeps as its keeper last saw them, acted on or not: their
        Leases may have lapsed a moment (a renewal late on a slow API server), during which
        `acting_on` is empty; a shard lost to another replica or being given back leaves at the
        keeper's next look."""
        with self._lock:
            return self._acting

    def owner_url(self, uid: str) -> str | None:
        """The push API of the replica that holds the card's shard, as the last look read it
        (None: not sharded, or its holder publishes none)."""
        k = self.shard(uid)
        with self._lock:
            return None if k is None else self._urls.get(k)

    def set_urls(self, urls: dict[int, str]) -> None:
        with self._lock:
            self._urls = urls

    def on_change(self, listener: Callable[[], None]) -> None:
        """Called (from the keeper's thread) after the shards acted on changed."""
        self._listeners.append(listener)

    def set_acting(self, shards: frozenset[int], valid_s: float = 0.0) -> None:
        """Act on `shards` for the next `valid_s` seconds (0: keep the current deadline)."""
        with self._lock:
            now = time.monotonic()
            changed = shards != self._current()
            self._acting = shards
            if valid_s:
                changed |= bool(shards) and self._until <= now  # lapsed, now renewed
                self._until = now + valid_s
        if changed:
            for listener in self._listeners:
                listener()


class ShardKeeper:
    """Takes, renews and gives back this replica's shard Leases every `renew_s`."""

    def __init__(self, kube: Kube, settings: ShardSettings, shards: Shards) -> None:
        self.kube, self.settings, self.shards = kube, settings, shards
        self.held: set[int] = set()
        """Shard Leases this replica holds (acting on them, or waiting to give them back)."""

    def _read(self) -> tuple[dict[int, Lease], dict[str, Lease]]:
        """Every shard Lease by shard, and every member Lease by name (one list)."""
        s = self.settings
        listed = self.kube.get(leases_path(s.namespace), labelSelector=LEASE_LABEL)["items"]
        shards: dict[int, Lease] = {}
        members: dict[str, Lease] = {}
        for lease in listed:
            name = str(lease["metadata"]["name"])
            number = name.removeprefix(SHARD_PREFIX)
            if name.startswith(SHARD_PREFIX) and number.isdigit():
                shards[int(number)] = lease
            elif name.startswith(MEMBER_PREFIX):
                members[name] = lease
        return shards, members

    def _put(self, name: str, lease: Lease | None, identity: str | None, kind: str,
             acquire: bool) -> bool:  # fmt: skip
        """Create or PUT one Lease; False when another replica won the race."""
        s = self.settings
        notes = {PUSH_URL_ANNOTATION: s.push_url} if kind == "member" and s.push_url else None
        body = lease_body(name, s.namespace, identity, s.duration_s, lease, datetime.now(UTC),
                          acquire=acquire, labels={LEASE_LABEL: kind},
                          annotations=notes)  # fmt: skip
        try:
            if lease is None:
                self.kube.create(leases_path(s.namespace), body)
            else:
                self.kube.call("PUT", leases_path(s.namespace, name), body)
        except KubeError as exc:
            if exc.status in (404, 409, 422):
                return False
            raise
        return True

    def step(self) -> None:
        """One look: renew the member Lease and the shards kept, stop acting on what is over the
        fair share and give it back once no handler acts on it, take free shards up to it."""
        s = self.settings
        started = time.monotonic()
        shards, members = self._read()
        now = datetime.now(UTC)
        self.shards.set_urls(shard_urls(shards, members, now))
        alive = {str(holder(lease)) for lease in members.values() if live(lease, now)}
        plan = plan_shards(s.shards, shards, alive, s.identity, now)
        me = member_lease(s.identity)
        self._put(me, members.get(me), s.identity, "member", me not in members)
        self.shards.set_acting(self.shards.assigned - plan.give_back)  # a lapse stays one
        kept = {k for k in plan.renew if self._renew(k, shards.get(k), s.identity)}
        for k in sorted(plan.renew - kept):
            logger.warning("shards: lost shard %d to another replica", k)
        leaving: set[int] = set()
        for k in sorted(plan.give_back):
            if self.shards.busy(k):  # a handler still acts on one of its cards: hold it a look
                if self._renew(k, shards.get(k), s.identity):
                    leaving.add(k)
            elif self._renew(k, shards.get(k), None):
                logger.info("shards: gave back shard %d", k)
        taken = {k for k in plan.acquire if self._put(shard_lease(k), shards.get(k), s.identity,
                                                      "shard", True)}  # fmt: skip
        for k in sorted(taken):
            logger.info("shards: took shard %d", k)
        self.held = kept | leaving | taken
        # the Leases were renewed at `now` or later: act until a margin before they expire
        valid = s.duration_s - s.renew_s - (time.monotonic() - started)
        self.shards.set_acting(frozenset(kept | taken), max(valid, 0.001))

    def _renew(self, shard: int, lease: Lease | None, identity: str | None) -> bool:
        return self._put(shard_lease(shard), lease, identity, "shard", False)

    def keep(self, stop: threading.Event) -> None:
        """Look every `renew_s` until `stop`. A look that fails leaves the shards as they were
        until their deadline passes (`Shards`): then this replica acts on no card until a look
        renews its Leases."""
        while True:
            try:
                self.step()
            except (KubeError, OSError) as exc:
                logger.warning("shards: cannot renew (acting on no card once the Leases could "
                               "have expired): %s", exc)  # fmt: skip
            if stop.wait(self.settings.renew_s):
                return

    def release(self) -> None:
        """Give every Lease back on a clean stop, so the others take its shards at once."""
        self.shards.set_acting(frozenset())
        try:
            shards, members = self._read()
            for k, lease in shards.items():
                if holder(lease) == self.settings.identity:
                    self._renew(k, lease, None)
            me = member_lease(self.settings.identity)
            if me in members:
                self._put(me, members[me], None, "member", False)
        except (KubeError, OSError) as exc:
            logger.warning("shards: release failed: %s", exc)
