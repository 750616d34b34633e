"""attend_selected: attention that reads only the rows its queries selected (Hybrid HiSparse:
the context's rows are in a host tier, and only the selected ones come to the device).

Owns the packing of each sequence's selected rows and the remapping of the selection onto
them; never fetches rows (its caller's `rows_of` does) or selects them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.indexer import Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries

RowsOf = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""rows_of(i, wanted): sequence i's latent and RoPE rows at its sorted local positions."""


def attend_selected(
    attention: MlaAttention,
    q: Queries,
    selection: Selection,
    spans: Sequence[slice],
    starts: Sequence[int],
    rows_of: RowsOf,
) -> torch.Tensor:
    """The attention output of the queries over their selected rows. Sequence i's queries are
    rows `spans[i]` of `q`, its context indices start at starts[i] in the selection's index
    space. Each sequence's distinct selected rows are packed end to end and the selection is
    remapped onto them, so one attention call reads exactly the rows, in the order, that
    attending over every row would."""
    latents: list[torch.Tensor] = []
    ropes: list[torch.Tensor] = []
    indices = torch.zeros_like(selection.indices)
    base = 0
    for i, (span, start) in enumerate(zip(spans, starts, strict=True)):
        local = selection.indices[span] - start
        wanted = torch.unique(local[selection.valid[span]])  # sorted positions
        latent, rope = rows_of(i, wanted)
        at = torch.searchsorted(wanted, local).clamp(max=max(0, wanted.numel() - 1))
        indices[span] = at + base  # padding entries land anywhere: they stay masked
        base += int(wanted.numel())
        latents.append(latent)
        ropes.append(rope)
    packed = LayerRows(latent=torch.cat(latents), rope_keys=torch.cat(ropes), index_keys=None)
    return attention.attend(q, packed, Selection(indices=indices, valid=selection.valid))
