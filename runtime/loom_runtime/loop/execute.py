"""Executing one step's plans: every plan goes to the executor of its shape, one call per shape.

Owns the grouping and the order of results only; never schedules, samples or changes a loop's
state (the batcher advances each loop with its result afterwards).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from loom_runtime.errors import LoomError
from loom_runtime.loop.contract import Executor, WorkPlan

ResultT = TypeVar("ResultT")


class NoExecutorError(LoomError):
    """A plan's shape has no executor registered: the loop asked for work this engine cannot do."""


def execute_plans(
    plans: Sequence[WorkPlan[ResultT]], executors: Mapping[Hashable, Executor[ResultT]]
) -> list[ResultT]:
    """Run `plans` (one step's batch) and return their results in the same order.

    Plans of equal shape run together in one `execute` call of that shape's executor, in the
    order they were given; shapes run in the order of their first plan.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, plan in enumerate(plans):
        if plan.shape not in executors:
            raise NoExecutorError(
                f"plan {plan.kind!r} of request {plan.request_id!r} has shape {plan.shape!r}, "
                f"and this engine executes only {sorted(map(repr, executors))}"
            )
        groups.setdefault(plan.shape, []).append(i)
    results: dict[int, ResultT] = {}
    for shape, indices in groups.items():
        got = executors[shape].execute([plans[i] for i in indices])
        if len(got) != len(indices):
            raise ValueError(
                f"the executor of shape {shape!r} returned {len(got)} results for "
                f"{len(indices)} plans"
            )
        results.update(zip(indices, got, strict=True))
    return [results[i] for i in range(len(plans))]
