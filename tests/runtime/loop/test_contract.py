"""WorkPlan and ResourceRequest: chunking a splittable plan, refusing to split an atomic one."""

from __future__ import annotations

import pytest

from loom_runtime.loop.contract import Done, ResourceRequest, WorkPlan


def token_plan(start: int, n: int) -> WorkPlan[tuple[int, int]]:
    """A splittable plan over tokens start..start+n whose work payload is its range."""
    return WorkPlan(
        kind="prefill_chunk",
        shape="token_forward",
        resources=ResourceRequest(compute_tokens=n),
        work=(start, start + n),
        split=lambda k: token_plan(start, k),
        request_id="r",
    )


def test_chunk_narrows_a_splittable_plan_to_its_first_tokens() -> None:
    plan = token_plan(10, 8)
    part = plan.chunk(3)
    assert part.resources.compute_tokens == 3
    assert part.work == (10, 13)
    assert plan.chunk(8) is plan and plan.chunk(20) is plan


def test_an_atomic_plan_cannot_be_chunked() -> None:
    plan = WorkPlan("vae_tile", ("vae", 64), ResourceRequest(compute_tokens=4), work=0)
    assert not plan.splittable
    assert plan.chunk(4) is plan
    with pytest.raises(ValueError, match="atomic"):
        plan.chunk(2)


def test_a_chunk_needs_a_token() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        token_plan(0, 4).chunk(0)


def test_negative_resources_are_refused() -> None:
    with pytest.raises(ValueError, match="cache_blocks"):
        ResourceRequest(cache_blocks=-1)


def test_plans_with_equal_shapes_are_batchable_by_equality() -> None:
    assert token_plan(0, 2).shape == token_plan(5, 9).shape
    assert Done("length") == Done("length")
