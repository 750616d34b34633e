"""Which count a role runs on Kubernetes, and where it is written back: the card's replicas
without an autoscaling section for the role (a RoleScale scaled by someone is written into the
card), the RoleScale within the card's bounds with one."""

from __future__ import annotations

import pytest

from loom_operator.fleet.autoscale import AutoscalePolicy, RoleBounds
from loom_operator.k8s.scale_rule import CARD, CLAMPED, SCALE_TARGET, ScaleView, Settled, settle

BOUNDED = AutoscalePolicy(roles={"decode": RoleBounds(1, 4)})


@pytest.mark.parametrize(
    ("card", "scale", "policy", "expected"),
    [
        # no section: a new RoleScale gets the card's count
        (2, ScaleView(None), None, Settled("decode", 2, CARD, scale_replicas=2)),
        # no section: in step, nothing to write
        (2, ScaleView(2, 3, 3), None, Settled("decode", 2, CARD)),
        # no section: the card was edited (the RoleScale is taken in): the card wins
        (3, ScaleView(2, 3, 3), None, Settled("decode", 3, CARD, scale_replicas=3)),
        # a section that does not name the role: as without one
        (3, ScaleView(2, 3, 3), AutoscalePolicy(roles={"prefill": RoleBounds(1, 2)}),
         Settled("decode", 3, CARD, scale_replicas=3)),
        # bounded: a new RoleScale starts at the card's count within the bounds
        (9, ScaleView(None), BOUNDED, Settled("decode", 4, CARD, scale_replicas=4)),
        # bounded: the RoleScale is the truth, the card's replicas only the start
        (1, ScaleView(3, 5, 5), BOUNDED, Settled("decode", 3, CARD)),
    ],
)  # fmt: skip
def test_the_count_and_the_writes_that_make_card_and_role_scale_agree(
    card: int, scale: ScaleView, policy: AutoscalePolicy | None, expected: Settled
) -> None:
    assert settle("decode", card, scale, policy) == expected


def test_kubectl_scale_without_a_section_is_written_into_the_card() -> None:
    s = settle("decode", 1, ScaleView(3, generation=4, observed_generation=3), None)
    assert (s.desired, s.reason, s.card_replicas, s.scale_replicas) == (3, SCALE_TARGET, 3, None)
    assert "spec.roles.decode.replicas" in s.message and "was 1" in s.message


def test_a_scale_to_the_card_count_itself_writes_nothing() -> None:
    s = settle("decode", 3, ScaleView(3, generation=4, observed_generation=3), None)
    assert s == Settled("decode", 3, CARD)


def test_an_hpa_asking_beyond_the_bounds_is_clamped_and_said() -> None:
    s = settle("decode", 1, ScaleView(10, generation=7, observed_generation=6), BOUNDED)
    assert (s.desired, s.reason, s.scale_replicas, s.card_replicas) == (4, CLAMPED, 4, None)
    assert "max 4" in s.message
    low = settle("decode", 1, ScaleView(0, generation=8, observed_generation=7), BOUNDED)
    assert (low.desired, low.scale_replicas) == (1, 1)


def test_a_scale_within_the_bounds_is_taken_and_never_touches_the_card() -> None:
    s = settle("decode", 1, ScaleView(3, generation=7, observed_generation=6), BOUNDED)
    assert (s.desired, s.reason, s.card_replicas, s.scale_replicas) == (3, SCALE_TARGET, None, None)
    assert "within spec.autoscaling.decode" in s.message


def test_a_role_scale_taken_in_is_not_scaled_by_someone() -> None:
    assert not ScaleView(2, 3, 3).scaled_by_someone
    assert ScaleView(2, 4, 3).scaled_by_someone
    assert ScaleView(2, 1, None).scaled_by_someone  # a restarted operator has taken nothing in
    assert not ScaleView(None, 1, None).scaled_by_someone
