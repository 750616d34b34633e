"""The optional `architecture` block of a ModelCard: the shape numbers the capacity planner needs.

Owns those fields and their cross-field rules; never reads config.json (the runtime does that).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.functional_validators import ModelWrapValidatorHandler

from loom_runtime.card.base import CardModel, cel_rules
from loom_runtime.card.checks import Rule, raise_for, validate_with_rules
from loom_runtime.card.errors import Problem


class Attention(CardModel):
    """How attention stores its KV: grouped-query heads (gqa) or a compressed latent (mla)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.kind != 'mla' || (has(self.kvLoraRank) && has(self.qkRopeHeadDim))",
                "mla attention needs kvLoraRank and qkRopeHeadDim",
            )
        )
    )

    kind: Literal["gqa", "mla"]
    """gqa (per-head K and V) | mla (one shared latent per token, plus RoPE dims)."""
    kv_lora_rank: int | None = Field(default=None, ge=1)
    """mla: latent KV dims per token and layer, e.g. 512."""
    qk_rope_head_dim: int | None = Field(default=None, ge=1)
    """mla: decoupled RoPE key dims per token and layer, e.g. 64 (stored in bf16)."""
    quant_group_size: int = Field(default=128, ge=1)
    """Elements per fp32 scale when the KV cache is fp8."""

    @model_validator(mode="after")
    def _check(self) -> Attention:
        if self.kind == "mla":
            needed = (("kvLoraRank", self.kv_lora_rank), ("qkRopeHeadDim", self.qk_rope_head_dim))
            missing = [name for name, value in needed if value is None]
            raise_for(
                "Attention",
                [((name,), "missing_for_mla", f"mla attention needs {name}") for name in missing],
            )
        return self


class Indexer(CardModel):
    """The sparse-attention indexer: scores earlier tokens and keeps the top k per query."""

    num_layers: int = Field(ge=1)
    """Layers that carry an indexer (its keys are cached too)."""
    head_dim: int = Field(ge=1)
    """Indexer key dims per token and layer, e.g. 128."""
    top_k: int = Field(ge=1)
    """Tokens each query attends to, e.g. 2048."""
    num_heads: int | None = Field(default=None, ge=1)
    """Indexer query heads scoring each key (planning only: its FLOPs), e.g. 32."""


class MtpLayers(CardModel):
    """Multi-token-prediction layers that draft tokens for speculative decoding."""

    num_layers: int = Field(ge=1)
    """MTP layers (each caches KV like a decoder layer)."""
    draft_tokens: int = Field(ge=1)
    """Draft tokens the model was trained to propose per step."""


class Architecture(CardModel):
    """Shape of the main transformer; overrides config.json for planning, not for loading."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.attention.kind != 'gqa' || (has(self.numKeyValueHeads) && has(self.headDim))",
                "gqa attention needs numKeyValueHeads and headDim",
            ),
            (
                "!has(self.numKeyValueHeads) || "
                "self.numAttentionHeads % self.numKeyValueHeads == 0",
                "numAttentionHeads must be a multiple of numKeyValueHeads",
            ),
        )
    )

    num_layers: int = Field(ge=1)
    """Decoder layers."""
    hidden_size: int = Field(ge=1)
    """Model width."""
    num_attention_heads: int = Field(ge=1)
    """Query heads."""
    num_key_value_heads: int | None = Field(default=None, ge=1)
    """gqa: KV heads (numAttentionHeads must be a multiple)."""
    head_dim: int | None = Field(default=None, ge=1)
    """gqa: dims per head."""
    vocab_size: int | None = Field(default=None, ge=1)
    """Vocabulary size."""
    attention: Attention
    """Attention kind and its KV layout."""
    indexer: Indexer | None = None
    """Sparse-attention indexer (sparse-mla models)."""
    mtp: MtpLayers | None = None
    """Multi-token-prediction layers."""

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: object, handler: ModelWrapValidatorHandler[Architecture]) -> Architecture:
        return validate_with_rules(cls, data, handler, ARCHITECTURE_RULES)


def gqa_problems(arch: Architecture) -> list[Problem]:
    """gqa attention needs its head counts, and query heads come in whole groups."""
    problems: list[Problem] = []
    if arch.attention.kind == "gqa":
        needed = (("numKeyValueHeads", arch.num_key_value_heads), ("headDim", arch.head_dim))
        for name, value in needed:
            if value is None:
                problems.append(((name,), "missing_for_gqa", f"gqa attention needs {name}"))
    kv_heads = arch.num_key_value_heads
    if kv_heads is not None and arch.num_attention_heads % kv_heads:
        msg = (
            f"numAttentionHeads ({arch.num_attention_heads}) must be a multiple of "
            f"numKeyValueHeads ({kv_heads})"
        )
        problems.append((("numKeyValueHeads",), "heads_not_divisible", msg))
    return problems


def indexer_problems(arch: Architecture) -> list[Problem]:
    """The indexer sits on some of the model's layers, not more."""
    if arch.indexer is None or arch.indexer.num_layers <= arch.num_layers:
        return []
    msg = (
        f"the indexer cannot have more layers ({arch.indexer.num_layers}) than the model "
        f"({arch.num_layers})"
    )
    return [(("indexer", "numLayers"), "too_many_layers", msg)]


ARCHITECTURE_RULES: tuple[Rule, ...] = (
    gqa_problems,
    indexer_problems,
)
