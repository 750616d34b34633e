"""The MTP (multi-token prediction) layers' weights, stored after the trunk's in a checkpoint.

Holds the weights so a checkpoint loads whole and speculative decoding can use them later;
never runs (no forward here yet).
"""

from __future__ import annotations

import torch

from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.layer import SparseMlaDecoderLayer


class MtpLayer:
    """DeepSeek-V3-style MTP block: norms of the embedding and the trunk's hidden state, their
    projection back to hidden size, one decoder layer (own indexer, MoE FFN) and its own head."""

    def __init__(
        self, config: SparseMlaConfig, layer: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        h, v = config.hidden_size, config.vocab_size
        self.embed_tokens = torch.zeros(v, h, dtype=dtype, device=device)
        self.enorm = torch.zeros(h, dtype=dtype, device=device)
        self.hnorm = torch.zeros(h, dtype=dtype, device=device)
        self.eh_proj = torch.zeros(h, 2 * h, dtype=dtype, device=device)
        self.head_norm = torch.zeros(h, dtype=dtype, device=device)
        self.head = torch.zeros(v, h, dtype=dtype, device=device)
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
