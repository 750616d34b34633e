"""A small GRPO trainer in plain torch that uses a Loom fleet (`loom up`, prefill + decode) as
its rollout engine: each step it samples a group of completions per prompt through the OpenAI
API, rewards them, takes one optimizer step on its own copy of the weights (`transformers`'
LlamaForCausalLM) and pushes the new weights into the fleet with `loom_trainer` (mode barrier).

Usage, from the repository root (examples/rl/README.md says more):
    .venv/bin/python -m examples.rl.train                 # starts loom up examples/rl/card.yaml
    .venv/bin/python -m examples.rl.train --no-push       # the control: the fleet never learns
    .venv/bin/python -m examples.rl.train --connect .loom/rl   # a `loom up` already running
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from examples.rl.fleet import Fleet, connect, started
from examples.rl.grpo import group_advantages, policy_loss, punctuation_ids, reward, token_logprobs
from examples.rl.rollouts import Rollout, Sampling, sample_groups
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from loom_trainer import WeightSync

CARD = Path(__file__).resolve().parent / "card.yaml"
PROMPTS = ("Once upon a time", "The weights of a model", "A fleet of workers", "Hello there")


@dataclass(frozen=True)
class Settings:
    """One run of the example (the defaults are what docs/benchmarks.md records)."""

    steps: int = 10
    group: int = 8
    """Completions per prompt: one GRPO group."""
    max_tokens: int = 16
    lr: float = 2e-2
    seed: int = 0
    push: bool = True
    """False: the control; the fleet keeps the starting weights while the trainer trains."""
    run: str = "rl"
    """The version prefix: the fleet serves `{run}-{step}` (new to the fleet on every run)."""
    prompts: tuple[str, ...] = PROMPTS
    model: str = "tiny"
    concurrency: int = 16


@dataclass(frozen=True)
class StepRecord:
    """What one step saw and did."""

    step: int
    version: str
    """The weights version the step's rollouts must carry."""
    reward: float
    """Mean reward of the step's rollouts."""
    rollouts: int
    failed: int
    wrong_version: int
    """Rollouts whose x-loom-weights-version or system_fingerprint is not `version`."""
    policy_gap: float
    """Largest |trainer log-prob − fleet log-prob| of a sampled token: ~0 when the fleet serves
    exactly the trainer's weights."""
    loss: float
    sample_s: float
    """Sampling the step's rollouts through the fleet."""
    train_s: float
    """The trainer's forward, backward and optimizer step."""
    push_s: float
    """The push after the step (0 when nothing was pushed)."""


def load_policy(checkpoint: Path) -> tuple[LlamaForCausalLM, frozenset[str]]:
    """The trainer's copy of the weights, in float64 as the fleet computes, and the names of the
    tensors a push sends (the checkpoint's: what the fleet's model reads)."""
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float64)
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        names = frozenset(f.keys())
    return model, names


def weights(model: torch.nn.Module, names: frozenset[str]) -> dict[str, torch.Tensor]:
    return {n: t for n, t in model.state_dict().items() if n in names}


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rollouts: Sequence[Rollout],
    target: frozenset[int],
) -> tuple[float, float, float]:
    """One GRPO step on the rollouts that came back: (mean reward, loss, policy gap)."""
    ok = [r for r in rollouts if r.ok]
    if not ok:
        raise RuntimeError(f"every rollout failed, e.g. {rollouts[0].error}")
    rewards = [reward(r.token_ids, target) for r in ok]
    advantages = [0.0] * len(ok)
    for prompt in {r.prompt for r in ok}:
        members = [i for i, r in enumerate(ok) if r.prompt == prompt]
        for i, a in zip(members, group_advantages([rewards[i] for i in members]), strict=True):
            advantages[i] = a
    logps = token_logprobs(model, [r.prompt_ids for r in ok], [r.token_ids for r in ok])
    behaviour = [
        torch.tensor(r.logprobs, dtype=logp.dtype) for r, logp in zip(ok, logps, strict=True)
    ]
    gap = max(float((lp.detach() - b).abs().max()) for lp, b in zip(logps, behaviour, strict=True))
    loss = policy_loss(logps, behaviour, advantages)
    optimizer.zero_grad()
    torch.autograd.backward(loss)
    optimizer.step()
    return sum(rewards) / max(len(rewards), 1), float(loss.detach()), gap


def run(
    fleet: Fleet,
    checkpoint: Path,
    settings: Settings,
    on_step: Callable[[StepRecord], None] = lambda r: None,
) -> list[StepRecord]:
    """Train for `settings.steps` steps with `fleet` as the rollout engine.

    The run first pushes its starting weights as `{run}-0`, so every rollout's version names the
    trainer weights that sampled it; then, with `push`, it pushes `{run}-{step + 1}` after each
    step (the fleet ends serving the trained weights).
    """
    torch.manual_seed(settings.seed)
    model, names = load_policy(checkpoint)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    target = punctuation_ids(Tokenizer.from_file(str(checkpoint / "tokenizer.json")))
    sync = WeightSync.connect(fleet.weights_url, fleet.token)
    version = f"{settings.run}-0"
    sync.push(weights(model, names), version, mode="barrier")
    how = Sampling(settings.model, settings.max_tokens)
    records = []
    for step in range(settings.steps):
        sampled_by = version
        t0 = time.monotonic()
        rollouts = sample_groups(fleet.endpoint, how, settings.prompts, settings.group,
                                 settings.seed, step, settings.concurrency)  # fmt: skip
        t1 = time.monotonic()
        mean_reward, loss, gap = train_step(model, optimizer, rollouts, target)
        t2 = time.monotonic()
        wrong = sum(1 for r in rollouts if r.ok and {r.version, r.fingerprint} != {sampled_by})
        push_s = 0.0
        if settings.push:
            version = f"{settings.run}-{step + 1}"
            push_s = sync.push(weights(model, names), version, mode="barrier").total_s
        failed = sum(1 for r in rollouts if not r.ok)
        record = StepRecord(step, sampled_by, mean_reward, len(rollouts), failed, wrong, gap,
                            loss, t1 - t0, t2 - t1, push_s)  # fmt: skip
        records.append(record)
        on_step(record)
    return records


def tiny_checkpoint(directory: Path) -> Path:
    """The checkpoint of `loom://tiny` (the card's source): `loom model init-tiny` writes the
    same bytes on every machine."""
    argv = [sys.executable, "-m", "loom_operator.cli", "model", "init-tiny", str(directory)]
    subprocess.run(argv, check=True, capture_output=True)
    return directory


def print_step(r: StepRecord) -> None:
    print(
        f"step {r.step:3d}  version {r.version:<12} reward {r.reward:.3f}  loss {r.loss:+.4f}  "
        f"policy gap {r.policy_gap:.1e}  failed {r.failed}  wrong version {r.wrong_version}  "
        f"sample {r.sample_s:.1f}s  train {r.train_s:.1f}s  push {r.push_s:.1f}s",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=Settings.steps)
    p.add_argument("--group", type=int, default=Settings.group, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=Settings.max_tokens)
    p.add_argument("--lr", type=float, default=Settings.lr)
    p.add_argument("--seed", type=int, default=Settings.seed)
    p.add_argument("--no-push", action="store_true", help="the control: never push")
    p.add_argument("--run", default=f"rl{int(time.time())}", help="version prefix (new per run)")
    p.add_argument("--connect", type=Path, metavar="STATE_DIR", help="a running `loom up`")
    p.add_argument("--card", type=Path, default=CARD, help="the card to start (no --connect)")
    p.add_argument("--checkpoint", type=Path, help="the trainer's starting weights (loom://tiny)")
    p.add_argument("--json", type=Path, help="write the settings and every step here")
    args = p.parse_args(argv)
    settings = Settings(args.steps, args.group, args.max_tokens, args.lr, args.seed,
                        not args.no_push, args.run)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="loom-rl-") as tmp:
        checkpoint = args.checkpoint or tiny_checkpoint(Path(tmp) / "tiny")
        if args.connect is not None:
            records = run(connect(args.connect), checkpoint, settings, print_step)
        else:
            with started(args.card, Path(tmp) / "state") as fleet:
                records = run(fleet, checkpoint, settings, print_step)
    if args.json is not None:
        doc = {"settings": dataclasses.asdict(settings), "steps": [dataclasses.asdict(r)
               for r in records]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    bad = sum(r.failed + r.wrong_version for r in records)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
