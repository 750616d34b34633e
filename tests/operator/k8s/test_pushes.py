"""A push as the card's status keeps it: read back equal; a push left `receiving` by an operator
that stopped reads as failed; a new owner serves the push every worker staged and shows the
latest; the push API answers only for the cards whose loop runs on this replica."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from loom_operator.control.push_api import Later
from loom_operator.fleet.push import PushUpdate
from loom_operator.fleet.record import FleetRecord
from loom_operator.k8s.fleet import PodFleet
from loom_operator.k8s.pushes import CardPushes, PushDesks, push_from_status, push_status

PUSH = PushUpdate("u1", "v3", "keep", ("c-decode-0",), "10.0.0.9", 29500, 30.0, "v2",
                  state="done", staged=frozenset({"c-decode-0"}), kv="recompute")  # fmt: skip


def card_pushes(status: dict[str, Any]) -> CardPushes:
    fleet = PodFleet(None, "ns", "c", FleetRecord(), lambda *_: None)  # type: ignore[arg-type]
    return CardPushes(fleet, lambda *_: None, lambda: None, status)


def test_a_push_reads_back_from_the_status_it_is_written_to() -> None:
    doc = push_status(PUSH)
    assert doc["updateId"] == "u1" and doc["storeAddress"] == "10.0.0.9:29500"
    assert doc["staged"] == ["c-decode-0"] and doc["timeoutSeconds"] == 30.0
    assert push_from_status(doc) == PUSH


def test_a_push_left_receiving_reads_as_failed_and_junk_as_none() -> None:
    left = push_from_status(push_status(replace(PUSH, state="receiving")))
    assert left is not None and left.state == "failed" and "stopped" in left.error
    assert push_from_status({"updateId": "u1"}) is None
    assert push_from_status(None) is None


def test_a_new_owner_serves_the_staged_push_and_shows_the_latest() -> None:
    latest = replace(PUSH, update_id="u2", version="v4", state="receiving", staged=frozenset())
    pushes = card_pushes({"push": push_status(latest), "servedPush": push_status(PUSH)})
    assert pushes.coordinator.serving == PUSH
    update = pushes.coordinator.update
    assert update is not None and update.update_id == "u2" and update.state == "failed"
    fields = pushes.status()
    assert fields["servedPush"]["updateId"] == "u1" and fields["push"]["state"] == "failed"
    assert card_pushes({}).status() == {}


def test_the_api_answers_only_for_cards_that_run_here() -> None:
    desks = PushDesks()
    why = asyncio.run(desks.desk({"namespace": "ns", "name": "c"}))
    assert isinstance(why, str) and "no DeploymentCard ns/c runs on this operator replica" in why
    desks.uid_of = lambda _ns, _name: "uid-1"  # the card is known; its loop runs nowhere yet
    wait = asyncio.run(desks.desk({"namespace": "ns", "name": "c"}))
    assert isinstance(wait, Later) and "retry shortly" in wait.why
