"""The push API over HTTP: one fleet at the root (`loom up`) or a fleet per card (the operator);
the token is the fleet's, a push's fields are checked, a conflict is a 409 and a card this
replica does not run a 404."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loom_operator.api.status import PushMode
from loom_operator.control.push_api import (
    CARD_PREFIX,
    FORWARDED,
    Forward,
    PushDesk,
    Store,
    parse_store,
    push_app,
)
from loom_operator.fleet.push import PushConflict, PushUpdate

TOKEN = "s3cret"


class Fleet:
    """A desk that records what it was asked to open."""

    def __init__(self, store_required: bool = False) -> None:
        self.opened: list[tuple[str, str, float, str, Store | None]] = []
        self.update: PushUpdate | None = None
        self.store_required = store_required

    def open(
        self, version: str, mode: str, timeout: float, kv: str, store: Store | None
    ) -> PushUpdate:
        if version == "busy":
            raise PushConflict("push u0 of v2 is still receiving")
        self.opened.append((version, mode, timeout, kv, store))
        host, port = store or ("127.0.0.1", 1)
        self.update = PushUpdate(
            "u1", version, cast(PushMode, mode), ("w0",), host, port, timeout, "v1", kv=kv
        )
        return self.update

    def desk(self) -> PushDesk:
        return PushDesk(TOKEN, self.open, lambda: self.update, self.store_required)


def call(
    app_of: Any, method: str, path: str, body: object = None, token: str = TOKEN
) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(app_of())) as client:
            headers = {"Authorization": f"Bearer {token}"}
            r = await client.request(method, path, json=body, headers=headers)
            return r.status, await r.json()

    return asyncio.run(run())


def one_fleet(fleet: Fleet) -> Any:
    async def desks(_: Mapping[str, str]) -> PushDesk:
        return fleet.desk()

    return lambda: push_app(desks)


def per_card(cards: dict[tuple[str, str], Fleet]) -> Any:
    async def desks(match: Mapping[str, str]) -> PushDesk | str:
        fleet = cards.get((match["namespace"], match["name"]))
        return "no such card here" if fleet is None else fleet.desk()

    return lambda: push_app(desks, CARD_PREFIX)


def test_a_push_opens_with_its_fields_and_is_read_back() -> None:
    fleet = Fleet()
    app = one_fleet(fleet)
    body = {"version": "v2", "mode": "keep", "timeout_seconds": 9, "store_address": "10.0.0.5:4000"}
    status, doc = call(app, "POST", "/v1/weights/updates", body)
    assert status == 201 and doc["update_id"] == "u1" and doc["store_port"] == 4000
    assert fleet.opened == [("v2", "keep", 9.0, "keep", ("10.0.0.5", 4000))]
    assert call(app, "GET", "/v1/weights/updates")[1]["update"]["version"] == "v2"
    assert call(app, "GET", "/v1/weights/updates/u1")[0] == 200
    assert call(app, "GET", "/v1/weights/updates/u9")[0] == 404


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"mode": "barrier"}, 400, "a push needs JSON"),
        ({"version": "v2", "timeout_seconds": 0}, 400, "timeout_seconds must be in"),
        ({"version": "v2", "store_address": "nohost"}, 400, "store_address must be host:port"),
        ({"version": "v2", "store_address": "h:99999"}, 400, "store_address must be host:port"),
        ({"version": "busy"}, 409, "still receiving"),
    ],
)
def test_a_bad_push_is_refused_with_its_reason(body: object, status: int, message: str) -> None:
    fleet = Fleet()
    got, doc = call(one_fleet(fleet), "POST", "/v1/weights/updates", body)
    assert got == status and message in doc["error"] and fleet.opened == []


def test_the_fleets_token_is_required() -> None:
    fleet = Fleet()
    status, doc = call(one_fleet(fleet), "POST", "/v1/weights/updates", {"version": "v2"}, "x")
    assert status == 401 and "wrong token" in doc["error"] and fleet.opened == []


def test_each_card_has_its_own_desk_and_the_operator_needs_the_trainers_store() -> None:
    cards = {("ns", "a"): Fleet(store_required=True)}
    app = per_card(cards)
    status, doc = call(app, "POST", "/cards/ns/a/v1/weights/updates", {"version": "v2"})
    assert status == 400 and "store_address is required" in doc["error"]
    body = {"version": "v2", "store_address": "[fd00::1]:29500"}
    assert call(app, "POST", "/cards/ns/a/v1/weights/updates", body)[0] == 201
    assert cards[("ns", "a")].opened[0][4] == ("fd00::1", 29500)
    status, doc = call(app, "GET", "/cards/ns/b/v1/weights/updates")
    assert status == 404 and doc["error"] == "no such card here"


def test_a_store_address_parses() -> None:
    assert parse_store("trainer.ns.svc:29500") == ("trainer.ns.svc", 29500)
    with pytest.raises(ValueError, match="host:port"):
        parse_store(":80")


def test_a_card_of_another_replica_is_forwarded_there_once() -> None:
    owner = Fleet(store_required=True)

    async def run() -> list[tuple[int, dict[str, Any]]]:
        async with TestServer(per_card({("ns", "a"): owner})()) as there:
            base = str(there.make_url(""))

            async def elsewhere(match: Mapping[str, str]) -> Forward | str:
                return Forward(base) if match["name"] == "a" else "no such card"

            async def also_elsewhere(_: Mapping[str, str]) -> Forward:
                return Forward(base)

            out = []
            body = {"version": "v2", "store_address": "10.0.0.5:4000"}
            async with TestClient(TestServer(push_app(elsewhere, CARD_PREFIX))) as here:
                for token in (TOKEN, "wrong"):
                    r = await here.post("/cards/ns/a/v1/weights/updates", json=body,
                                        headers={"Authorization": f"Bearer {token}"})  # fmt: skip
                    out.append((r.status, await r.json()))
                r = await here.get("/cards/ns/a/v1/weights/updates",
                                   headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
                out.append((r.status, await r.json()))
            async with TestClient(TestServer(push_app(also_elsewhere, CARD_PREFIX))) as loop:
                r = await loop.get(
                    "/cards/ns/a/v1/weights/updates",
                    headers={"Authorization": f"Bearer {TOKEN}", FORWARDED: "1"},
                )
                out.append((r.status, await r.json()))
        async with TestClient(TestServer(push_app(also_elsewhere, CARD_PREFIX))) as gone:
            r = await gone.get("/cards/ns/a/v1/weights/updates",
                               headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            out.append((r.status, await r.json()))
        return out

    opened, refused, latest, looped, unreachable = asyncio.run(run())
    assert opened[0] == 201 and owner.opened == [("v2", "barrier", 60.0, "", ("10.0.0.5", 4000))]
    assert refused[0] == 401 and "wrong token" in refused[1]["error"]
    assert latest == (200, {"update": owner.update.as_json() if owner.update else None})
    assert looped[0] == 503 and "retry shortly" in looped[1]["error"]
    assert unreachable[0] == 502 and "did not answer" in unreachable[1]["error"]
