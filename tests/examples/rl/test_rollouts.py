"""Every rollout of a run has its own seed: a group is separate seeded requests."""

from __future__ import annotations

from examples.rl.rollouts import seed_of


def test_seeds_differ_across_steps_prompts_and_group_members() -> None:
    seeds = [seed_of(0, s, p, m) for s in range(50) for p in range(8) for m in range(16)]
    assert len(set(seeds)) == len(seeds)
    assert seed_of(0, 3, 1, 2) != seed_of(1, 3, 1, 2)
