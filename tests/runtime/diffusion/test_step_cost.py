"""The online step cost model: its fit converges to a known linear cost (noisy or not) and follows
a change; one batch size seen scales the prior; an unseen signature takes its kind's fit, an
unseen kind the prior; the keys are a bounded LRU; a step's loads of one key share a fixed cost."""

from __future__ import annotations

import random

import pytest

from loom_runtime.diffusion.step_cost import (
    DEFAULT_PRIOR,
    StepCost,
    StepCostModel,
    StepLoad,
    StepSample,
)

SIG = (1, 4, 1, 8, 8)


def feed(model: StepCostModel, cost: StepCost, sizes: list[int], noise: float = 0.0) -> None:
    rng = random.Random(0)
    for n in sizes:
        jitter = 1 + rng.uniform(-noise, noise)
        model.observe(StepSample("denoise", SIG, n, cost.seconds(n) * jitter))


@pytest.mark.parametrize(
    ("fixed", "per_item", "noise", "tolerance"),
    [(0.004, 0.002, 0.0, 1e-9), (0.0, 0.003, 0.0, 1e-9), (0.02, 0.001, 0.05, 0.15)],
    ids=["exact", "no-fixed-cost", "5%-noise"],
)
def test_the_fit_converges_to_a_known_linear_cost(
    fixed: float, per_item: float, noise: float, tolerance: float
) -> None:
    model = StepCostModel()
    truth = StepCost(fixed, per_item)
    feed(model, truth, [1, 2, 4, 8, 16, 3, 5] * 20, noise)
    got = model.cost("denoise", SIG)
    assert got.per_item_s == pytest.approx(per_item, rel=tolerance, abs=1e-12)
    assert got.fixed_s == pytest.approx(fixed, abs=tolerance * (fixed + per_item * 8))
    assert model.predict(StepLoad("denoise", SIG, 10)) == pytest.approx(
        truth.seconds(10), rel=tolerance
    )


def test_the_fit_follows_a_change_in_cost_within_a_few_dozen_samples() -> None:
    model = StepCostModel(decay=0.1)
    feed(model, StepCost(0.01, 0.01), [1, 2, 4, 8] * 25)
    feed(model, StepCost(0.002, 0.001), [1, 2, 4, 8] * 15)
    got = model.cost("denoise", SIG)
    assert got.per_item_s == pytest.approx(0.001, rel=0.05)
    assert got.fixed_s == pytest.approx(0.002, rel=0.2)


def test_one_batch_size_seen_scales_the_priors_split_of_fixed_and_per_item() -> None:
    model = StepCostModel(prior=StepCost(0.01, 0.01))  # half fixed at one item
    feed(model, StepCost(0.0, 0.08), [1] * 5)  # 80 ms at one item
    got = model.cost("denoise", SIG)
    assert (got.fixed_s, got.per_item_s) == pytest.approx((0.04, 0.04))
    through_origin = StepCostModel(prior=StepCost(0.0, 0.5))
    feed(through_origin, StepCost(0.0, 0.08), [4] * 5)  # 320 ms at four items
    got = through_origin.cost("denoise", SIG)
    assert (got.fixed_s, got.per_item_s) == pytest.approx((0.0, 0.08))


def test_coefficients_never_go_negative() -> None:
    model = StepCostModel()
    for n, seconds in [(1, 0.05), (2, 0.04), (4, 0.03), (8, 0.02)]:  # cheaper when bigger
        model.observe(StepSample("denoise", SIG, n, seconds))
    slope_clamped = model.cost("denoise", SIG)
    assert slope_clamped.per_item_s == 0 and slope_clamped.fixed_s > 0
    model = StepCostModel()
    for n, seconds in [(1, 0.0), (2, 0.0), (8, 0.1), (16, 0.3)]:  # a negative intercept
        model.observe(StepSample("vae_decode", SIG, n, seconds))
    intercept_clamped = model.cost("vae_decode", SIG)
    assert intercept_clamped.fixed_s == 0 and intercept_clamped.per_item_s > 0


def test_an_unseen_signature_takes_its_kinds_fit_and_an_unseen_kind_the_prior() -> None:
    model = StepCostModel(prior=StepCost(0.5, 0.25))
    assert model.cost("denoise", SIG) == StepCost(0.5, 0.25)
    feed(model, StepCost(0.001, 0.002), [1, 2, 3, 4] * 10)
    other = (1, 4, 3, 16, 16)
    assert model.cost("denoise", other) == model.cost("denoise", SIG)
    assert model.cost("text_encode", SIG) == StepCost(0.5, 0.25)
    [kind] = model.kinds()
    assert (kind.kind, kind.samples) == ("denoise", 40)
    assert kind.cost.per_item_s == pytest.approx(0.002)


def test_the_keys_are_a_bounded_lru_of_the_most_recently_measured() -> None:
    model = StepCostModel(max_keys=3, max_kinds=2)
    for i in range(5):
        model.observe(StepSample("denoise", (i,), 1, 0.1 * (i + 1)))
    assert len(model) == 3
    model.observe(StepSample("denoise", (2,), 1, 0.3))  # (2,) is now the most recent
    model.observe(StepSample("denoise", (5,), 1, 0.6))  # evicts (3,), not (2,)
    kind_fit = model.cost("denoise", (99,))
    assert model.cost("denoise", (3,)) == kind_fit  # forgotten: falls back to the kind
    assert model.cost("denoise", (2,)).seconds(1) == pytest.approx(0.3)
    for kind in ("a", "b", "c"):
        model.observe(StepSample(kind, (0,), 1, 1.0))
    assert [k.kind for k in model.kinds()] == ["b", "c"] and len(model) == 3


def test_a_steps_loads_of_one_key_share_one_fixed_cost() -> None:
    model = StepCostModel(prior=StepCost(1.0, 0.5))
    one, two = StepLoad("denoise", SIG, 2), StepLoad("denoise", SIG, 1)
    other = StepLoad("denoise", (9,), 1)
    assert model.predict_step([]) == 0
    assert model.predict_step([one, two]) == pytest.approx(1.0 + 0.5 * 3)
    assert model.predict_step([one, other]) == pytest.approx(2.0 + 0.5 * 3)


@pytest.mark.parametrize(
    ("items", "seconds"), [(0, 0.1), (1, -0.1), (1, float("nan")), (1, float("inf"))]
)
def test_a_sample_that_is_not_a_measurement_is_refused(items: int, seconds: float) -> None:
    with pytest.raises(ValueError, match="step"):
        StepSample("denoise", SIG, items, seconds)


def test_the_default_prior_is_optimistic_and_has_no_fixed_cost() -> None:
    assert DEFAULT_PRIOR.fixed_s == 0 and 0 < DEFAULT_PRIOR.per_item_s <= 0.01
