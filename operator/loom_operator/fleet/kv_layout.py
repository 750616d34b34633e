"""KV-cache bytes per token of a model: per-layer layouts (MLA, GQA, indexer, MTP) and dtypes.

Pure arithmetic over frozen dataclasses (a ModelCard is converted once); never reads files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loom_runtime.card import ModelCard

KVDtype = Literal["fp32", "bf16", "fp16", "fp8"]

SCALE_BYTES = 4  # one fp32 scale per quantization group of an fp8 KV row
ROPE_BYTES = 2  # MLA's decoupled RoPE dims stay BF16 when the latent is stored in fp8


class CapacityError(ValueError):
    """A shape or parallelism the planner cannot size; the message names the field to fix."""


def dtype_bytes(dtype: KVDtype) -> int:
    """Bytes per stored element of a KV dtype."""
    match dtype:
        case "fp32":
            return 4
        case "bf16" | "fp16":
            return 2
        case "fp8":
            return 1
    raise CapacityError(f"unknown KV dtype {dtype!r}: expected fp32, bf16, fp16 or fp8")


def quantized_row_bytes(elements: int, dtype: KVDtype, group_size: int) -> int:
    """Bytes of one row of `elements` values: the values, plus fp32 scales when fp8."""
    values = elements * dtype_bytes(dtype)
    if dtype != "fp8":
        return values
    return values + -(-elements // group_size) * SCALE_BYTES


@dataclass(frozen=True)
class MLAAttention:
    """Multi-head latent attention: one shared latent row (plus RoPE dims) per token per layer."""

    kv_lora_rank: int  # 512 for the GLM-5 class
    qk_rope_head_dim: int  # 64 for the GLM-5 class


@dataclass(frozen=True)
class GQAAttention:
    """Grouped-query attention: K and V rows per KV head per token per layer."""

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Indexer:
    """The sparse-attention indexer: one key row per token in each of its layers."""

    num_layers: int
    head_dim: int
    top_k: int  # KV rows each query attends to (2,048)
    num_heads: int | None = None  # query heads scoring each key; needed only for FLOP counts


@dataclass(frozen=True)
class ModelShape:
    """What the capacity planner needs of a ModelCard's architecture."""

    num_layers: int
    num_attention_heads: int
    attention: MLAAttention | GQAAttention
    kv_dtype: KVDtype = "bf16"
    quant_group_size: int = 128  # elements per fp32 scale when the KV is fp8
    indexer: Indexer | None = None
    mtp_layers: int = 0  # each MTP layer is one attention layer plus one indexer layer


@dataclass(frozen=True)
class KVBreakdown:
    """Bytes per token, by kind of layer; `total` is what one full copy of the cache costs."""

    attention_layers: int
    attention_layer_bytes: int
    indexer_layers: int
    indexer_layer_bytes: int
    mtp_layers: int
    mtp_layer_bytes: int

    @property
    def total(self) -> int:
        return (
            self.attention_layers * self.attention_layer_bytes
            + self.indexer_layers * self.indexer_layer_bytes
            + self.mtp_layers * self.mtp_layer_bytes
        )


def attention_layer_bytes(shape: ModelShape, tp: int = 1) -> int:
    """KV bytes per token of one attention layer on one rank of a TP group of size `tp`.

    MLA's latent is shared by every head, so TP replicates it; GQA splits KV heads over TP
    ranks (at least one head per rank: ranks beyond the KV head count hold replicas).
    """
    att = shape.attention
    if isinstance(att, MLAAttention):
        latent = quantized_row_bytes(att.kv_lora_rank, shape.kv_dtype, shape.quant_group_size)
        rope_bytes = ROPE_BYTES if shape.kv_dtype == "fp8" else dtype_bytes(shape.kv_dtype)
        return latent + att.qk_rope_head_dim * rope_bytes
    heads = -(-att.num_kv_heads // tp)
    row = quantized_row_bytes(att.head_dim, shape.kv_dtype, shape.quant_group_size)
    return 2 * heads * row


def indexer_layer_bytes(shape: ModelShape) -> int:
    """Bytes per token of one indexer layer's key row (0 without an indexer; never TP-split)."""
    if shape.indexer is None:
        return 0
    return quantized_row_bytes(shape.indexer.head_dim, shape.kv_dtype, shape.quant_group_size)


def kv_breakdown(shape: ModelShape, tp: int = 1) -> KVBreakdown:
    """Per-token KV bytes of the whole model on one rank of a TP group of size `tp`."""
    attention = attention_layer_bytes(shape, tp)
    indexer = indexer_layer_bytes(shape)
    return KVBreakdown(
        attention_layers=shape.num_layers,
        attention_layer_bytes=attention,
        indexer_layers=0 if shape.indexer is None else shape.indexer.num_layers,
        indexer_layer_bytes=indexer,
        mtp_layers=shape.mtp_layers,
        mtp_layer_bytes=attention + indexer,
    )


def kv_bytes_per_token(shape: ModelShape, tp: int = 1) -> int:
    """Total KV bytes one token costs on one rank of a TP group of size `tp`."""
    return kv_breakdown(shape, tp).total


def kv_component_dtype(card: ModelCard) -> KVDtype:
    """KV precision of the transformer the first loop drives (else the first transformer)."""
    comps = {c.name: c for c in card.spec.components}
    first_loop = [comps[n] for n in card.spec.loops[0].components if n in comps]
    ordered = [*first_loop, *card.spec.components]
    chosen = next((c for c in ordered if c.kind == "transformer"), ordered[0])
    return chosen.precision.kv


def model_shape(card: ModelCard) -> ModelShape:
    """The planner's view of a ModelCard; CapacityError when it has no `spec.architecture`."""
    arch = card.spec.architecture
    if arch is None:
        raise CapacityError(
            f"ModelCard {card.name!r}: spec.architecture is required to plan capacity "
            "(numLayers, numAttentionHeads, attention, ...)"
        )
    att = arch.attention
    attention: MLAAttention | GQAAttention
    if att.kind == "mla":
        assert att.kv_lora_rank is not None and att.qk_rope_head_dim is not None  # card rule
        attention = MLAAttention(att.kv_lora_rank, att.qk_rope_head_dim)
    else:
        assert arch.num_key_value_heads is not None and arch.head_dim is not None  # card rule
        attention = GQAAttention(arch.num_key_value_heads, arch.head_dim)
    idx = arch.indexer
    return ModelShape(
        num_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        attention=attention,
        kv_dtype=kv_component_dtype(card),
        quant_group_size=att.quant_group_size,
        indexer=None
        if idx is None
        else Indexer(idx.num_layers, idx.head_dim, idx.top_k, idx.num_heads),
        mtp_layers=0 if arch.mtp is None else arch.mtp.num_layers,
    )
