"""The loops of a ModelCard (how a request is driven) and its recipe and parity claims.

Owns these declarations; never runs a loop (loom_runtime.loop does).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loom_runtime.card.base import CardModel, DnsName, list_set
from loom_runtime.card.component import PrecisionName

LoopKind = Literal["ar_decode", "diffusion", "encode"]
CachePolicy = Literal["none", "prefix", "encoder_output"]
RecipeMethod = Literal["base", "distilled", "finetuned", "quantized", "merged"]
ParityLevel = Literal["C0", "C1", "C2", "C3"]

MAX_COMPONENTS = 16


class Loop(CardModel):
    """One way to drive a request: init -> (next -> execute -> advance)* -> finalize."""

    name: DnsName
    """Unique within the card; the recipe and components refer to it."""
    kind: LoopKind
    """ar_decode (autoregressive tokens) | diffusion (denoising steps) | encode."""
    components: list[DnsName] = Field(
        min_length=1, max_length=MAX_COMPONENTS, json_schema_extra=list_set()
    )
    """Components whose weights the loop runs (each must be declared). A component that
    several loops list is shared: a worker holds one instance of it, and every one of those
    loops runs that same instance (one copy of its weights), e.g. a mot model's text and
    image loops on one transformer."""
    cache_policy: CachePolicy | None = None
    """What the loop caches across requests: none | prefix (KV blocks, ar_decode only) |
    encoder_output. Unset means none."""
    steps: int | None = Field(default=None, ge=1)
    """Diffusion loops only: denoising steps per request."""


class Recipe(CardModel):
    """How the weights were made, and what they assume about the loop that serves them."""

    method: RecipeMethod
    """base | distilled | finetuned | quantized | merged."""
    parents: list[str] = Field(default_factory=list, max_length=16)
    """Models these weights derive from (URIs or names), for provenance."""
    assumes_loop: DnsName
    """The declared loop the weights were trained for."""
    assumes_precision: PrecisionName
    """Weight format the recipe was validated at; the loop's transformers must load it."""
    steps: int | None = Field(default=None, ge=1)
    """Step count a distilled diffusion model needs; must equal the loop's steps."""


class Parity(CardModel):
    """How closely this model matches its reference implementation, proven by tests."""

    level: ParityLevel = "C1"
    """C0 bit-identical logits | C1 identical greedy tokens | C2 matching distribution within
    a tolerance | C3 no parity claim."""
