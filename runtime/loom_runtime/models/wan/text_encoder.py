"""Umt5Encoder: the UMT5 text encoder Wan conditions on (T5 layers, each with its own relative
position bias, gated-GELU FFNs and T5's RMS layer norm).

Owns the encoder's weights and one forward over token ids; never tokenizes, pads or caches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from loom_runtime.models.wan.config import Umt5Config
from loom_runtime.models.wan.params import Linear, wide_dtype
from loom_runtime.models.weights import copy_weights

EMBED_ALIAS = "encoder.embed_tokens.weight"  # tied to shared.weight; some checkpoints store both


def t5_layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale-only RMS norm; the mean square is taken wide, the result cast to a half weight."""
    variance = x.to(wide_dtype(x.dtype)).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return weight * h


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """T5's "gelu_new", op by op in x's dtype (so half-precision results round as transformers')."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def relative_buckets(
    query_len: int, key_len: int, num_buckets: int, max_distance: int, device: torch.device
) -> torch.Tensor:
    """[query, key] bucket ids of the bidirectional T5 scheme: half the buckets per direction,
    exact below num_buckets / 4, logarithmic up to max_distance, saturating beyond."""
    relative = (
        torch.arange(key_len, device=device)[None, :]
        - torch.arange(query_len, device=device)[:, None]
    )
    half = num_buckets // 2
    exact = half // 2
    direction = (relative > 0).to(torch.long) * half
    distance = relative.abs()
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = exact + (scaled * (half - exact)).to(torch.long)
    far = far.clamp(max=half - 1)
    return direction + torch.where(distance < exact, distance, far)


class Umt5Layer:
    """Pre-norm self-attention (unscaled scores + this layer's position bias), then gated FFN."""

    def __init__(self, config: Umt5Config, dtype: torch.dtype, device: str | torch.device):
        c = config
        self.config = config
        self.q = Linear(c.inner_dim, c.d_model, dtype, device, bias=False)
        self.k = Linear(c.inner_dim, c.d_model, dtype, device, bias=False)
        self.v = Linear(c.inner_dim, c.d_model, dtype, device, bias=False)
        self.o = Linear(c.d_model, c.inner_dim, dtype, device, bias=False)
        self.position_bias = torch.zeros(
            c.relative_attention_num_buckets, c.num_heads, dtype=dtype, device=device
        )
        self.attn_norm = torch.zeros(c.d_model, dtype=dtype, device=device)
        self.ffn_norm = torch.zeros(c.d_model, dtype=dtype, device=device)
        self.gate = Linear(c.d_ff, c.d_model, dtype, device, bias=False)
        self.up = Linear(c.d_ff, c.d_model, dtype, device, bias=False)
        self.down = Linear(c.d_model, c.d_ff, dtype, device, bias=False)

    def targets(self) -> dict[str, torch.Tensor]:
        out = {
            "layer.0.SelfAttention.relative_attention_bias.weight": self.position_bias,
            "layer.0.layer_norm.weight": self.attn_norm,
            "layer.1.layer_norm.weight": self.ffn_norm,
        }
        for name, layer in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)):
            out.update(layer.targets(f"layer.0.SelfAttention.{name}"))
        for name, layer in (("wi_0", self.gate), ("wi_1", self.up), ("wo", self.down)):
            out.update(layer.targets(f"layer.1.DenseReluDense.{name}"))
        return out

    def __call__(
        self, x: torch.Tensor, buckets: torch.Tensor, mask_bias: torch.Tensor
    ) -> torch.Tensor:
        """x [batch, tokens, d_model]; buckets [tokens, tokens]; mask_bias [batch, 1, 1, tokens]."""
        c = self.config
        h = t5_layer_norm(x, self.attn_norm, c.layer_norm_epsilon)
        q, k, v = (
            proj(h).view(*h.shape[:2], c.num_heads, c.d_kv).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        bias = F.embedding(buckets, self.position_bias).permute(2, 0, 1)[None]
        scores = q @ k.transpose(2, 3) + bias + mask_bias
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.o(attn.transpose(1, 2).flatten(2))
        h = t5_layer_norm(x, self.ffn_norm, c.layer_norm_epsilon)
        gated = gelu_tanh(self.gate(h)) * self.up(h)
        return x + self.down(gated)


class Umt5Encoder:
    """transformers `UMT5EncoderModel` as plain tensors. Zeros until `load_state`; no autograd."""

    def __init__(
        self,
        config: Umt5Config,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        self.embed = torch.zeros(config.vocab_size, config.d_model, dtype=dtype, device=device)
        self.layers = [Umt5Layer(config, dtype, device) for _ in range(config.num_layers)]
        self.final_norm = torch.zeros(config.d_model, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """last_hidden_state [batch, tokens, d_model] of input_ids [batch, tokens].

        attention_mask [batch, tokens] (1 = token, 0 = padding) hides padded keys; padded
        positions still get (meaningless) outputs, which Wan pipelines zero out afterwards.
        """
        c = self.config
        ids = input_ids.to(self.device)
        tokens = ids.shape[1]
        x = F.embedding(ids, self.embed)
        if attention_mask is None:
            attention_mask = torch.ones_like(ids)
        hidden = attention_mask.to(self.device)[:, None, None, :] == 0
        mask_bias = torch.zeros(hidden.shape, dtype=self.dtype, device=self.device)
        mask_bias = mask_bias.masked_fill(hidden, torch.finfo(self.dtype).min)
        buckets = relative_buckets(
            tokens,
            tokens,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
            self.device,
        )
        for layer in self.layers:
            x = layer(x, buckets, mask_bias)
        return t5_layer_norm(x, self.final_norm, c.layer_norm_epsilon)

    def targets(self) -> dict[str, torch.Tensor]:
        """Every transformers tensor name this model reads -> the tensor it fills."""
        out = {"shared.weight": self.embed, "encoder.final_layer_norm.weight": self.final_norm}
        for i, layer in enumerate(self.layers):
            out.update({f"encoder.block.{i}.{k}": v for k, v in layer.targets().items()})
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy checkpoint tensors in place (atomic); the tied embedding may have either name."""
        wanted = dict(tensors)
        alias = wanted.pop(EMBED_ALIAS, None)
        if alias is not None and "shared.weight" not in wanted:
            wanted["shared.weight"] = alias
        copy_weights(self.targets(), wanted, "umt5 text encoder", strict)
