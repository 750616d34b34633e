"""The load a profile drives one worker with, over its OpenAI HTTP API: rounds of long prompts
answered with one token, and streaming greedy decodes held at a concurrency.

Owns sending the requests and timing them; never decides what a measurement means
(`profile.decide` does).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from loom_operator.profile.decide import DecodeLevel, PrefillRound, percentile
from loom_operator.profile.prompts import POOL_TEXT, prompt_ids, token_pool

REQUEST_TIMEOUT_S = 600.0


class LoadError(RuntimeError):
    """The worker refused or broke a request; the message says which and what it answered."""


@dataclass(frozen=True)
class Target:
    """The worker under load: its base URL (no /v1) and the model name it serves."""

    url: str
    model: str


@dataclass(frozen=True)
class Answer:
    """One answered request: its prompt and generated token counts, and for a stream the gaps
    between its successive tokens (s)."""

    prompt_tokens: int
    generated_tokens: int
    gaps: tuple[float, ...] = ()


class Driver:
    """Requests against one worker over one HTTP session, each prompt numbered apart."""

    def __init__(self, session: aiohttp.ClientSession, target: Target) -> None:
        self._session = session
        self._target = target
        self._pool: tuple[int, ...] = ()
        self._sent = 0

    async def prepare(self) -> int:
        """Read the worker's token ids of the pool text (what every prompt is made of); its
        context length (`max_model_len`)."""
        body = {"model": self._target.model, "prompt": POOL_TEXT}
        async with self._session.post(f"{self._target.url}/tokenize", json=body) as r:
            data = await _json(r, "/tokenize")
        self._pool = token_pool(data["tokens"])
        return int(data["max_model_len"])

    def _prompt(self, length: int) -> list[int]:
        self._sent += 1
        return prompt_ids(self._pool, self._sent, length)

    def _body(self, length: int, max_tokens: int, stream: bool) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self._target.model, "prompt": self._prompt(length), "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": stream,
        }  # fmt: skip
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def complete(self, length: int, max_tokens: int) -> Answer:
        """One plain completion of a `length`-token prompt."""
        url = f"{self._target.url}/v1/completions"
        async with self._session.post(url, json=self._body(length, max_tokens, False)) as r:
            usage = (await _json(r, "/v1/completions"))["usage"]
        return Answer(usage["prompt_tokens"], usage["completion_tokens"])

    async def stream(self, length: int, max_tokens: int) -> Answer:
        """One streamed completion, timing each chunk that carries a token."""
        url = f"{self._target.url}/v1/completions"
        stamps: list[float] = []
        usage: dict[str, int] = {}
        async with self._session.post(url, json=self._body(length, max_tokens, True)) as r:
            if r.status != 200:
                await _json(r, "/v1/completions (stream)")
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data:"))
                if event.get("choices"):
                    stamps.append(time.monotonic())
                usage = event.get("usage") or usage
        if not usage:
            raise LoadError(f"{url}: a stream ended without its usage")
        gaps = tuple(b - a for a, b in itertools.pairwise(stamps))
        return Answer(usage["prompt_tokens"], usage["completion_tokens"], gaps)


async def _json(r: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
    text = await r.text()
    if r.status != 200:
        raise LoadError(f"{what} answered {r.status}: {text[:500]}")
    data: dict[str, Any] = json.loads(text)
    return data


async def _closed_loop(
    concurrency: int, seconds: float, send: Callable[[], Awaitable[Answer]]
) -> tuple[list[Answer], float]:
    """`concurrency` clients, each sending its next request as its last is answered, until
    `seconds` pass; the answers and the time until the last one came."""
    start = time.monotonic()
    deadline = start + seconds
    answers: list[Answer] = []

    async def client() -> None:
        while time.monotonic() < deadline:
            answers.append(await send())

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return answers, time.monotonic() - start


async def prefill_round(
    driver: Driver, concurrency: int, prompt_tokens: int, seconds: float
) -> PrefillRound:
    """Long prompts, one output token each, kept `concurrency` deep for `seconds`."""
    answers, took = await _closed_loop(
        concurrency, seconds, lambda: driver.complete(prompt_tokens, 1)
    )
    total = sum(a.prompt_tokens for a in answers)
    return PrefillRound(concurrency, len(answers), total, took)


async def decode_level(
    driver: Driver, concurrency: int, prompt_tokens: int, output_tokens: int, seconds: float
) -> DecodeLevel:
    """Short prompts with long streamed outputs, kept `concurrency` deep for `seconds`."""
    answers, took = await _closed_loop(
        concurrency, seconds, lambda: driver.stream(prompt_tokens, output_tokens)
    )
    gaps: Sequence[float] = [g for a in answers for g in a.gaps]
    generated = sum(a.generated_tokens for a in answers)
    return DecodeLevel(concurrency, len(answers), generated, took, 1000 * percentile(gaps, 0.9))
