"""SparseMlaCausalLM: the sparse-mla model behind the engine's CausalLM protocol — one
ForwardBatch of many sequences over the paged latent KV cache.

Owns only that adaptation (PagedHooks into the one-sequence model's trunk); never schedules,
and leaves SparseMlaForCausalLM's one-sequence path as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from loom_runtime.kv.cache import KVStore
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.hisparse_hooks import HiSparseHooks
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.models.sparse_mla.paged_hooks import PagedHooks


class SparseMlaCausalLM:
    """The engine's view of a SparseMlaForCausalLM (`model`, whose weights it shares)."""

    def __init__(self, model: SparseMlaForCausalLM) -> None:
        self.model = model
        self.config: SparseMlaConfig = model.config

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def set_batch_invariant(self, on: bool) -> None:
        """The model's batch-invariant mode (SparseMlaForCausalLM.set_batch_invariant)."""
        self.model.set_batch_invariant(on)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVStore) -> torch.Tensor:
        """Logits [len(batch.logits_indices), vocab]; writes every token's rows first."""
        hooks: PagedHooks | HiSparseHooks
        if isinstance(kv, LatentKVCache):
            width = self.config.index_topk if self.model.invariant else None
            hooks = PagedHooks(kv, batch, width)
        elif isinstance(kv, HiSparseKVCache):
            if len(batch.request_ids) != batch.num_seqs:
                raise ValueError("a HiSparse forward needs the request id of every sequence")
            hooks = HiSparseHooks(kv, batch, [kv.hot_rows(r) for r in batch.request_ids])
        else:
            raise TypeError(
                f"sparse-mla runs over a LatentKVCache or HiSparseKVCache, not {type(kv).__name__}"
            )
        hidden = self.model.hidden_states(batch.input_ids, batch.positions, hooks)
        return self.model.logits(hidden.index_select(0, batch.logits_indices))

    def targets(self) -> dict[str, torch.Tensor]:
        """Every Hugging Face tensor name the model reads -> the tensor (view) it fills (what a
        weight push must send; load_state copies into the same views)."""
        return self.model.targets()

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        self.model.load_state(tensors, strict)
