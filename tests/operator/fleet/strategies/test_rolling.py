"""Rolling picks the next workers so that at most maxUnavailable are out and a same-version pair
stays routable; when it cannot, it falls back, takes a capacity gap, or says NoSafePair."""

from __future__ import annotations

from typing import Any

import pytest

from loom_operator.fleet.observed import WorkerState
from loom_operator.fleet.strategies.rolling import choose_rolling


def _fleet_state(worker: Any, spec: str) -> list[WorkerState]:
    """'P0:v1 D0:v2' -> routable workers dep-prefill-0 on v1, dep-decode-0 on v2."""
    roles = {"P": "prefill", "D": "decode", "A": "aggregated"}
    out = []
    for item in spec.split():
        key, version = item.split(":")
        out.append(worker(roles[key[0]], int(key[1:]), version))
    return out


CASES = [
    # roles, mu, routable workers, unavailable, held -> chosen, taken, blocked
    ({"prefill": 2, "decode": 2}, 1, "P0:v1 D0:v1 P1:v1 D1:v1", "", 0, "dep-prefill-0", "safe", ""),
    (
        {"prefill": 2, "decode": 2},
        2,
        "P0:v1 D0:v1 P1:v1 D1:v1",
        "",
        0,
        "dep-prefill-0 dep-decode-0",
        "safe",
        "",
    ),
    # P0 is on v2 already: taking P1 would leave no v1 prefill for the v1 decodes, so D0 goes
    ({"prefill": 2, "decode": 2}, 1, "P0:v2 D0:v1 P1:v1 D1:v1", "", 0, "dep-decode-0", "safe", ""),
    ({"prefill": 2, "decode": 2}, 1, "P0:v1 D0:v1 P1:v1", "dep-decode-1", 0, "", "", ""),
    (
        {"prefill": 2, "decode": 2},
        2,
        "P0:v2 D0:v2 P1:v1 D1:v1",
        "",
        0,
        "dep-prefill-1 dep-decode-1",
        "safe",
        "",
    ),
    # a worker is out already: with mu 1 nothing else goes, whatever the pairs
    ({"prefill": 2, "decode": 2}, 1, "D0:v1 P1:v1 D1:v1", "dep-prefill-0", 1, "", "", ""),
    # 1P+1D: no order keeps a pair; the pair goes together (capacity gap), past mu
    ({"prefill": 1, "decode": 1}, 1, "P0:v1 D0:v1", "", 0, "dep-prefill-0 dep-decode-0", "gap", ""),
    ({"aggregated": 1}, 1, "A0:v1", "", 0, "dep-aggregated-0", "gap", ""),
    # 1P+1D with the prefill dead: wait for it rather than leave nothing serving
    ({"prefill": 1, "decode": 1}, 2, "D0:v1", "dep-prefill-0", 0, "", "", "NoSafePair"),
    # 1P+2D: a decode first (safe), then the prefill only by falling back to decode-only
    ({"prefill": 1, "decode": 2}, 1, "P0:v1 D0:v1 D1:v1", "", 0, "dep-decode-0", "safe", ""),
    ({"prefill": 1, "decode": 2}, 1, "P0:v1 D0:v2 D1:v1", "", 0, "dep-prefill-0", "fallback", ""),
    # 2P+1D, prefills done: the only decode has to go, alone (capacity gap)
    ({"prefill": 2, "decode": 1}, 1, "P0:v2 P1:v2 D0:v1", "", 0, "dep-decode-0", "gap", ""),
    # 2P+2D with a decode dead: the last v1 decode cannot go, and waiting is the safe thing
    ({"prefill": 2, "decode": 2}, 2, "P0:v2 P1:v2 D0:v1", "dep-decode-1", 0, "", "", "NoSafePair"),
    (
        {"aggregated": 4},
        3,
        "A0:v1 A1:v1 A2:v1 A3:v1",
        "",
        0,
        "dep-aggregated-0 dep-aggregated-1 dep-aggregated-2",
        "safe",
        "",
    ),
    ({"decode": 2}, 1, "D0:v1 D1:v1", "", 0, "dep-decode-0", "safe", ""),
]


@pytest.mark.parametrize(
    ("roles", "mu", "routable", "unavailable", "held", "chosen", "taken", "blocked"), CASES
)
def test_choose_rolling(
    fleet: Any,
    worker: Any,
    roles: dict[str, int],
    mu: int,
    routable: str,
    unavailable: str,
    held: int,
    chosen: str,
    taken: str,
    blocked: str,
) -> None:
    desired = fleet(roles, mu=mu)
    serving = _fleet_state(worker, routable)
    candidates = [w for w in serving if w.weights_version != "v2"]
    choice = choose_rolling(desired, serving, candidates, tuple(unavailable.split()), held)
    assert choice.chosen == tuple(chosen.split())
    assert (choice.taken, choice.blocked) == (taken, blocked)


def test_no_safe_pair_names_what_it_waits_for(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 2, "decode": 2}, mu=2)
    serving = _fleet_state(worker, "P0:v2 P1:v2 D0:v1")
    choice = choose_rolling(desired, serving, serving[2:], ("dep-decode-1",), 0)
    assert "dep-decode-0" in choice.message and "waiting for dep-decode-1" in choice.message


def test_nothing_to_sync_chooses_nothing(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 1, "decode": 1})
    serving = _fleet_state(worker, "P0:v2 D0:v2")
    assert choose_rolling(desired, serving, [], (), 0).chosen == ()
