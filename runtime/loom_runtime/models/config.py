"""ModelConfig: the runtime's typed view of a checkpoint's config.json (+ generation_config.json).

Parses and validates once, collecting every problem; never touches weights or the tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.kv.cache import KVCacheSpec
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.wire.tokenizer import read_json_object

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")
# rope types whose scaling is relative to the pretraining context length
_NEEDS_ORIGINAL_MAX = ("llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a llama-family decoder. Field names follow Hugging Face's config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None for plain RoPE; else a read-only mapping with "rope_type" (linear|dynamic|llama3|yarn)
    # and that type's parameters, normalised from either `rope_scaling` or `rope_parameters`.
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (always on for qwen2)
    attention_out_bias: bool = False  # bias on o_proj (llama's attention_bias; never for qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # qwen3: RMSNorm over head_dim on q and k before RoPE
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        """Parameter count implied by the config (embeddings counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        attn += (self.q_size + 2 * self.kv_size) * self.attention_bias
        attn += h * self.attention_out_bias + 2 * self.head_dim * self.qk_norm
        mlp = 3 * h * i + (2 * i + h) * self.mlp_bias
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embed + h + self.num_hidden_layers * per_layer

    def kv_spec(
        self,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        fp8: Fp8Format | None = None,
    ) -> KVCacheSpec:
        """The paged KV cache shape this model needs; with `fp8`, rows are stored packed
        (kv/fp8.py) and gathered in `dtype`."""
        return KVCacheSpec(
            num_layers=self.num_hidden_layers,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
            dtype=dtype,
            fp8=fp8,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read config.json (required) and generation_config.json (optional) from a checkpoint."""
        return cls.from_dict(*read_checkpoint_config(path))

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        generation: Mapping[str, Any] | None = None,
        where: str = "config.json",
    ) -> ModelConfig:
        """Build from config.json contents; raises CheckpointError listing every problem."""
        errors: list[str] = []
        model_type = str(raw.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            errors.append(f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
        ints = {
            name: positive_int(raw, name, errors)
            for name in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
        }
        heads = ints["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        head_dim = raw.get("head_dim") or (ints["hidden_size"] // heads if heads else 0)
        if heads and kv_heads and heads % kv_heads:
            errors.append(
                f"num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        _check_unsupported(raw, errors)
        rope_theta, rope_scaling = _parse_rope(raw, errors)
        if errors:
            raise CheckpointError(f"{where}: " + "; ".join(errors))
        is_qwen2 = model_type == "qwen2"
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=is_qwen2 or attention_bias,
            attention_out_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=merged_eos_ids(raw, generation or {}),
            bos_token_id=_optional_int(raw.get("bos_token_id")),
            **ints,
        )


def read_checkpoint_config(path: str | Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(config.json, generation_config.json or {}, where config.json is) of a checkpoint."""
    root = Path(path)
    raw = read_config_json(root / "config.json", required=True)
    generation = read_config_json(root / "generation_config.json", required=False)
    return raw, generation, str(root / "config.json")


def read_config_json(path: Path, required: bool) -> dict[str, Any]:
    if required and not path.is_file():
        raise CheckpointError(f"{path} is missing: a checkpoint directory needs config.json")
    return read_json_object(path)


def positive_int(raw: Mapping[str, Any], name: str, errors: list[str]) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        errors.append(f"{name} must be a positive integer, got {value!r}")
        return 0
    return value


def _optional_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _check_unsupported(raw: Mapping[str, Any], errors: list[str]) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        errors.append(f"hidden_act {act!r} is not supported (only 'silu')")
    if raw.get("use_sliding_window") or (
        raw.get("model_type") == "mistral" and raw.get("sliding_window")
    ):
        errors.append("sliding-window attention is not supported; disable it in config.json")
    if any(kind != "full_attention" for kind in raw.get("layer_types") or []):
        errors.append("layer_types other than 'full_attention' are not supported")
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        errors.append("partial_rotary_factor != 1.0 is not supported")


def _parse_rope(
    raw: Mapping[str, Any], errors: list[str]
) -> tuple[float, Mapping[str, Any] | None]:
    """Normalise legacy (`rope_theta` + `rope_scaling`) and v5 (`rope_parameters`) layouts."""
    params = dict(raw.get("rope_parameters") or {})
    params.update(raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        errors.append("rope partial_rotary_factor != 1.0 is not supported")
    params.pop("partial_rotary_factor", None)
    if rope_type == "default":
        return theta, None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        errors.append(f"rope type {rope_type!r} is not one of {SUPPORTED_ROPE_TYPES}")
        return theta, None
    if rope_type in _NEEDS_ORIGINAL_MAX:
        params.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    if rope_type != "yarn" and not isinstance(params.get("factor"), int | float):
        errors.append(f"rope type {rope_type!r} needs a numeric 'factor'")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if not isinstance(params.get(key), int | float):
                errors.append(f"rope type 'llama3' needs a numeric {key!r}")
    return theta, MappingProxyType({"rope_type": rope_type, **params})


def merged_eos_ids(raw: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (raw.get("eos_token_id"), generation.get("eos_token_id")):
        values = source if isinstance(source, list) else [source]
        ids.extend(v for v in values if isinstance(v, int) and v not in ids)
    return tuple(ids)
