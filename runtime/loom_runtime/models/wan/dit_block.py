"""One Wan DiT block: adaLN-modulated self-attention over the latent tokens (3D RoPE, RMS q/k norm),
cross-attention to the text tokens, and a modulated GELU FFN.

Owns one block's weights and math; never patchifies, embeds conditions or reads files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom_runtime.models.wan.config import WanDitConfig
from loom_runtime.models.wan.params import Linear, wide_dtype
from loom_runtime.models.wan.rotary import GridRotary, apply_grid_rotary


def layer_norm(
    x: torch.Tensor,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dim, computed wide (float32 for half inputs); result stays wide."""
    wide = wide_dtype(x.dtype)
    w = None if weight is None else weight.to(wide)
    b = None if bias is None else bias.to(wide)
    return F.layer_norm(x.to(wide), (x.shape[-1],), w, b, eps)


class WanAttention:
    """Multi-head attention with q/k RMS-normed across all heads; keys and values from `context`."""

    def __init__(self, config: WanDitConfig, dtype: torch.dtype, device: str | torch.device):
        dim = config.inner_dim
        self.heads = config.num_attention_heads
        self.eps = config.eps
        self.q = Linear(dim, dim, dtype, device)
        self.k = Linear(dim, dim, dtype, device)
        self.v = Linear(dim, dim, dtype, device)
        self.out = Linear(dim, dim, dtype, device)
        self.norm_q = torch.zeros(dim, dtype=dtype, device=device)
        self.norm_k = torch.zeros(dim, dtype=dtype, device=device)

    def targets(self) -> dict[str, torch.Tensor]:
        out = {"norm_q.weight": self.norm_q, "norm_k.weight": self.norm_k}
        for name, layer in (("to_q", self.q), ("to_k", self.k), ("to_v", self.v)):
            out.update(layer.targets(name))
        out.update(self.out.targets("to_out.0"))
        return out

    def __call__(
        self, x: torch.Tensor, context: torch.Tensor, rotary: GridRotary | None
    ) -> torch.Tensor:
        """x [batch, tokens, dim] attends to context [batch, context_tokens, dim]."""
        dim, heads = x.shape[-1], self.heads
        q = F.rms_norm(self.q(x), (dim,), self.norm_q, self.eps)
        k = F.rms_norm(self.k(context), (dim,), self.norm_k, self.eps)
        q = q.view(*q.shape[:2], heads, -1)
        k = k.view(*k.shape[:2], heads, -1)
        v = self.v(context).view(*k.shape)
        if rotary is not None:
            q, k = apply_grid_rotary(q, rotary), apply_grid_rotary(k, rotary)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return self.out(attn.transpose(1, 2).flatten(2))


class WanBlock:
    """x += g * SelfAttn(mod(norm x)); x += CrossAttn(norm x, text); x += g * FFN(mod(norm x))."""

    def __init__(self, config: WanDitConfig, dtype: torch.dtype, device: str | torch.device):
        dim, wide = config.inner_dim, wide_dtype(dtype)
        self.eps = config.eps
        self.self_attn = WanAttention(config, dtype, device)
        self.cross_attn = WanAttention(config, dtype, device)
        self.cross_norm = (
            (
                torch.zeros(dim, dtype=wide, device=device),
                torch.zeros(dim, dtype=wide, device=device),
            )
            if config.cross_attn_norm
            else None
        )
        self.ffn_in = Linear(config.ffn_dim, dim, dtype, device)
        self.ffn_out = Linear(dim, config.ffn_dim, dtype, device)
        self.modulation = torch.zeros(1, 6, dim, dtype=wide, device=device)  # scale_shift_table

    def targets(self) -> dict[str, torch.Tensor]:
        out = {"scale_shift_table": self.modulation}
        out.update({f"attn1.{k}": v for k, v in self.self_attn.targets().items()})
        out.update({f"attn2.{k}": v for k, v in self.cross_attn.targets().items()})
        if self.cross_norm is not None:
            out.update({"norm2.weight": self.cross_norm[0], "norm2.bias": self.cross_norm[1]})
        out.update(self.ffn_in.targets("ffn.net.0.proj"))
        out.update(self.ffn_out.targets("ffn.net.2"))
        return out

    def __call__(
        self,
        x: torch.Tensor,
        text: torch.Tensor,
        modulation: torch.Tensor,
        rotary: GridRotary,
    ) -> torch.Tensor:
        """x [batch, tokens, dim], text [batch, text_tokens, dim], modulation [batch, 6, dim]."""
        dtype, wide = x.dtype, self.modulation.dtype
        table = self.modulation + modulation.to(wide)
        shift, scale, gate, ffn_shift, ffn_scale, ffn_gate = table.unsqueeze(2).unbind(1)

        h = (layer_norm(x, self.eps) * (1 + scale) + shift).to(dtype)
        x = (x.to(wide) + self.self_attn(h, h, rotary) * gate).to(dtype)

        h = x if self.cross_norm is None else layer_norm(x, self.eps, *self.cross_norm).to(dtype)
        x = x + self.cross_attn(h, text, None)

        h = (layer_norm(x, self.eps) * (1 + ffn_scale) + ffn_shift).to(dtype)
        ff = self.ffn_out(F.gelu(self.ffn_in(h), approximate="tanh"))
        return (x.to(wide) + ff.to(wide) * ffn_gate).to(dtype)
