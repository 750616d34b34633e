"""The weight-sync strategies by the name a DeploymentCard gives (`weightSync.strategy`).

Owns the one table from name to strategy; never branches on a name (callers ask the strategy).
"""

from __future__ import annotations

from collections.abc import Mapping

from loom_operator.fleet.strategies.barrier import Barrier
from loom_operator.fleet.strategies.contract import SyncStrategy
from loom_operator.fleet.strategies.keep import Keep
from loom_operator.fleet.strategies.rolling import Rolling

STRATEGIES: Mapping[str, SyncStrategy] = {s.name: s for s in (Rolling(), Barrier(), Keep())}
"""A new strategy is one module in this package and one entry here (and a card value)."""


class UnknownStrategy(LookupError):
    """A strategy name no module implements (the card allows a value nothing registered)."""


def strategy_named(name: str) -> SyncStrategy:
    """The strategy the card or a persisted sync record names; UnknownStrategy if none."""
    try:
        return STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise UnknownStrategy(
            f"weightSync.strategy {name!r} has no implementation (known: {known}); register "
            "it in loom_operator/fleet/strategies/registry.py"
        ) from None
