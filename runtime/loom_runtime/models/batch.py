"""ForwardBatch: everything one model forward needs, built by the engine's runner.

A plain frozen record; the model reads it and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardBatch:
    """A mixed batch of prefill chunks and decode tokens, flattened over T scheduled tokens.

    Sequence i owns tokens query_start[i]:query_start[i+1]; after this forward its KV holds
    context_lens[i] tokens (cached + computed earlier + these), stored in block_tables[i].
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token in its sequence
    query_start: list[int]  # [B + 1] offsets into T (cu_seqlens)
    context_lens: list[int]  # [B] KV length of each sequence after this step
    block_tables: list[list[int]]  # [B][ceil(context_lens[i] / block_size)] physical block ids
    slot_mapping: torch.Tensor  # [T] int64 flat KV slot to write each token's K/V
    logits_indices: torch.Tensor  # [N] int64 rows of T whose logits the caller wants
    request_ids: tuple[str, ...] = ()  # [B] whose sequence each is (per-request device state)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
