"""The relay's pure parts: which failures move a request, what the migration header says, and
the registry an admin's migrate acts on."""

from __future__ import annotations

from loom_router.core.endpoints import Endpoint
from loom_router.shell.relay import Flights, _migrated, _movable


def test_only_worker_side_aborts_move_a_stream() -> None:
    assert _movable({"error": {"code": "request_aborted"}})
    assert _movable({"error": {"code": "engine_stalled"}})
    assert not _movable({"error": {"code": "kv_transfer_failed"}})  # policy "fail": an answer
    assert not _movable({"error": {"code": None, "type": "invalid_request_error"}})


def test_the_header_says_when_a_request_restarted_on_another_version() -> None:
    a = Endpoint("a", "http://a", "decode", "v1")
    b = Endpoint("b", "http://b", "decode", "v1")
    c = Endpoint("c", "http://c", "decode", "v2")
    assert _migrated(a, b, "refused") == "from a: refused"
    assert _migrated(a, c, "refused").endswith("restarted from the prompt on weights version v2")


def test_migrate_moves_every_flight_of_the_endpoint_and_only_those() -> None:
    flights = Flights()
    mine = [flights.add("a"), flights.add("a")]
    other = flights.add("b")
    assert flights.migrate("a") == 2 and all(f.moved for f in mine) and not other.moved
    for f in mine:
        flights.remove(f)
    assert flights.count("a") == 0 and flights.count("b") == 1
