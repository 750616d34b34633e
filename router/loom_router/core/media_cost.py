"""Routing image and video requests: a request's predicted cost from its body, and the pick of the
endpoint whose outstanding predicted work plus this request's is the least (cost × load).

Owns the cost formula and the pick; never parses more of a body than the cost needs (the worker
validates it and answers 4xx), never holds state (media_jobs.py and the shell do).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loom_router.errors import BadRequestError

DEFAULT_SIZE = (512, 512)
DEFAULT_VIDEO_FRAMES = 17  # one second at the API's default 16 fps, plus the first frame
TEMPORAL_STRIDE = 4  # Wan's VAE keeps frame 0 and one latent frame per 4 after it
PIXELS_PER_TOKEN = 16 * 16  # VAE ×8 spatially, then a 2×2 patch
_SIZE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")
SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class MediaCost:
    """A request's predicted work in token-steps: the DiT tokens of its latents × its denoise
    steps × its CFG passes × its images. A unit, not seconds: picks compare sums of it."""

    tokens: int
    steps: int
    passes: int
    count: int

    @property
    def units(self) -> float:
        return float(self.tokens * self.steps * self.passes * self.count)


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else default  # type: ignore[return-value]


def media_cost(body: Mapping[str, Any], video: bool, default_steps: int) -> MediaCost:
    """The predicted cost of an image (`video` False) or video request body. Fields the cost
    cannot read count as their defaults; the worker rejects what is really wrong."""
    m = _SIZE.match(str(body.get("size", "")))
    width, height = (int(m.group(1)), int(m.group(2))) if m else DEFAULT_SIZE
    frames = 1
    if video:
        frames = _int(body, "num_frames", 0)
        if not frames:
            seconds, fps = body.get("seconds"), _int(body, "fps", 16)
            ok = isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0
            frames = 1 + round(seconds * fps) if ok else DEFAULT_VIDEO_FRAMES  # type: ignore[operator]
    latent_frames = 1 + (frames - 1) // TEMPORAL_STRIDE
    tokens = max(1, latent_frames * width * height // PIXELS_PER_TOKEN)
    guidance = body.get("guidance_scale", 1.0)
    cfg = isinstance(guidance, int | float) and not isinstance(guidance, bool) and guidance > 1
    steps = _int(body, "num_inference_steps", default_steps)
    count = 1 if video else _int(body, "n", 1)
    return MediaCost(tokens=tokens, steps=steps, passes=2 if cfg else 1, count=count)


def pick_by_cost(
    candidates: Iterable[str], outstanding: Mapping[str, float], cost: float
) -> str | None:
    """The candidate that would finish this request's work soonest: least outstanding predicted
    work (plus `cost`, the same for all), ties to the lowest id. None when there is none."""
    best: tuple[float, str] | None = None
    for endpoint_id in candidates:
        key = (outstanding.get(endpoint_id, 0.0) + cost, endpoint_id)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def with_seed(body: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The body with `seed` set unless it has one: a retried or restarted request then makes the
    same pixels on any worker. BadRequestError for a seed that is not a non-negative integer."""
    given = body.get("seed")
    if given is None:
        return {**body, "seed": seed % (SEED_MAX + 1)}
    if not isinstance(given, int) or isinstance(given, bool) or not 0 <= given <= SEED_MAX:
        raise BadRequestError(f"seed must be an integer in [0, {SEED_MAX}], got {given!r}", "seed")
    return dict(body)
