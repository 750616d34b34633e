"""The programs of a ModelCard: loops run in sequence inside one request, on the same weights.

Owns these declarations; never runs a loop (engine/denoise_lane.py runs think_then_draw).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loom_runtime.card.base import CardModel, DnsName

ProgramKind = Literal["think_then_draw"]

MAX_THINK_TOKENS = 8192


class Program(CardModel):
    """One request driven through two loops of the card: `think` (an ar_decode loop) until
    EOS or `maxThinkTokens`, then `draw` (a diffusion loop) conditioned on the prompt and the
    thought's KV where the think loop left it (no copy, no recompute). Both loops run the same
    component, so a worker holds it once."""

    name: DnsName
    """Unique within the card. A worker serves the card's first program on
    /v1/images/generations."""
    kind: ProgramKind
    """think_then_draw (the only kind so far)."""
    think: DnsName
    """The ar_decode loop that writes the text (the reasoning)."""
    draw: DnsName
    """The diffusion loop that draws, attending to the think loop's KV; its `steps` are the
    program's denoise steps."""
    max_think_tokens: int = Field(default=256, ge=1, le=MAX_THINK_TOKENS)
    """Tokens the think loop may write before drawing starts (it stops earlier at EOS)."""
