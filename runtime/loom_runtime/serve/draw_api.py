"""The think-then-draw route of a worker serving a card with a program: POST
/v1/images/generations runs the program (think in text, then draw attending to that text's KV)
and answers OpenAI's images shape: the image as a b64 PNG, the thought as `revised_prompt`.

Owns turning a body into one program request and its output into the reply; never maps errors to
statuses (errors.py does) and never blocks the event loop (encoding runs on a worker thread).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from aiohttp import web

from loom_runtime.engine.types import DrawSpec, EngineRequest, SamplingParams
from loom_runtime.errors import InvalidRequestError
from loom_runtime.serve.bridge import Mailbox, RequestSink, submitted
from loom_runtime.serve.diffusion.media import images_reply, png_bytes, to_uint8
from loom_runtime.serve.diffusion.protocol import (
    SEED_MAX,
    ImageGenerationRequest,
    check_model,
    parse_media,
    parse_size,
)
from loom_runtime.serve.errors import RequestAbortedError


@dataclass(frozen=True)
class DrawSettings:
    """A card's think_then_draw program as a worker serves it (from the card, once)."""

    program: str
    max_think_tokens: int  # the program's maxThinkTokens: the thought's length limit
    num_steps: int  # the draw loop's steps (a request's num_inference_steps replaces them)


class ChatEncoder(Protocol):
    def encode_chat(self, messages: list[dict[str, Any]]) -> Sequence[int]: ...


class DrawEngine(RequestSink, Protocol):
    """What the route needs of the engine (the Engine satisfies it)."""

    @property
    def tokenizer(self) -> ChatEncoder: ...


@dataclass(frozen=True)
class DrawContext:
    engine: DrawEngine
    settings: DrawSettings
    model_name: str
    stall_timeout_s: float  # longest wait for the engine's next output
    mailbox: Mailbox | None = None


DRAW_CONTEXT = web.AppKey("draw_context", DrawContext)


def draw_request(
    body: ImageGenerationRequest,
    request_id: str,
    seed: int,
    prompt_ids: Sequence[int],
    settings: DrawSettings,
) -> EngineRequest:
    """The program request of one image: a greedy thought of at most maxThinkTokens (ends at
    EOS), then `num_inference_steps` (else the card's) denoise steps of a [C, H, W] latent from
    `size` WxH. Fields the program does not honour are refused, each by name."""
    given = body.model_fields_set
    refused = [
        name
        for name, unset in (
            ("n", body.n == 1),
            ("negative_prompt", body.negative_prompt is None),
            ("guidance_scale", body.guidance_scale == 1.0),
        )
        if name in given and not unset
    ]
    if refused:
        raise InvalidRequestError(
            f"{refused[0]} is not supported by the {settings.program} program (one image per "
            "request, no classifier-free guidance); leave it out",
            param=refused[0],
        )
    width, height = parse_size(body.size)
    steps = body.num_inference_steps or settings.num_steps
    sampling = SamplingParams(max_tokens=settings.max_think_tokens, temperature=0.0)
    draw = DrawSpec(height=height, width=width, num_steps=steps, seed=seed)
    return EngineRequest(request_id, tuple(prompt_ids), sampling, draw=draw)


def latents_image(latents: torch.Tensor) -> np.ndarray:
    """[C, H, W] latents -> [H, W, 3] uint8 RGB: the first three channels (fewer: repeated),
    [-1, 1] -> [0, 255]. The mot family's checkpoints have no VAE: a latent pixel is a pixel."""
    rgb = latents[[i % latents.shape[0] for i in range(3)]].to(torch.float32)
    frames: np.ndarray = to_uint8(((rgb.clamp(-1, 1) + 1) / 2).permute(1, 2, 0)[None])
    return np.ascontiguousarray(frames[0])


async def images(request: web.Request) -> web.Response:
    ctx = request.app[DRAW_CONTEXT]
    body = parse_media(ImageGenerationRequest, await request.read())
    check_model(body, ctx.model_name)
    seed = secrets.randbelow(SEED_MAX) if body.seed is None else body.seed
    prompt = ctx.engine.tokenizer.encode_chat([{"role": "user", "content": body.prompt}])
    req = draw_request(body, f"img-{uuid.uuid4().hex}", seed, prompt, ctx.settings)
    thought: list[str] = []
    async with submitted(ctx.engine, req, ctx.mailbox) as outputs:
        while True:
            out = await outputs.next(ctx.stall_timeout_s)
            thought.append(out.new_text)
            if out.finished:
                break
    if out.latents is None:
        raise RequestAbortedError(f"image {req.request_id}: aborted by the worker; retry")
    latents = out.latents
    png = await asyncio.to_thread(lambda: png_bytes(latents_image(latents)))
    return web.json_response(images_reply(int(time.time()), [png], ["".join(thought)]))


def add_routes(app: web.Application, ctx: DrawContext) -> None:
    app[DRAW_CONTEXT] = ctx
    app.router.add_post("/v1/images/generations", images)
