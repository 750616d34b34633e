"""LayerHooks: the seam where a decoder layer's rows are stored and read, its top-k chosen, its
attention and FFN run; LocalHooks is the one-rank way (a whole SparseMlaCache, local compute).

Owns only that contract and its one-rank implementation; never communicates (the parallel
package implements the same hooks over process groups).
"""

from __future__ import annotations

from typing import Protocol

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows, SparseMlaCache
from loom_runtime.models.sparse_mla.ffn import MoeFfn, SwiGluMlp
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries
from loom_runtime.models.sparse_mla.rotary import PairTables


class LayerHooks(Protocol):
    """What a layer asks of the place it runs in; one object serves one forward."""

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        """Keep the new tokens' rows of `layer`; the rows this rank's queries attend over."""
        ...

    def select(
        self,
        indexer: Indexer,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        rows: LayerRows,
        positions: torch.Tensor,
    ) -> Selection:
        """The top-k rows (indices into `rows`) of each query at `positions`."""
        ...

    def attend(
        self, attention: MlaAttention, q: Queries, rows: LayerRows, selection: Selection
    ) -> torch.Tensor:
        """The attention output [T, hidden] of the queries over their selected rows."""
        ...

    def ffn(self, layer: int, ffn: MoeFfn | SwiGluMlp, h: torch.Tensor) -> torch.Tensor:
        """The FFN output of `layer` for the tokens h [T, hidden]."""
        ...


class LocalCompute:
    """Attention and FFN computed where the rows and experts are: every one-rank hooks'."""

    def attend(
        self, attention: MlaAttention, q: Queries, rows: LayerRows, selection: Selection
    ) -> torch.Tensor:
        return attention.attend(q, rows, selection)

    def ffn(self, layer: int, ffn: MoeFfn | SwiGluMlp, h: torch.Tensor) -> torch.Tensor:
        return ffn.forward(h)


class LocalHooks(LocalCompute):
    """One rank: every row in one SparseMlaCache, every expert local."""

    def __init__(self, cache: SparseMlaCache) -> None:
        self.cache = cache

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        return self.cache.write(layer, latent, rope_keys, index_keys)

    def select(
        self,
        indexer: Indexer,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        rows: LayerRows,
        positions: torch.Tensor,
    ) -> Selection:
        return indexer.select(h, q_resid, rope, rows.indexer_keys(), positions)
