"""The CausalLM protocol: what the engine's model runner may call on any model family.

Declares the contract only; never implements a family or loads weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.config import ModelConfig


class CausalLM(Protocol):
    """A decoder that reads and writes a paged KV cache, one ForwardBatch per step."""

    config: ModelConfig

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def forward(self, batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
        """Logits [len(batch.logits_indices), vocab]: float32, or float64 for a float64 model.

        Writes every scheduled token's K/V into its slot before attending.
        """
        ...

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy Hugging Face-named tensors into the weights in place (same shapes, new values).

        Checks every name and shape before changing anything; raises CheckpointError.
        """
        ...
