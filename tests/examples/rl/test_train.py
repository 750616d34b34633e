"""The RL example (examples/rl/) against a real `loom up` P/D fleet of its own card: with a push
after every step the mean reward rises far above the control's (the same run without pushes),
which stays flat; no rollout fails, every rollout carries the version of the step that sampled
it, and with pushes the fleet's log-probs equal the trainer's own forward at every step."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from examples.rl.fleet import Fleet, connect
from examples.rl.train import CARD, PROMPTS, Settings, StepRecord, run

from loom_operator.testing.fleet import run_fleet
from loom_runtime.models.tiny import init_tiny

STEPS = 7
SETTINGS = Settings(steps=STEPS, group=8, max_tokens=12, lr=2e-2, seed=0, prompts=PROMPTS[:3])
SAME_WEIGHTS = 1e-4
"""The largest |trainer − fleet| log-prob of a sampled token when both hold the same float64
weights: ~1e-7 here (transformers' RMSNorm computes in float32 even in a float64 model), while
one optimizer step moves log-probs by ~1e-1."""


def late(records: Sequence[StepRecord]) -> float:
    """Mean reward of the last two steps."""
    return statistics.mean(r.reward for r in records[-2:])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, child_env: dict[str, str]) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("rl")
    with run_fleet(CARD, root / "state", child_env) as f:
        yield connect(f.state.root)


def test_the_reward_rises_with_pushes_and_the_control_stays_flat(
    fleet: Fleet, tmp_path: Path
) -> None:
    checkpoint = init_tiny(tmp_path / "tiny", seed=0)
    control = run(fleet, checkpoint, replace(SETTINGS, push=False, run="control"))
    pushed = run(fleet, checkpoint, replace(SETTINGS, run="push"))
    for records in (control, pushed):
        assert [(r.failed, r.wrong_version) for r in records] == [(0, 0)] * STEPS
        assert all(r.rollouts == len(SETTINGS.prompts) * SETTINGS.group for r in records)
    assert [r.version for r in pushed] == [f"push-{s}" for s in range(STEPS)]
    assert [r.version for r in control] == ["control-0"] * STEPS
    assert max(r.policy_gap for r in pushed) < SAME_WEIGHTS  # the fleet serves the trainer's
    assert control[0].policy_gap < SAME_WEIGHTS < control[-1].policy_gap  # the fleet stayed
    curves = ([r.reward for r in pushed], [r.reward for r in control])
    assert late(pushed) > late(control) + 0.2, curves
    assert late(pushed) > pushed[0].reward + 0.2, curves
    assert abs(late(control) - control[0].reward) < 0.1, curves
