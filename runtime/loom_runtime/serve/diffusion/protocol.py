"""Image and video request bodies (OpenAI's images and videos shapes, plus Loom's extensions) as
pydantic models, and the one conversion of a parsed body into diffusion requests. Which fields are
honoured, refused or meaningless is the field contract's (wire/openai/field_contract.py); a field
it does not name is refused.

Owns field names, ranges and the size syntax; never touches the engine or the HTTP layer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from loom_runtime.diffusion.types import DiffusionRequest
from loom_runtime.errors import InvalidRequestError, ModelNotFoundError
from loom_runtime.wire.openai.field_contract import Endpoint
from loom_runtime.wire.openai.request import parse_request

MAX_IMAGES = 10  # n, as OpenAI allows
MAX_STEPS = 1000
MAX_FRAMES = 1025
SEED_MAX = 2**63 - 1
_SIZE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")


class _Generation(BaseModel):
    model_config = ConfigDict(extra="allow")  # the contract judges the rest (parse_media)

    prompt: str = Field(min_length=1, max_length=32_000)
    model: str | None = None
    size: str = "512x512"
    seed: int | None = Field(None, ge=0, le=SEED_MAX)  # extension; None = a random seed
    negative_prompt: str | None = None  # extension
    guidance_scale: float = Field(1.0, ge=0, le=100)  # extension; > 1 turns on CFG
    num_inference_steps: int | None = Field(None, ge=1, le=MAX_STEPS)  # extension


class ImageGenerationRequest(_Generation):
    """POST /v1/images/generations."""

    ENDPOINT: ClassVar[Endpoint] = "images"

    n: int = Field(1, ge=1, le=MAX_IMAGES)
    response_format: Literal["b64_json"] = "b64_json"


class VideoGenerationRequest(_Generation):
    """POST /v1/videos. Frames are `num_frames` (extension) or `seconds` × `fps` + 1."""

    ENDPOINT: ClassVar[Endpoint] = "videos"

    num_frames: int | None = Field(None, ge=1, le=MAX_FRAMES)
    seconds: float | None = Field(None, gt=0, le=120)
    fps: int = Field(16, ge=1, le=120)

    def frames(self) -> int:
        if self.num_frames is not None:
            return self.num_frames
        return 1 + round((self.seconds or 1) * self.fps)


M = TypeVar("M", bound="_Generation")


def parse_media(cls: type[M], body: bytes) -> M:
    """Parse an images or videos body: a field the contract refuses, or one it does not name, is
    a 400 naming it (no vLLM schema to stay lenient for)."""
    return parse_request(cls, body, strict_fields=True)


class PromptEncoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class PromptSettings:
    """How prompts become token rows on this worker: the served model and the encoder's length
    (longer prompts are truncated to it, as diffusers' Wan pipelines do)."""

    model_name: str
    text_len: int


def parse_size(size: str) -> tuple[int, int]:
    """'WxH' -> (width, height); InvalidRequestError (param size) otherwise."""
    m = _SIZE.match(size)
    if m is None:
        raise InvalidRequestError(f"size {size!r} must be 'WIDTHxHEIGHT', e.g. '512x512'", "size")
    return int(m.group(1)), int(m.group(2))


def check_model(body: _Generation, model_name: str) -> None:
    if body.model is not None and body.model != model_name:
        raise ModelNotFoundError(
            f"model {body.model!r} is not served here (this worker serves {model_name!r})"
        )


def diffusion_requests(
    body: _Generation,
    ids: Sequence[str],
    frames: int,
    seed: int,
    tokenizer: PromptEncoder,
    settings: PromptSettings,
) -> list[DiffusionRequest]:
    """One request per id (seeds seed, seed + 1, ...); raises for a bad model or size."""
    check_model(body, settings.model_name)
    width, height = parse_size(body.size)
    prompt = tuple(tokenizer.encode(body.prompt))[: settings.text_len]
    negative = tuple(tokenizer.encode(body.negative_prompt or ""))[: settings.text_len]
    return [
        DiffusionRequest(
            request_id=rid,
            prompt_ids=prompt,
            height=height,
            width=width,
            num_frames=frames,
            num_steps=body.num_inference_steps,
            guidance_scale=body.guidance_scale,
            negative_ids=negative,
            seed=(seed + i) % (SEED_MAX + 1),
        )
        for i, rid in enumerate(ids)
    ]
