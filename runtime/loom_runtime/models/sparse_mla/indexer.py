"""The DSA indexer: a small key per token, a score for every earlier token, top-k per query.

Owns the indexer's weights and the selection; never attends or stores its keys itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom_runtime.models.linear import Linear, plain_linear
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.rotary import PairTables, rotate_pairs

KEY_NORM_EPS = 1e-6  # the indexer's LayerNorm on its keys
SCORE_CHUNK_BYTES = 256 << 20  # a selection scores queries in chunks whose [T, heads, L] fit this


@dataclass(frozen=True)
class Selection:
    """The context rows each query attends to: [T, k] indices and whether each one is real.

    A query with fewer than k visible tokens gets padding entries (valid False).
    """

    indices: torch.Tensor  # [T, k] int64 into the sequence's cached rows
    valid: torch.Tensor  # [T, k] bool


class Indexer:
    """Scores are computed in float32 whatever the model dtype, as the reference does, so the
    same tokens are selected from the same weights."""

    def __init__(self, config: SparseMlaConfig, dtype: torch.dtype, device: str | torch.device):
        self.config = config
        heads, dim, h = config.index_n_heads, config.index_head_dim, config.hidden_size
        self.wq_b = torch.zeros(heads * dim, config.q_lora_rank, dtype=dtype, device=device)
        self.wk = torch.zeros(dim, h, dtype=dtype, device=device)
        self.k_norm_weight = torch.zeros(dim, dtype=dtype, device=device)
        self.k_norm_bias = torch.zeros(dim, dtype=dtype, device=device)
        self.weights_proj = torch.zeros(heads, h, dtype=dtype, device=device)
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `self_attn.indexer.`) -> the tensor it fills."""
        return {
            "wq_b.weight": self.wq_b,
            "wk.weight": self.wk,
            "k_norm.weight": self.k_norm_weight,
            "k_norm.bias": self.k_norm_bias,
            "weights_proj.weight": self.weights_proj,
        }

    def keys(self, h: torch.Tensor, rope: PairTables) -> torch.Tensor:
        """The rows to cache for tokens h ([T, hidden]) -> [T, index_head_dim]."""
        dim = self.config.index_head_dim
        k = F.layer_norm(
            self.linear(h, self.wk, None),
            (dim,),
            self.k_norm_weight,
            self.k_norm_bias,
            KEY_NORM_EPS,
        )
        return self._rotate(k[:, None], rope)[:, 0]

    def select(
        self,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        keys: torch.Tensor,
        positions: torch.Tensor,
    ) -> Selection:
        """Top-k of the context keys ([L, D]) for each query (h [T, hidden], q_resid [T, q_rank]).

        A query at position p sees keys 0..p; the score of key j sums, over indexer heads, a
        learnt per-token head weight times relu(q_head · k_j / sqrt(D)).
        """
        values, indices = self.best(h, q_resid, rope, keys, positions, None, self.config.index_topk)
        return Selection(indices=indices, valid=values > float("-inf"))

    def best(
        self,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        keys: torch.Tensor,
        positions: torch.Tensor,
        key_positions: torch.Tensor | None,
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The min(k, L) best scores per query and their indices into `keys` ([T, k] each,
        −inf for padding), scored in query chunks so memory stays bounded on long prompts
        (`scores` of one chunk: [chunk, heads, L] float32 within SCORE_CHUNK_BYTES)."""
        per_query = self.config.index_n_heads * max(1, keys.shape[0]) * 4
        chunk = max(1, SCORE_CHUNK_BYTES // per_query)
        values, indices = [], []
        for at in range(0, h.shape[0], chunk):
            part = slice(at, at + chunk)
            tables = PairTables(cos=rope.cos[part], sin=rope.sin[part])
            scores = self.scores(h[part], q_resid[part], tables, keys, positions[part],
                                 key_positions)  # fmt: skip
            ranked = scores.sort(dim=-1, descending=True, stable=True)
            values.append(ranked.values[:, :k])
            indices.append(ranked.indices[:, :k])
        return torch.cat(values), torch.cat(indices)

    def scores(
        self,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        keys: torch.Tensor,
        positions: torch.Tensor,
        key_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T, L] float32 scores of keys ([L, D], at `key_positions`, default 0..L-1) for the
        queries at `positions`; −inf for keys after their query. A DCP rank scores its shard."""
        c = self.config
        heads = c.index_n_heads
        q = self.linear(q_resid, self.wq_b, None).view(-1, heads, c.index_head_dim)
        q = self._rotate(q, rope)
        per_head = torch.matmul(q.float()[None], keys.float().T[None, None])  # [1, T, H, L]
        per_head = F.relu(per_head * c.index_head_dim**-0.5)
        weights = self.linear(h, self.weights_proj, None).float() * heads**-0.5  # [T, H]
        scores = torch.matmul(weights[None, :, None, :], per_head)[0, :, 0]  # [T, L]
        if key_positions is None:
            key_positions = torch.arange(keys.shape[0], device=keys.device)
        future = key_positions[None, :] > positions[:, None]
        return scores.masked_fill(future, float("-inf"))

    def _rotate(self, x: torch.Tensor, rope: PairTables) -> torch.Tensor:
        """RoPE on the first qk_rope_head_dim dims of each head; the rest pass through."""
        r = self.config.qk_rope_head_dim
        return torch.cat((rotate_pairs(x[..., :r], rope), x[..., r:]), dim=-1)


def top_k(scores: torch.Tensor, k: int) -> Selection:
    """The min(k, L) best of [T, L] scores per query; −inf ones are padding (valid False).

    Stable: among equal scores (relu makes exact zeros common) the earlier key wins, so a
    chunked prefill selects what one whole prefill does, and a DCP rank's local best are in
    the order a single rank would rank them.
    """
    ranked = scores.sort(dim=-1, descending=True, stable=True)
    k = min(k, scores.shape[-1])
    return Selection(indices=ranked.indices[:, :k], valid=ranked.values[:, :k] > float("-inf"))
