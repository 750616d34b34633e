"""The two ways bench/composite.py serves think-then-draw and chat requests: one engine over a
MoT card's ModelInstance (shared), or a writer and a painter engine, each with its own copy of
the weights (separate); the requests and the closed loop that keeps C of them in flight.

Owns those arrangements and the load they get; never measures time or memory (composite.py does).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from loom_runtime.card import load_model_card
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import DrawSpec, EngineRequest, RequestOutput, SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.serve.program_worker import engine_from_instance

Output = tuple[tuple[int, ...], torch.Tensor | None, tuple[int, ...]]
"""A request's thought (or chat), its latents (None: a chat), the token its draw began with."""
Done = Callable[[str, Output], None]


@dataclass(frozen=True)
class Workload:
    think: int  # thought tokens (and a chat's tokens), ignore_eos: every request the same work
    side: int  # latent height and width
    steps: int  # denoise steps
    prompt: int  # prompt tokens


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: tuple[int, ...]
    draw: DrawSpec | None  # None: a chat


def make_jobs(w: Workload, n: int, tag: str, seed: int) -> list[Job]:
    """n jobs with fresh prompts (no prefix hits), images and chats alternately."""
    gen = torch.Generator().manual_seed(seed)
    jobs = []
    for i in range(n):
        prompt = tuple(int(t) for t in torch.randint(10, 4000, (w.prompt,), generator=gen))
        draw = DrawSpec(w.side, w.side, w.steps, seed=seed * 1000 + i) if i % 2 == 0 else None
        jobs.append(Job(f"{tag}-{i}", prompt, draw))
    return jobs


class Finished(OutputCollector):
    """A collector that calls `then` with itself when the final output arrives."""

    def __init__(self, req: EngineRequest, then: Callable[[OutputCollector], None]) -> None:
        super().__init__(req)
        self.then = then

    def __call__(self, out: RequestOutput) -> None:
        super().__call__(out)
        if out.finished:
            self.then(self)


def tokens(c: OutputCollector) -> tuple[int, ...]:
    return tuple(t for o in c.outputs for t in o.new_token_ids)


class Shared:
    """One engine over the card's ModelInstance: think and draw in one request."""

    def __init__(self, card: Path, config: EngineConfig, w: Workload) -> None:
        self.engine = engine_from_instance(load_model_card(card), card, config)
        self.engines = [self.engine]
        self.w = w

    def models(self) -> dict[str, object]:
        return self.engine.loop_models()

    def submit(self, job: Job, done: Done) -> None:
        sampling = SamplingParams(max_tokens=self.w.think, temperature=0.0, ignore_eos=True)
        req = EngineRequest(job.request_id, job.prompt, sampling, draw=job.draw)

        def then(c: OutputCollector) -> None:
            toks = tokens(c)
            done(job.request_id, (toks, c.outputs[-1].latents, toks[-1:]))

        self.engine.add_request(req, Finished(req, then))


class Separate:
    """A writer engine and a painter engine, each with its own copy of the weights."""

    def __init__(self, ckpt: Path, config: EngineConfig, w: Workload) -> None:
        self.writer = Engine(load_model(ckpt, dtype=config.dtype), config)
        self.painter = Engine(load_model(ckpt, dtype=config.dtype), config)
        self.engines = [self.writer, self.painter]
        self.w = w

    def models(self) -> dict[str, object]:
        return {
            "text": self.writer.loop_models()["text"],
            "denoise": self.painter.loop_models()["denoise"],
        }

    def submit(self, job: Job, done: Done) -> None:
        sampling = SamplingParams(max_tokens=self.w.think, temperature=0.0, ignore_eos=True)
        req = EngineRequest(job.request_id, job.prompt, sampling)

        def thought(c: OutputCollector) -> None:
            thought = tokens(c)
            if job.draw is None:
                done(job.request_id, (thought, None, ()))
            else:
                self._paint(job, thought, done)

        self.writer.add_request(req, Finished(req, thought))

    def _paint(self, job: Job, thought: tuple[int, ...], done: Done) -> None:
        """The painter's prefill recomputes the prompt and the thought but its last token (the
        KV the writer's loop computed); its one greedy token is that last token."""
        sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        req = EngineRequest(job.request_id, job.prompt + thought[:-1], sampling, draw=job.draw)

        def painted(c: OutputCollector) -> None:
            done(job.request_id, (thought, c.outputs[-1].latents, tokens(c)))

        self.painter.add_request(req, Finished(req, painted))


Arrangement = Shared | Separate


def closed_loop(arr: Arrangement, jobs: Sequence[Job], c: int) -> dict[str, Output]:
    """C requests in flight until all are done; the outputs by request id."""
    got: queue.Queue[tuple[str, Output]] = queue.Queue()
    pending = iter(jobs)
    images = {j.request_id for j in jobs if j.draw is not None}

    def submit() -> None:
        job = next(pending, None)
        if job is not None:
            arr.submit(job, lambda rid, out: got.put((rid, out)))

    for _ in range(c):
        submit()
    outputs: dict[str, Output] = {}
    for _ in jobs:
        rid, out = got.get(timeout=600)
        if rid in images and out[1] is None:
            raise RuntimeError(f"{rid}: no image (aborted)")
        outputs[rid] = out
        submit()
    return outputs
