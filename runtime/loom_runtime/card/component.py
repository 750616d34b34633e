"""A ModelCard component: one set of weights (decoder, encoder, VAE, draft) and how it is stored.

Owns the component's fields and precision vocabulary; never loads weights.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loom_runtime.card.base import CardModel, DnsName, LabelValue, list_set
from loom_runtime.card.source import Source

PrecisionName = Literal["fp32", "bf16", "fp16", "fp8"]
ComponentKind = Literal["transformer", "encoder", "vae", "draft", "adapter"]

MAX_LOOPS = 16


class Precision(CardModel):
    """Number formats of a component's weights and of the KV cache it writes."""

    weights: PrecisionName = "bf16"
    """fp32 | bf16 | fp16 | fp8."""
    kv: PrecisionName = "bf16"
    """KV-cache format: fp32 | bf16 | fp16 | fp8 (fp8 stores an fp32 scale per group)."""


class Component(CardModel):
    """One set of weights the model is made of."""

    name: DnsName
    """Unique within the card; loops refer to it."""
    kind: ComponentKind
    """transformer | encoder | vae | draft | adapter."""
    source: Source
    """Where the checkpoint lives."""
    weights_version: LabelValue = "v1"
    """Changing it (or the source) starts a weight sync in every deployment of the model."""
    precision: Precision = Field(default_factory=Precision)
    """Weight and KV formats (default bf16 / bf16)."""
    required_for: list[DnsName] = Field(
        default_factory=list, max_length=MAX_LOOPS, json_schema_extra=list_set()
    )
    """Loops that cannot run without this component."""
    optional_for: list[DnsName] = Field(
        default_factory=list, max_length=MAX_LOOPS, json_schema_extra=list_set()
    )
    """Loops that use this component when it is loaded."""
