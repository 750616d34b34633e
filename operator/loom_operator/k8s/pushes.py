"""Trainer pushes on Kubernetes: each card's push coordinator (control/pushes.py) over its pods,
the push kept in the card's status (`status.push`), and the push API the operator serves per
card at /cards/{namespace}/{name}/v1/weights/updates (`loom operator --push-port`, docs/rl.md).

Owns the status form of a push and which cards this replica answers for (those whose loop runs
here); never decides whether a push may open (fleet/push.py does) and never writes status (the
card's round does, with what `push_status` gives).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from loom_operator.api.status import PushStatus
from loom_operator.control.push_api import Forward, Later, PushDesk, Store
from loom_operator.control.pushes import PushCoordinator
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import PushConflict, PushUpdate
from loom_operator.fleet.record import SyncRecord
from loom_operator.k8s.fleet import Events, PodFleet
from loom_operator.k8s.shard_keeper import Shards

logger = logging.getLogger(__name__)

CardKey = tuple[str, str]
"""(namespace, name)."""


def push_status(u: PushUpdate) -> dict[str, Any]:
    """A push as `status.push` holds it."""
    status = PushStatus(
        update_id=u.update_id, version=u.version, mode=u.mode, state=u.state,
        workers=list(u.workers), staged=sorted(u.staged), base_version=u.base_version, kv=u.kv,
        store_address=f"{u.store_host}:{u.store_port}", timeout_seconds=u.timeout_s,
        error=u.error,
    )  # fmt: skip
    return status.model_dump(by_alias=True, mode="json")


def push_from_status(doc: Mapping[str, Any] | None) -> PushUpdate | None:
    """The push a card's status holds, as the coordinator knows it (None: none, or unreadable).
    A push still `receiving` there was opened by an operator that stopped: its transfer is lost
    (the trainer's collectives time out), so it is kept as failed."""
    if not doc:
        return None
    try:
        s = PushStatus.model_validate(doc)
        host, _, port = s.store_address.rpartition(":")
        u = PushUpdate(
            s.update_id, s.version, s.mode, tuple(s.workers), host, int(port or 0),
            s.timeout_seconds, s.base_version, s.state, s.error, frozenset(s.staged), s.kv,
        )  # fmt: skip
    except ValueError as exc:
        logger.warning("status.push ignored (%s): the fleet serves the card's version", exc)
        return None
    if u.state == "receiving":
        why = "the operator that opened it stopped before every worker staged it"
        return replace(u, state="failed", error=why)
    return u


class CardPushes:
    """One card's pushes while this replica runs its loop."""

    def __init__(
        self, fleet: PodFleet, events: Events, wake: Callable[[], None], status: Mapping[str, Any]
    ) -> None:
        self.fleet = fleet
        # A push is opened from the API's request, whose context lacks kopf's event posting:
        # its Events are posted in the context of the card's loop, where this is made.
        context = contextvars.copy_context()

        def say(message: str, warning: bool) -> None:
            kind = "Warning" if warning else "Normal"
            context.copy().run(events, "WeightPush", message, kind)

        serving = push_from_status(status.get("servedPush"))
        self.coordinator = PushCoordinator(fleet.control, say, wake, lambda _: wake(), serving)
        latest = push_from_status(status.get("push"))
        if latest is not None and (serving is None or latest.update_id != serving.update_id):
            self.coordinator.update = latest  # failed, or lost with the operator that opened it
        self.card: DesiredFleet | None = None
        """The card's fleet as the last round had it (its counts, the card's version)."""
        self.observed: FleetObservation | None = None
        self.sync: SyncRecord | None = None

    def seen(self, card: DesiredFleet, observed: FleetObservation, sync: SyncRecord | None) -> None:
        """After a round: what the next push opens against."""
        self.card, self.observed, self.sync = card, observed, sync

    def open(
        self, version: str, mode: str, timeout_s: float, kv: str, store: Store | None
    ) -> PushUpdate:
        if self.card is None or self.observed is None:
            raise PushConflict("the operator has not run a round of the card yet; retry shortly")
        assert store is not None  # the desk requires it
        return self.coordinator.open(
            version, mode, timeout_s, store, self.card, self.observed, self.sync, kv
        )

    def status(self) -> dict[str, Any]:
        """The card's status fields of its pushes: `push`, the latest (how the trainer and a
        person follow it), and `servedPush`, the push every worker staged (what a restarted or
        newly owning operator serves); absent before the first push."""
        fields = {}
        latest, served = self.coordinator.latest, self.coordinator.serving
        if latest is not None:
            fields["push"] = push_status(latest)
        if served is not None:
            fields["servedPush"] = push_status(served)
        return fields

    @property
    def inputs(self) -> tuple[str, str, int]:
        """What of the push a round reads: a change runs a round."""
        u = self.coordinator.update
        return ("", "", 0) if u is None else (u.update_id, u.state, len(u.staged))

    async def close(self) -> None:
        await self.coordinator.close()


class PushDesks:
    """The cards this replica answers pushes for (those whose loop runs here), and where the
    others' go when the operator is sharded (the replica that holds the card's shard)."""

    def __init__(self, shards: Shards | None = None) -> None:
        self.cards: dict[CardKey, CardPushes] = {}
        self.shards = shards
        self.uid_of: Callable[[str, str], str | None] = lambda _ns, _name: None
        """(namespace, name) -> the card's UID as the watch has it (None: no such card)."""

    async def desk(self, match: Mapping[str, str]) -> PushDesk | Forward | Later | str:
        key = (match["namespace"], match["name"])
        pushes = self.cards.get(key)
        if pushes is None:
            uid = self.uid_of(*key)
            if uid is None:
                return f"no DeploymentCard {key[0]}/{key[1]} runs on this operator replica"
            url = None if self.shards is None else self.shards.owner_url(uid)
            if url is not None:
                return Forward(url)
            return Later(
                f"DeploymentCard {key[0]}/{key[1]}'s shard has no live holder serving pushes "
                "yet (a shard moving between replicas, or its loop starting); retry shortly"
            )
        token = await pushes.fleet.admin_token()
        return PushDesk(token, pushes.open, lambda: pushes.coordinator.latest, True)
