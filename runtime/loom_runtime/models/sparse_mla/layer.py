"""One sparse-mla decoder layer: pre-norm MLA attention over indexer-selected rows, then an FFN.

Owns a layer's weights and its step; never allocates the cache or loads files.
"""

from __future__ import annotations

import torch

from loom_runtime.models.linear import invariant_linear, plain_linear
from loom_runtime.models.norm import rms_norm
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.ffn import MoeFfn, SwiGluMlp
from loom_runtime.models.sparse_mla.hooks import LayerHooks
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention
from loom_runtime.models.sparse_mla.rotary import PairTables


class SparseMlaDecoderLayer:
    """`full` layers run their indexer; `shared` layers attend to the previous full layer's
    selection. `sparse` layers use the MoE FFN, `dense` ones a plain SwiGLU MLP."""

    def __init__(
        self,
        config: SparseMlaConfig,
        layer: int,
        dtype: torch.dtype,
        device: str | torch.device,
        indexer_type: str | None = None,
        mlp_type: str | None = None,
    ) -> None:
        self.config = config
        self.layer = layer
        h = config.hidden_size
        indexer_type = indexer_type or config.indexer_types[layer]
        mlp_type = mlp_type or config.mlp_layer_types[layer]
        self.input_norm = torch.zeros(h, dtype=dtype, device=device)
        self.post_attention_norm = torch.zeros(h, dtype=dtype, device=device)
        self.attention = MlaAttention(config, dtype, device)
        self.indexer = Indexer(config, dtype, device) if indexer_type == "full" else None
        self.ffn: MoeFfn | SwiGluMlp = (
            MoeFfn(config, dtype, device)
            if mlp_type == "sparse"
            else SwiGluMlp(h, config.intermediate_size, dtype, device)
        )

    def set_batch_invariant(self, on: bool) -> None:
        """Every matmul of the layer against a weight as invariant_linear (models/linear.py),
        and its router's scores batch-invariant too, or torch's own."""
        linear = invariant_linear if on else plain_linear
        self.attention.linear, self.attention.invariant = linear, on
        if self.indexer is not None:
            self.indexer.linear = linear
        if isinstance(self.ffn, MoeFfn):
            self.ffn.set_batch_invariant(on)
        else:
            self.ffn.linear = linear

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `model.layers.N.`) -> the tensor (view) it fills."""
        out = {
            "input_layernorm.weight": self.input_norm,
            "post_attention_layernorm.weight": self.post_attention_norm,
        }
        out.update({f"self_attn.{k}": v for k, v in self.attention.targets().items()})
        if self.indexer is not None:
            out.update({f"self_attn.indexer.{k}": v for k, v in self.indexer.targets().items()})
        out.update({f"mlp.{k}": v for k, v in self.ffn.targets().items()})
        return out

    def forward(
        self,
        x: torch.Tensor,
        rope: PairTables,
        positions: torch.Tensor,
        hooks: LayerHooks,
        shared_selection: Selection | None,
    ) -> tuple[torch.Tensor, Selection]:
        """x [T, hidden] of the new tokens -> (x after this layer, the selection it used).

        `hooks` keep the rows and run selection, attention and FFN: one rank's LocalHooks,
        or a parallel plan's (PCP, DCP, EP)."""
        h = rms_norm(x, self.input_norm, self.config.rms_norm_eps)
        q = self.attention.queries(h, rope)
        latent, rope_keys = self.attention.latent(h, rope)
        index_keys = None if self.indexer is None else self.indexer.keys(h, rope)
        rows = hooks.rows(self.layer, latent, rope_keys, index_keys)
        if self.indexer is not None:
            selection = hooks.select(self.indexer, h, q.resid, rope, rows, positions)
        elif shared_selection is not None:
            selection = shared_selection
        else:
            raise ValueError(f"layer {self.layer} shares a selection but no full layer ran first")
        x = x + hooks.attend(self.attention, q, rows, selection)
        h = rms_norm(x, self.post_attention_norm, self.config.rms_norm_eps)
        return x + hooks.ffn(self.layer, self.ffn, h), selection
