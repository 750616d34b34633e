"""Multi-head latent attention: low-rank q and kv projections, a latent + RoPE row per token,
and absorbed-matrix attention over the rows the indexer selected.

Owns the attention weights and math; never stores rows (the cache does) or picks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.models.linear import Linear, plain_linear
from loom_runtime.models.norm import rms_norm
from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.indexer import Selection
from loom_runtime.models.sparse_mla.rotary import PairTables, rotate_pairs

LORA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm (not the config's rms_norm_eps)


@dataclass(frozen=True)
class Queries:
    """One forward's queries: the q low-rank residual (the indexer reads it too) and the heads."""

    resid: torch.Tensor  # [T, q_lora_rank], after q_a_layernorm
    nope: torch.Tensor  # [T, heads, qk_nope_head_dim]
    rope: torch.Tensor  # [T, heads, qk_rope_head_dim], rotated


@dataclass(frozen=True)
class PartialAttention:
    """Attention of queries over one part of their selected rows, still in the latent space."""

    latent: torch.Tensor  # [T, heads, kv_lora_rank], float32 or wider: softmax-weighted rows
    lse: torch.Tensor  # [T, heads]: log-sum-exp of the part's scores, −inf if it had none


class MlaAttention:
    """Keys and values never leave the latent space: q_nope is absorbed into it through kv_b's
    key half, and the output leaves it through kv_b's value half, so the rows read per query
    are the cached latent + RoPE rows themselves."""

    def __init__(self, config: SparseMlaConfig, dtype: torch.dtype, device: str | torch.device):
        self.config = config
        c = config
        heads, h = c.num_attention_heads, c.hidden_size

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.q_a = zeros(c.q_lora_rank, h)
        self.q_a_norm = zeros(c.q_lora_rank)
        self.q_b = zeros(heads * c.qk_head_dim, c.q_lora_rank)
        self.kv_a = zeros(c.kv_lora_rank + c.qk_rope_head_dim, h)
        self.kv_a_norm = zeros(c.kv_lora_rank)
        self.kv_b = zeros(heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
        self.o = zeros(h, heads * c.v_head_dim)
        self.scale = c.qk_head_dim**-0.5
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode
        self.invariant = False  # batch-invariant mode: each head's projection through `linear`

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `self_attn.`) -> the tensor it fills."""
        return {
            "q_a_proj.weight": self.q_a,
            "q_a_layernorm.weight": self.q_a_norm,
            "q_b_proj.weight": self.q_b,
            "kv_a_proj_with_mqa.weight": self.kv_a,
            "kv_a_layernorm.weight": self.kv_a_norm,
            "kv_b_proj.weight": self.kv_b,
            "o_proj.weight": self.o,
        }

    def queries(self, h: torch.Tensor, rope: PairTables) -> Queries:
        c = self.config
        resid = rms_norm(self.linear(h, self.q_a, None), self.q_a_norm, LORA_NORM_EPS)
        q = self.linear(resid, self.q_b, None).view(-1, c.num_attention_heads, c.qk_head_dim)
        nope, rot = torch.split(q, [c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        return Queries(resid=resid, nope=nope, rope=rotate_pairs(rot, rope))

    def latent(self, h: torch.Tensor, rope: PairTables) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows to cache for tokens h ([T, hidden]): (latent [T, rank], RoPE key [T, r])."""
        c = self.config
        kv = self.linear(h, self.kv_a, None)
        latent, rot = torch.split(kv, [c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = rms_norm(latent, self.kv_a_norm, LORA_NORM_EPS)
        return latent, rotate_pairs(rot[:, None], rope)[:, 0]

    def attend(self, q: Queries, rows: LayerRows, selection: Selection) -> torch.Tensor:
        """Each query over its selected rows only -> the attention output [T, hidden]."""
        scores, latent = self._scores(q, rows, selection)
        softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
        probs = scores.softmax(dim=-1, dtype=softmax_dtype).to(scores.dtype)
        return self.project(torch.einsum("thk,tkr->thr", probs, latent))

    def partial(self, q: Queries, rows: LayerRows, selection: Selection) -> PartialAttention:
        """Attention over this part of the selected rows only (a DCP rank's shard), with the
        log-sum-exp that lets parts be merged; a query that selected none of them gets
        LSE −inf and a zero output."""
        scores, latent = self._scores(q, rows, selection)
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        lse = torch.logsumexp(scores, dim=-1)  # [T, heads]
        empty = torch.isneginf(lse)
        probs = torch.exp(scores - torch.where(empty, torch.zeros_like(lse), lse)[..., None])
        out = torch.einsum("thk,tkr->thr", probs, latent.to(probs.dtype))
        return PartialAttention(latent=out, lse=lse)

    def project(self, out_latent: torch.Tensor) -> torch.Tensor:
        """Latent-space outputs [T, heads, kv_lora_rank] -> through kv_b's value half and o."""
        c = self.config
        kv_b = self.kv_b.view(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, -1)
        value_up = kv_b[:, c.qk_nope_head_dim :]
        out_latent = out_latent.to(value_up.dtype)
        if self.invariant:
            out = self._heads(out_latent, value_up)
        else:
            out = torch.einsum("thr,hvr->thv", out_latent, value_up)
        return self.linear(out.flatten(1), self.o, None)

    def _heads(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Batch-invariant mode: each head's rows x [T, heads, in] through its own matrix
        (`weight` [heads, out, in]) with `linear` -> [T, heads, out]."""
        return torch.stack([self.linear(x[:, i], w, None) for i, w in enumerate(weight)], dim=1)

    def _scores(
        self, q: Queries, rows: LayerRows, selection: Selection
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked scores [T, heads, k] of the selected rows, and their latent rows [T, k, rank]."""
        c = self.config
        kv_b = self.kv_b.view(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, -1)
        key_up = kv_b[:, : c.qk_nope_head_dim]
        latent = rows.latent[selection.indices]  # [T, k, rank]
        rope_keys = rows.rope_keys[selection.indices]  # [T, k, r]
        if self.invariant:
            q_latent = self._heads(q.nope, key_up.transpose(1, 2))
        else:
            q_latent = torch.einsum("thn,hnr->thr", q.nope, key_up)
        scores = torch.einsum("thr,tkr->thk", q_latent, latent)
        scores = (scores + torch.einsum("thd,tkd->thk", q.rope, rope_keys)) * self.scale
        return scores.masked_fill(~selection.valid[:, None, :], float("-inf")), latent
