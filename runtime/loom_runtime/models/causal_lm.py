"""The CausalLM protocol: what the engine's model runner may call on any model family.

Declares the contract only; never implements a family or loads weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from loom_runtime.kv.cache import KVSpec, KVStore
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.batch import ForwardBatch


class DecoderConfig(Protocol):
    """What the engine reads of any family's config (ModelConfig, SparseMlaConfig)."""

    @property
    def model_type(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_position_embeddings(self) -> int: ...

    @property
    def num_parameters(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def kv_spec(
        self,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = ...,
        fp8: Fp8Format | None = ...,
    ) -> KVSpec:
        """The family's paged KV cache shape (its bytes per block size the pool); `fp8`
        stores it as packed e4m3 rows with fp32 scales, gathered in `dtype`."""
        ...


class CausalLM(Protocol):
    """A decoder that reads and writes a paged KV cache, one ForwardBatch per step."""

    @property
    def config(self) -> DecoderConfig: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def forward(self, batch: ForwardBatch, kv: KVStore) -> torch.Tensor:
        """Logits [len(batch.logits_indices), vocab]: float32, or float64 for a float64 model.

        Writes every scheduled token's K/V into its slot before attending; `kv` is the cache
        its config's `kv_spec` allocated (a model refuses any other with TypeError).
        """
        ...

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy Hugging Face-named tensors into the weights in place (same shapes, new values).

        Checks every name and shape before changing anything; raises CheckpointError.
        """
        ...
