"""The llama family (llama, mistral, qwen2, qwen3) in plain torch over a paged KV cache.

Owns the weights and the forward math; never schedules, allocates KV blocks or reads files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from loom_runtime.kv.cache import KVStore, PagedKVCache
from loom_runtime.models.attention import AttentionPlan, paged_attention, plan_attention
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.linear import Linear, invariant_linear, plain_linear
from loom_runtime.models.norm import rms_norm
from loom_runtime.models.rope import RopeTables, apply_rope, inverse_frequencies, rope_tables
from loom_runtime.models.weights import copy_weights

# Checkpoint tensors that carry no weights of ours (old checkpoints saved RoPE buffers).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class LlamaDecoderLayer:
    """Pre-norm attention + SwiGLU MLP. q/k/v and gate/up are stored fused, one matmul each.

    `reduce`: on a tensor-parallel rank (parallel/llama/tp.py) the layer holds a shard of the
    heads and of the MLP's intermediate columns; o_proj's and down_proj's partial sums then go
    through `reduce` (an all-reduce over the TP group) before their bias is added, once."""

    def __init__(
        self, config: ModelConfig, layer: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        self.config = config
        self.layer = layer
        h, q, kv, i = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size

        def zeros(*shape: int, when: bool = True) -> torch.Tensor | None:
            return torch.zeros(*shape, dtype=dtype, device=device) if when else None

        self.input_norm = torch.zeros(h, dtype=dtype, device=device)
        self.post_attention_norm = torch.zeros(h, dtype=dtype, device=device)
        self.qkv_weight = torch.zeros(q + 2 * kv, h, dtype=dtype, device=device)
        self.o_weight = torch.zeros(h, q, dtype=dtype, device=device)
        self.gate_up_weight = torch.zeros(2 * i, h, dtype=dtype, device=device)
        self.down_weight = torch.zeros(h, i, dtype=dtype, device=device)
        self.qkv_bias = zeros(q + 2 * kv, when=config.attention_bias)
        self.o_bias = zeros(h, when=config.attention_out_bias)
        self.gate_up_bias = zeros(2 * i, when=config.mlp_bias)
        self.down_bias = zeros(h, when=config.mlp_bias)
        self.q_norm = zeros(config.head_dim, when=config.qk_norm)
        self.k_norm = zeros(config.head_dim, when=config.qk_norm)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode
        self.invariant_attention = False  # models/invariant_attention.py in that mode

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `model.layers.N.`) -> the view it is copied into."""
        c = self.config
        q, kv, i = c.q_size, c.kv_size, c.intermediate_size
        qkv, gate_up = self.qkv_weight, self.gate_up_weight
        out = {
            "input_layernorm.weight": self.input_norm,
            "post_attention_layernorm.weight": self.post_attention_norm,
            "self_attn.q_proj.weight": qkv[:q],
            "self_attn.k_proj.weight": qkv[q : q + kv],
            "self_attn.v_proj.weight": qkv[q + kv :],
            "self_attn.o_proj.weight": self.o_weight,
            "mlp.gate_proj.weight": gate_up[:i],
            "mlp.up_proj.weight": gate_up[i:],
            "mlp.down_proj.weight": self.down_weight,
        }
        if self.qkv_bias is not None:
            out["self_attn.q_proj.bias"] = self.qkv_bias[:q]
            out["self_attn.k_proj.bias"] = self.qkv_bias[q : q + kv]
            out["self_attn.v_proj.bias"] = self.qkv_bias[q + kv :]
        optional = {
            "self_attn.o_proj.bias": self.o_bias,
            "mlp.gate_proj.bias": None if self.gate_up_bias is None else self.gate_up_bias[:i],
            "mlp.up_proj.bias": None if self.gate_up_bias is None else self.gate_up_bias[i:],
            "mlp.down_proj.bias": self.down_bias,
            "self_attn.q_norm.weight": self.q_norm,
            "self_attn.k_norm.weight": self.k_norm,
        }
        out.update({name: t for name, t in optional.items() if t is not None})
        return out

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv: PagedKVCache,
        plan: AttentionPlan,
        slot_mapping: torch.Tensor,
        attention_scale: float,
    ) -> torch.Tensor:
        q, k, v = self.attention_inputs(x, rope)
        attn = paged_attention(
            q, k, v, kv, self.layer, plan, slot_mapping, attention_scale, self.invariant_attention
        )
        return self.after_attention(x, attn)

    def attention_inputs(
        self, x: torch.Tensor, rope: RopeTables
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block's first half: q [T, heads, D], k and v [T, kv_heads, D] of x, with RoPE.

        `forward` attends them over the paged cache; another attention (the MoT family's
        denoise path, models/mot/) runs the same block by calling both halves itself."""
        c = self.config
        h = rms_norm(x, self.input_norm, c.rms_norm_eps)
        qkv = self.linear(h, self.qkv_weight, self.qkv_bias)
        q, k, v = torch.split(qkv, [c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_attention_heads, c.head_dim)
        k = k.view(-1, c.num_key_value_heads, c.head_dim)
        v = v.view(-1, c.num_key_value_heads, c.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, c.rms_norm_eps)
            k = rms_norm(k, self.k_norm, c.rms_norm_eps)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block's second half: x + o_proj(attn [T, heads, D]), then the SwiGLU MLP."""
        c = self.config
        x = x + self._row_parallel(attn.flatten(1), self.o_weight, self.o_bias)
        h = rms_norm(x, self.post_attention_norm, c.rms_norm_eps)
        gate, up = self.linear(h, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
        return x + self._row_parallel(F.silu(gate) * up, self.down_weight, self.down_bias)

    def _row_parallel(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x @ weightᵀ + bias; on a TP rank the partial sums are reduced first."""
        if self.reduce is None:
            return self.linear(x, weight, bias)
        out = self.reduce(self.linear(x, weight, None))
        return out if bias is None else out + bias


class LlamaForCausalLM:
    """A llama-family decoder implementing the CausalLM protocol.

    Weights start as zeros; `load_state` fills them. Plain tensors, no autograd.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        h = config.hidden_size
        self.embed_tokens = torch.zeros(config.vocab_size, h, dtype=dtype, device=device)
        self.final_norm = torch.zeros(h, dtype=dtype, device=device)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else torch.zeros(config.vocab_size, h, dtype=dtype, device=device)
        )
        self.layers = [
            LlamaDecoderLayer(config, i, dtype, device) for i in range(config.num_hidden_layers)
        ]
        self.inv_freq, self.rope_scale = inverse_frequencies(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            config.max_position_embeddings,
        )
        self.attention_scale = config.head_dim**-0.5
        self.linear: Linear = plain_linear

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode on or off: every matmul against a weight (each layer's and the
        LM head's) as invariant_linear (models/linear.py) and every attention as
        models/invariant_attention.py, or torch's own."""
        self.linear = invariant_linear if on else plain_linear
        for layer in self.layers:
            layer.linear, layer.invariant_attention = self.linear, on

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVStore) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] for a mixed prefill/decode batch (see CausalLM)."""
        if not isinstance(kv, PagedKVCache):
            raise TypeError(f"llama runs over a PagedKVCache, not {type(kv).__name__}")
        plan = plan_attention(batch, kv.spec.block_size, self.device)
        rope = rope_tables(batch.positions, self.inv_freq, self.rope_scale, self.dtype)
        x = F.embedding(batch.input_ids, self.embed_tokens)
        for layer in self.layers:
            x = layer.forward(x, rope, kv, plan, batch.slot_mapping, self.attention_scale)
        x = rms_norm(
            x.index_select(0, batch.logits_indices), self.final_norm, self.config.rms_norm_eps
        )
        logits = self.linear(x, self.lm_head, None)
        return logits if logits.dtype == torch.float64 else logits.float()

    def targets(self) -> dict[str, torch.Tensor]:
        """Every Hugging Face tensor name this model reads -> the tensor (view) it fills."""
        out = {"model.embed_tokens.weight": self.embed_tokens, "model.norm.weight": self.final_norm}
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.targets().items()})
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy checkpoint tensors in place; validates all names and shapes first (atomic)."""
        wanted = {n: t for n, t in tensors.items() if not self.ignores(n)}
        copy_weights(self.targets(), wanted, self.config.model_type, strict)

    def ignores(self, name: str) -> bool:
        """A checkpoint tensor that carries no weight of ours (a tied head, old RoPE buffers)."""
        tied_head = self.config.tie_word_embeddings and name == "lm_head.weight"
        return tied_head or name.endswith(_IGNORED_SUFFIXES)
