"""SparseMlaForCausalLM: embeddings, the decoder layers, the final norm and head, MTP weights.

Runs one sequence's new tokens against its SparseMlaCache; never schedules or reads files.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from loom_runtime.models.linear import Linear, invariant_linear, plain_linear
from loom_runtime.models.norm import rms_norm
from loom_runtime.models.sparse_mla.cache import SparseMlaCache
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.hooks import LayerHooks, LocalHooks
from loom_runtime.models.sparse_mla.indexer import Selection
from loom_runtime.models.sparse_mla.layer import SparseMlaDecoderLayer
from loom_runtime.models.sparse_mla.mtp import MtpLayer
from loom_runtime.models.sparse_mla.rotary import pair_tables
from loom_runtime.models.weights import copy_weights

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class SparseMlaForCausalLM:
    """A GLM-5-class decoder. Weights start as zeros; `load_state` fills them. No autograd."""

    def __init__(
        self,
        config: SparseMlaConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        h, v = config.hidden_size, config.vocab_size
        self.embed_tokens = torch.zeros(v, h, dtype=dtype, device=device)
        self.final_norm = torch.zeros(h, dtype=dtype, device=device)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else torch.zeros(v, h, dtype=dtype, device=device)
        )
        layers = config.num_hidden_layers
        self.layers = [SparseMlaDecoderLayer(config, i, dtype, device) for i in range(layers)]
        self.mtp = [
            MtpLayer(config, layers + i, dtype, device)
            for i in range(config.num_nextn_predict_layers)
        ]
        self.linear: Linear = plain_linear
        self.invariant = False  # batch-invariant mode (set_batch_invariant)

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode on or off: every matmul against a weight (the layers', the
        router's, the experts', the heads', the MTP layers') as invariant_linear
        (models/linear.py), each head's latent projections one by one, the router's scores and
        the RoPE angles' cos and sin per element (models/elementwise.py), and every sequence's
        attention over a selection of index_topk rows, its padding masked."""
        self.linear = invariant_linear if on else plain_linear
        self.invariant = on
        for layer in [*self.layers, *(m.decoder for m in self.mtp)]:
            layer.set_batch_invariant(on)
        for m in self.mtp:
            m.linear, m.invariant = self.linear, on

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def new_cache(self, capacity: int) -> SparseMlaCache:
        """An empty cache for one sequence of up to `capacity` tokens, in the model's dtype."""
        return SparseMlaCache(self.config, capacity, self.dtype, self.device)

    def new_mtp_cache(self, capacity: int) -> SparseMlaCache:
        """An empty cache of the MTP layers' rows for one sequence of up to `capacity` tokens."""
        first = self.config.num_hidden_layers
        layers = range(first, first + len(self.mtp))
        return SparseMlaCache(self.config, capacity, self.dtype, self.device, layers)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: SparseMlaCache) -> torch.Tensor:
        """Logits [T, vocab] of T new tokens ([T] int64) that follow the cache's tokens.

        Covers a whole prompt, a prefill chunk and a decode step alike; commits the new
        tokens' rows to the cache. Float32 logits (float64 for a float64 model).
        """
        new = int(input_ids.shape[0])
        cache.check_room(new)
        positions = torch.arange(cache.length, cache.length + new, device=self.device)
        x = self.hidden_states(input_ids, positions, LocalHooks(cache))
        cache.advance(new)
        return self.logits(x)

    @torch.inference_mode()
    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hooks: LayerHooks
    ) -> torch.Tensor:
        """The trunk's output [T, hidden] for tokens input_ids ([T]) at `positions` ([T], any
        order: a PCP rank's share of a prompt), their rows kept by `hooks`."""
        c = self.config
        rope = pair_tables(positions, c.qk_rope_head_dim, c.rope_theta, self.dtype, self.invariant)
        x = F.embedding(input_ids.to(self.device), self.embed_tokens)
        selection: Selection | None = None
        for layer in self.layers:
            x, selection = layer.forward(x, rope, positions, hooks, selection)
        return x

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and head over trunk outputs [T, hidden] -> float32 (or float64) logits."""
        return self.head(self.normed(hidden))

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed trunk outputs: what the head reads and what an MTP layer drafts from."""
        return rms_norm(hidden, self.final_norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head over final-normed states -> float32 (or float64) logits."""
        logits = self.linear(normed, self.lm_head, None)
        return logits if logits.dtype == torch.float64 else logits.float()

    def targets(self) -> dict[str, torch.Tensor]:
        """Every Hugging Face tensor name this model reads -> the tensor (view) it fills."""
        out = {"model.embed_tokens.weight": self.embed_tokens, "model.norm.weight": self.final_norm}
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head
        layers = [layer.targets() for layer in self.layers] + [m.targets() for m in self.mtp]
        for i, names in enumerate(layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in names.items()})
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy checkpoint tensors in place; validates all names and shapes first (atomic)."""
        tied_head = self.config.tie_word_embeddings
        wanted = {
            n: t
            for n, t in tensors.items()
            if not n.endswith(_IGNORED_SUFFIXES) and not (tied_head and n == "lm_head.weight")
        }
        copy_weights(self.targets(), wanted, self.config.model_type, strict)
