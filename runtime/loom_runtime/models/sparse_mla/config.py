"""SparseMlaConfig: the typed view of a `glm_moe_dsa` config.json (MLA + DSA indexer + MoE + MTP).

Parses and validates once, collecting every problem; never touches weights or the tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.config import merged_eos_ids, positive_int, read_checkpoint_config

MODEL_TYPE = "glm_moe_dsa"
INDEXER_TYPES = ("full", "shared")  # full: runs its own indexer; shared: reuses the last full's
MLP_TYPES = ("dense", "sparse")

_POSITIVE = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "num_experts_per_tok",
    "index_topk",
    "index_head_dim",
    "index_n_heads",
)


@dataclass(frozen=True)
class SparseMlaConfig:
    """Architecture of a GLM-5-class decoder. Field names follow Hugging Face's config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense MLP layers
    moe_intermediate_size: int  # each routed expert, and the shared expert per n_shared_experts
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int  # the latent row cached per token per layer
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # the decoupled RoPE part, also cached per token per layer
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    index_topk: int  # KV rows each query attends to
    index_head_dim: int  # the indexer's key row cached per token in each full indexer layer
    index_n_heads: int
    indexer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    num_nextn_predict_layers: int = 0  # MTP layers stored after the trunk's
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    model_type: str = MODEL_TYPE

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def full_indexer_layers(self) -> tuple[int, ...]:
        """Trunk layers that run (and cache keys for) their own indexer."""
        return tuple(i for i, kind in enumerate(self.indexer_types) if kind == "full")

    @property
    def num_parameters(self) -> int:
        """Parameters of the trunk and head (every expert counted; the MTP layers, which do
        not run yet, left out); embeddings counted once when tied."""
        h, heads = self.hidden_size, self.num_attention_heads
        q, kv = self.q_lora_rank, self.kv_lora_rank
        attn = q * h + q + heads * self.qk_head_dim * q
        attn += (kv + self.qk_rope_head_dim) * h + kv
        attn += heads * (self.qk_nope_head_dim + self.v_head_dim) * kv + h * heads * self.v_head_dim
        ih, idim = self.index_n_heads, self.index_head_dim
        indexer = ih * idim * q + idim * h + 2 * idim + ih * h
        e, i = self.n_routed_experts, self.moe_intermediate_size
        moe = e * h + e + e * 3 * i * h + 3 * h * i * self.n_shared_experts
        dense = 3 * h * self.intermediate_size
        total = self.num_hidden_layers * (attn + 2 * h) + len(self.full_indexer_layers) * indexer
        total += sum(moe if kind == "sparse" else dense for kind in self.mlp_layer_types)
        return total + self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + h

    def kv_spec(
        self,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        fp8: Fp8Format | None = None,
        mtp_layers: int = 0,
    ) -> LatentKVCacheSpec:
        """The paged latent KV cache this model needs; with `fp8`, rows are stored packed
        (kv/fp8.py) and gathered in `dtype`. `mtp_layers` (MTP speculation) adds the rows of
        that many MTP layers after the trunk's, each a latent + RoPE row and an indexer key row
        (an MTP layer runs its own indexer), as the planner counts them."""
        if not 0 <= mtp_layers <= self.num_nextn_predict_layers:
            raise ValueError(
                f"mtp_layers must be in 0..{self.num_nextn_predict_layers} (the checkpoint's "
                f"MTP layers), got {mtp_layers}"
            )
        trunk = self.num_hidden_layers
        mtp = tuple(range(trunk, trunk + mtp_layers))
        return LatentKVCacheSpec(
            num_layers=trunk + mtp_layers,
            latent_dim=self.kv_lora_rank,
            rope_dim=self.qk_rope_head_dim,
            index_layers=self.full_indexer_layers + mtp,
            index_dim=self.index_head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
            dtype=dtype,
            fp8=fp8,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> SparseMlaConfig:
        """Read config.json (required) and generation_config.json (optional) from a checkpoint."""
        return cls.from_dict(*read_checkpoint_config(path))

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        generation: Mapping[str, Any] | None = None,
        where: str = "config.json",
    ) -> SparseMlaConfig:
        """Build from config.json contents; raises CheckpointError listing every problem."""
        errors: list[str] = []
        if raw.get("model_type") != MODEL_TYPE:
            errors.append(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
        ints: dict[str, Any] = {name: positive_int(raw, name, errors) for name in _POSITIVE}
        layers = ints["num_hidden_layers"]
        indexer_types = _indexer_types(raw, layers, errors)
        mlp_types = _mlp_layer_types(raw, layers, errors)
        _check_heads_and_experts(raw, ints, errors)
        rope_theta = _rope_theta(raw, errors)
        if errors:
            raise CheckpointError(f"{where}: " + "; ".join(errors))
        return cls(
            indexer_types=indexer_types,
            mlp_layer_types=mlp_types,
            n_shared_experts=int(raw.get("n_shared_experts", 1)),
            n_group=int(raw.get("n_group", 1)),
            topk_group=int(raw.get("topk_group", 1)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers", 0)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=merged_eos_ids(raw, generation or {}),
            bos_token_id=raw.get("bos_token_id")
            if isinstance(raw.get("bos_token_id"), int)
            else None,
            **ints,
        )


def _indexer_types(raw: Mapping[str, Any], layers: int, errors: list[str]) -> tuple[str, ...]:
    """`indexer_types`, else Hugging Face's default from `index_topk_pattern` or freq/offset."""
    kinds = raw.get("indexer_types")
    pattern = raw.get("index_topk_pattern")
    if kinds is None and isinstance(pattern, str):
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    elif kinds is None and pattern is not None:
        kinds = list(pattern)
    elif kinds is None:
        freq = max(int(raw.get("index_topk_freq", 1)), 1)
        offset = int(raw.get("index_skip_topk_offset", 2))
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    checked = _layer_kinds("indexer_types", kinds, layers, INDEXER_TYPES, errors)
    if checked and checked[0] != "full":
        errors.append("indexer_types[0] must be 'full': a shared layer reuses an earlier top-k")
    return checked


def _mlp_layer_types(raw: Mapping[str, Any], layers: int, errors: list[str]) -> tuple[str, ...]:
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        dense = min(int(raw.get("first_k_dense_replace", 3)), layers)
        kinds = ["dense"] * dense + ["sparse"] * (layers - dense)
    return _layer_kinds("mlp_layer_types", kinds, layers, MLP_TYPES, errors)


def _layer_kinds(
    name: str, kinds: list[Any], layers: int, allowed: tuple[str, ...], errors: list[str]
) -> tuple[str, ...]:
    """One kind per layer, each among `allowed`."""
    names = tuple(str(k) for k in kinds)
    if len(names) != layers:
        errors.append(f"{name} has {len(names)} entries for {layers} layers")
    bad = sorted({k for k in names if k not in allowed})
    if bad:
        errors.append(f"{name} {bad} are not among {allowed}")
    return names


def _check_heads_and_experts(
    raw: Mapping[str, Any], ints: Mapping[str, int], errors: list[str]
) -> None:
    heads = ints["num_attention_heads"]
    kv_heads = raw.get("num_key_value_heads") or heads
    if kv_heads != heads:
        errors.append(
            f"num_key_value_heads ({kv_heads}) must equal num_attention_heads ({heads}): "
            "MLA expands its latent into every head"
        )
    if raw.get("hidden_act", "silu") != "silu":
        errors.append(f"hidden_act {raw.get('hidden_act')!r} is not supported (only 'silu')")
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        errors.append("attention_bias / mlp_bias are not supported by the sparse-mla family")
    if ints["index_head_dim"] and ints["index_head_dim"] < ints["qk_rope_head_dim"]:
        errors.append("index_head_dim must be at least qk_rope_head_dim (RoPE is applied to it)")
    experts, groups = ints["n_routed_experts"], int(raw.get("n_group", 1))
    if groups < 1 or experts % groups or experts // groups < 2:
        errors.append(
            f"n_routed_experts ({experts}) must split into n_group ({groups}) groups of >= 2"
        )
    elif not 1 <= int(raw.get("topk_group", 1)) <= groups:
        errors.append(f"topk_group must be between 1 and n_group ({groups})")
    chosen = ints["num_experts_per_tok"]
    if chosen and experts and chosen > experts:
        errors.append(f"num_experts_per_tok ({chosen}) exceeds n_routed_experts ({experts})")


def _rope_theta(raw: Mapping[str, Any], errors: list[str]) -> float:
    params = dict(raw.get("rope_parameters") or {})
    params.update(raw.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        errors.append(
            f"rope type {rope_type!r} is not supported by the sparse-mla family (only 'default')"
        )
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
