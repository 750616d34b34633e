"""What the MoT denoise lane's tests share: the tiny image config, a float64 engine with a
small step budget, request builders, a recorder of outputs, and the float64 reference's drawing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from tests.runtime.models.mot.reference import ReferenceMot

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.shared_step_thread import SharedStepThread
from loom_runtime.engine.types import DrawSpec, EngineRequest, RequestOutput, SamplingParams
from loom_runtime.models.loader import LoadedModel, read_weights

IMAGE = {"latent_channels": 3, "patch_size": 2, "frequency_dim": 32}
BUDGET = 24  # tokens per step: a 4x8 latent (8 tokens) and a prefill chunk share one


def engine(
    loaded: LoadedModel,
    prefix_caching: bool = True,
    batch_invariant: bool = False,
    shared_thread: SharedStepThread | None = None,
) -> Engine:
    config = EngineConfig(
        dtype=loaded.model.dtype,
        max_model_len=128,
        num_blocks=48,
        block_size=4,
        max_num_batched_tokens=BUDGET,
        prefix_caching=prefix_caching,
        batch_invariant=batch_invariant,
    )
    return Engine(loaded, config, shared_thread=shared_thread)


def chat(rid: str, prompt: Sequence[int], tokens: int) -> EngineRequest:
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(rid, tuple(prompt), sampling)


def draw(rid: str, prompt: Sequence[int], think: int, spec: DrawSpec) -> EngineRequest:
    return EngineRequest(rid, tuple(prompt), chat(rid, prompt, think).sampling, draw=spec)


class Finals:
    """on_output for many requests: every output by request id."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[RequestOutput]] = {}

    def __call__(self, out: RequestOutput) -> None:
        self.outputs.setdefault(out.request_id, []).append(out)

    def tokens(self, rid: str) -> list[int]:
        return [t for o in self.outputs.get(rid, []) for t in o.new_token_ids]

    def final(self, rid: str) -> RequestOutput:
        out = self.outputs[rid][-1]
        assert out.finished and sum(o.finished for o in self.outputs[rid]) == 1
        return out


def reference_of(checkpoint: Path) -> ReferenceMot:
    config = json.loads((checkpoint / "config.json").read_text())
    return ReferenceMot(read_weights(checkpoint), config)


def reference_latents(checkpoint: Path, context: list[int], req: EngineRequest) -> torch.Tensor:
    """The request's drawing by the float64 reference: Euler steps from its seeded noise, each
    velocity conditioned on `context` (recomputed from the tokens)."""
    reference = reference_of(checkpoint)
    assert req.draw is not None
    return reference_drawing([(reference, reference)] * req.draw.num_steps, context, req)


def reference_drawing(
    steps: Sequence[tuple[ReferenceMot, ReferenceMot]], context: list[int], req: EngineRequest
) -> torch.Tensor:
    """The request's drawing by the float64 reference, step i's velocity by `steps[i][0]`'s
    weights over `context`'s text KV by `steps[i][1]`'s (weights swapped under a drawing)."""
    assert req.draw is not None
    gen = torch.Generator().manual_seed(req.draw.seed)
    x = torch.randn(3, req.draw.height, req.draw.width, generator=gen, dtype=torch.float64)
    n = req.draw.num_steps
    for i, (weights, text_of) in enumerate(steps):
        t, t_next = 1 - i / n, 1 - (i + 1) / n
        x = x + (t_next - t) * weights.velocity(context, x, t, text_of)
    return x
