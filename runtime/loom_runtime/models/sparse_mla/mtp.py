"""The MTP (multi-token prediction) layers: the draft model of MTP speculative decoding.

Owns an MTP layer's weights and its forward (trunk hidden state + next token -> the logits of
the token after); never decides what is drafted or accepted (models/sparse_mla/speculative.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom_runtime.models.linear import Linear, plain_linear
from loom_runtime.models.norm import rms_norm
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.hooks import LayerHooks
from loom_runtime.models.sparse_mla.layer import SparseMlaDecoderLayer
from loom_runtime.models.sparse_mla.rotary import pair_tables


class MtpLayer:
    """DeepSeek-V3-style MTP block: norms of the embedding and the trunk's hidden state, their
    projection back to hidden size, one decoder layer (own indexer, MoE FFN) and its own head.

    At position i it reads the trunk's (final-normed) hidden state of token i and the embedding
    of token i+1, and predicts token i+2; its own KV rows sit at position i (as vLLM lays them)."""

    def __init__(
        self, config: SparseMlaConfig, layer: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        self.config = config
        self.layer = layer
        h, v = config.hidden_size, config.vocab_size
        self.embed_tokens = torch.zeros(v, h, dtype=dtype, device=device)
        self.enorm = torch.zeros(h, dtype=dtype, device=device)
        self.hnorm = torch.zeros(h, dtype=dtype, device=device)
        self.eh_proj = torch.zeros(h, 2 * h, dtype=dtype, device=device)
        self.head_norm = torch.zeros(h, dtype=dtype, device=device)
        self.head = torch.zeros(v, h, dtype=dtype, device=device)
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode
        self.invariant = False  # batch-invariant mode: the RoPE tables too
        self.decoder = SparseMlaDecoderLayer(
            config, layer, dtype, device, indexer_type="full", mlp_type="sparse"
        )

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `model.layers.N.`) -> the tensor it fills."""
        out = {
            "embed_tokens.weight": self.embed_tokens,
            "enorm.weight": self.enorm,
            "hnorm.weight": self.hnorm,
            "eh_proj.weight": self.eh_proj,
            "shared_head.norm.weight": self.head_norm,
            "shared_head.head.weight": self.head,
        }
        out.update(self.decoder.targets())
        return out

    @torch.inference_mode()
    def forward(
        self,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        positions: torch.Tensor,
        hooks: LayerHooks,
    ) -> torch.Tensor:
        """This layer's output [T, hidden] for trunk states `hidden` ([T, hidden]) of the tokens
        at `positions` ([T]) and the ids of the tokens after them (`next_ids`, [T]); its rows
        kept by `hooks`. The output feeds `logits` and, as the hidden state, the next draft."""
        eps = self.config.rms_norm_eps
        embeds = F.embedding(next_ids.to(hidden.device), self.embed_tokens)
        # position 0's input is masked, as vLLM's DeepSeek MTP does (it is never a draft's)
        embeds = torch.where(positions.unsqueeze(-1) == 0, torch.zeros_like(embeds), embeds)
        x = self.linear(
            torch.cat([rms_norm(embeds, self.enorm, eps), rms_norm(hidden, self.hnorm, eps)], -1),
            self.eh_proj,
            None,
        )
        c = self.config
        rope = pair_tables(
            positions, c.qk_rope_head_dim, c.rope_theta, hidden.dtype, self.invariant
        )
        x, _ = self.decoder.forward(x, rope, positions, hooks, None)
        return x

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The shared head over this layer's outputs -> float32 (or float64) logits."""
        logits = self.linear(rms_norm(x, self.head_norm, self.config.rms_norm_eps), self.head, None)
        return logits if logits.dtype == torch.float64 else logits.float()
