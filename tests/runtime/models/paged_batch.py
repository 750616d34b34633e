"""The test double of the engine's KV manager + runner's layout step: grow each sequence's block
table from a free list (shuffled by the caller, so blocks are non-contiguous) and lay out one
ForwardBatch for a step's (sequence, new token ids) chunks. Shared by the paged-forward tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loom_runtime.models.batch import ForwardBatch


def paged_batch(
    chunks: Sequence[tuple[str, Sequence[int]]],
    tables: dict[str, list[int]],
    lengths: dict[str, int],
    free: list[int],
    block_size: int,
    last_logits_only: bool,
) -> ForwardBatch:
    """One ForwardBatch for `chunks`, taking blocks from `free` into `tables` and advancing
    `lengths`; logits of every new token, or of each chunk's last one."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    for seq, tokens in chunks:
        start = lengths.get(seq, 0)
        end = start + len(tokens)
        table = tables.setdefault(seq, [])
        while len(table) * block_size < end:
            table.append(free.pop())
        slots.extend(
            table[p // block_size] * block_size + p % block_size for p in range(start, end)
        )
        positions.extend(range(start, end))
        ids.extend(tokens)
        query_start.append(len(ids))
        lengths[seq] = end
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        query_start=query_start,
        context_lens=[lengths[seq] for seq, _ in chunks],
        block_tables=[list(tables[seq]) for seq, _ in chunks],
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        logits_indices=(
            torch.tensor(query_start[1:]) - 1 if last_logits_only else torch.arange(len(ids))
        ),
        request_ids=tuple(seq for seq, _ in chunks),
    )
