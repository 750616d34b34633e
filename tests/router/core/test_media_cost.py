"""Media routing's pure core: a request's predicted cost (DiT tokens × steps × CFG passes ×
images), the least-outstanding-work pick, and the pinned seed that makes retries reproducible."""

from __future__ import annotations

import pytest

from loom_router.core.media_cost import MediaCost, media_cost, pick_by_cost, with_seed
from loom_router.errors import BadRequestError


def test_an_image_costs_its_tokens_times_steps_passes_and_count() -> None:
    body = {"size": "64x32", "n": 3, "num_inference_steps": 10, "guidance_scale": 5.0}
    assert media_cost(body, False, 50) == MediaCost(tokens=8, steps=10, passes=2, count=3)
    assert media_cost(body, False, 50).units == 8 * 10 * 2 * 3


def test_a_video_costs_its_latent_frames_and_the_card_steps_by_default() -> None:
    # 17 frames -> 1 + 16 // 4 = 5 latent frames of 32 / 16 * 32 / 16 = 4 tokens
    assert media_cost({"size": "32x32", "num_frames": 17}, True, 8) == MediaCost(20, 8, 1, 1)
    # seconds x fps + 1 frames: 2 s at 8 fps = 17 frames, as the worker counts them
    assert media_cost({"size": "32x32", "seconds": 2, "fps": 8}, True, 8).tokens == 20
    assert media_cost({"size": "32x32", "n": 4}, True, 8).count == 1  # n is an images field


@pytest.mark.parametrize(
    "body",
    [{"size": "big"}, {"size": 7, "n": "two"}, {"num_inference_steps": -3}, {"n": True}, {}],
)
def test_fields_the_cost_cannot_read_count_as_defaults(body: dict[str, object]) -> None:
    cost = media_cost(body, False, 50)
    assert (cost.tokens, cost.steps, cost.count) == (512 * 512 // 256, 50, 1)


def test_the_pick_takes_the_least_outstanding_work_and_breaks_ties_by_id() -> None:
    assert pick_by_cost(["b", "a"], {}, 5.0) == "a"
    assert pick_by_cost(["a", "b", "c"], {"a": 100.0, "b": 10.0, "c": 10.0}, 5.0) == "b"
    assert pick_by_cost(["a", "b"], {"a": 1.0, "gone": 0.0}, 5.0) == "b"
    assert pick_by_cost([], {"a": 1.0}, 5.0) is None


def test_a_missing_seed_is_pinned_and_a_given_one_kept() -> None:
    assert with_seed({"prompt": "x"}, 7) == {"prompt": "x", "seed": 7}
    assert with_seed({"seed": 3}, 7) == {"seed": 3}
    assert with_seed({}, 2**64 + 5)["seed"] == (2**64 + 5) % 2**63
    for bad in (-1, "3", 2.5, True, 2**63):
        with pytest.raises(BadRequestError, match="seed must be an integer"):
            with_seed({"seed": bad}, 7)
