"""Encoding generated frames for clients: PNG images (Pillow) and MP4 videos (PyAV, H.264).

Owns pixel conversion and container formats; never runs a model and never touches HTTP.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import av
import numpy as np
import torch
from PIL import Image

MP4_CODEC = "libx264"


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """[frames, H, W, 3] in 0..1 -> uint8 RGB, rounded."""
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


def png_bytes(frame: np.ndarray) -> bytes:
    """One [H, W, 3] uint8 frame as a PNG."""
    buf = io.BytesIO()
    Image.fromarray(frame, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()


def images_reply(
    created: int, pngs: Sequence[bytes], revised_prompts: Sequence[str | None]
) -> dict[str, Any]:
    """OpenAI's images response: each PNG as b64_json, with the prompt the model drew from
    (`revised_prompt`: a think-then-draw program's thought; None where the prompt was used as
    given)."""
    data = [
        {"b64_json": base64.b64encode(png).decode(), "revised_prompt": revised}
        for png, revised in zip(pngs, revised_prompts, strict=True)
    ]
    return {"created": created, "data": data}


def mp4_bytes(frames: np.ndarray, fps: int) -> bytes:
    """[frames, H, W, 3] uint8 as an H.264 MP4 (yuv420p; even sizes, which Wan's always are)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream(MP4_CODEC, rate=fps)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()
