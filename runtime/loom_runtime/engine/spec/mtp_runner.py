"""The model runner of MTP speculation: the sparse-mla trunk and its first MTP layer over one
paged latent cache, whose blocks hold the MTP layer's rows beside the trunk's.

Owns the three forwards of a speculative step (drafts, the trunk over every work, the MTP rows
of the kept positions) and, per running request, the MTP layer's output at its last kept
position (what the next step's first draft reads); never samples or decides acceptance
(engine/spec/forward.py does) and never changes a block table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from loom_runtime.engine.runner import ModelRunner, TokenWork
from loom_runtime.errors import SpeculativeConfigError
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCache, LatentKVCacheSpec
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.causal_lm import CausalLM, DecoderConfig
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.hisparse_hooks import HiSparseHooks
from loom_runtime.models.sparse_mla.paged_hooks import PagedHooks

MTP_LAYERS = 1
"""MTP layers a step runs (and caches rows for): the first, as vLLM's DeepSeek MTP drafts every
token with it; GLM-5-class checkpoints have one."""


def mtp_kv_spec(
    config: DecoderConfig,
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype,
    fp8: Fp8Format | None,
) -> LatentKVCacheSpec:
    """The paged cache of a speculating engine: the trunk's rows and the MTP layer's."""
    if not isinstance(config, SparseMlaConfig):
        raise SpeculativeConfigError(f"MTP speculation needs a sparse-mla model, not {config!r}")
    return config.kv_spec(block_size, num_blocks, dtype, fp8, mtp_layers=MTP_LAYERS)


class Drafter(Protocol):
    """Proposes each speculative work's drafts (up to its draft_tokens; () when it has none)."""

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]: ...


@dataclass(frozen=True)
class TrunkOutput:
    """One trunk forward: per work its logits (a verify's every row [n, vocab], the last row
    [vocab] of a work that wants logits, else None) and the final-normed states of all T
    tokens (None: they stayed on the ranks that computed them, engine/ranks/ranked_runner.py)."""

    logits: list[torch.Tensor | None]
    normed: torch.Tensor | None  # [T, hidden]
    query_start: list[int]  # work i's tokens are normed[query_start[i]:query_start[i + 1]]


class SpecRunner(Drafter, Protocol):
    """The three forwards of a speculative step (MtpRunner on one rank, RankedRunner on a
    worker's ranks): drafts, the trunk over every work, the MTP rows of the kept positions."""

    def trunk(self, works: Sequence[TokenWork]) -> TrunkOutput: ...

    def extend(
        self, works: Sequence[TokenWork], trunk: TrunkOutput, next_ids: Sequence[tuple[int, ...]]
    ) -> None: ...


class MtpRunner:
    """Runs a SparseMlaCausalLM's trunk and MTP layer over `cache` (allocated from
    `mtp_kv_spec`: a paged latent cache, or HiSparse's two tiers). Counts trunk tokens and
    forwards like ModelRunner.

    Under HiSparse the draft forwards read their context straight from the host tier, never
    through a hot buffer: they read (and write) scratch rows, which a hot buffer would keep
    after `extend` overwrote them. The trunk and `extend` use the hot buffers as a decode does."""

    def __init__(self, model: CausalLM, cache: LatentKVCache | HiSparseKVCache) -> None:
        if not isinstance(model, SparseMlaCausalLM) or not model.model.mtp:
            raise SpeculativeConfigError("MTP speculation needs a sparse-mla model with MTP layers")
        self.base = ModelRunner(model, cache)
        self.model = model.model
        self.layer = self.model.mtp[0]
        self.cache = cache
        self._last: dict[str, torch.Tensor] = {}  # request id -> MTP output at its last kept row

    @property
    def tokens_run(self) -> int:
        return self.base.tokens_run

    def release(self, request_id: str) -> None:
        """The request's blocks were freed: its MTP state goes with them."""
        self._last.pop(request_id, None)

    @property
    def num_tracked(self) -> int:
        """Requests holding an MTP state now (bounded by the running set)."""
        return len(self._last)

    # --- drafts -------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        """The MTP layer's drafts: the first from the output kept at the work's last position,
        draft j + 1 from a scratch row at position start + j - 1 (the next verify's trunk rows
        overwrite nothing of it that is kept: `extend` writes the real rows afterwards)."""
        want = {
            i: w.draft_tokens
            for i, w in enumerate(works)
            if w.draft_tokens > 0 and w.request_id in self._last
        }
        drafts: dict[int, list[int]] = {i: [] for i in want}
        active = list(want)
        if active:
            hidden = torch.stack([self._last[works[i].request_id] for i in active])
            for i, t in zip(active, self._argmax(hidden), strict=True):
                drafts[i].append(t)
        j = 1
        while active:
            keep = [n for n, i in enumerate(active) if want[i] > j]
            if not keep:
                break
            active = [active[n] for n in keep]
            steps = [
                TokenWork(
                    request_id=works[i].request_id,
                    token_ids=(drafts[i][-1],),
                    start=works[i].start + j - 1,
                    table=works[i].table,
                    want_logits=False,
                )
                for i in active
            ]
            batch = self.base.build_batch(steps)
            hooks = self._hooks(batch, hot=False)
            hidden = self.layer.forward(hidden[keep], batch.input_ids, batch.positions, hooks)
            for i, t in zip(active, self._argmax(hidden), strict=True):
                drafts[i].append(t)
            j += 1
        return [tuple(drafts.get(i, ())) for i in range(len(works))]

    def _hooks(self, batch: ForwardBatch, hot: bool = True) -> PagedHooks | HiSparseHooks:
        """The forward's hooks: over the paged cache, or over HiSparse's tiers (with each
        request's hot buffers, or none: read from the host tier)."""
        if isinstance(self.cache, LatentKVCache):
            return PagedHooks(self.cache, batch)
        rows = [self.cache.hot_rows(r) if hot else None for r in batch.request_ids]
        return HiSparseHooks(self.cache, batch, rows)

    def _argmax(self, hidden: torch.Tensor) -> list[int]:
        return [int(t) for t in torch.argmax(self.layer.logits(hidden), dim=-1).tolist()]

    # --- the trunk ----------------------------------------------------------------------------

    @torch.inference_mode()
    def trunk(self, works: Sequence[TokenWork]) -> TrunkOutput:
        """One trunk forward over every work (a verify's token_ids hold its drafts)."""
        batch = self.base.build_batch(works)
        self.base.set_threads(batch.num_tokens)
        hidden = self.model.hidden_states(batch.input_ids, batch.positions, self._hooks(batch))
        normed = self.model.normed(hidden)
        self.base.tokens_run += batch.num_tokens
        self.base.forwards += 1
        qs = batch.query_start
        spans = [
            range(qs[i], qs[i + 1])
            if w.draft_tokens
            else range(qs[i + 1] - 1, qs[i + 1])
            if w.want_logits
            else range(0)
            for i, w in enumerate(works)
        ]
        rows = [r for span in spans for r in span]
        logits = self.model.head(normed[rows]) if rows else normed.new_zeros(0)
        out: list[torch.Tensor | None] = []
        at = 0
        for w, span in zip(works, spans, strict=True):
            n = len(span)
            out.append(None if not n else logits[at : at + n] if w.draft_tokens else logits[at])
            at += n
        return TrunkOutput(out, normed, qs)

    # --- the MTP rows of kept positions -------------------------------------------------------

    @torch.inference_mode()
    def extend(
        self, works: Sequence[TokenWork], trunk: TrunkOutput, next_ids: Sequence[tuple[int, ...]]
    ) -> None:
        """Write the MTP layer's rows at each work's kept positions start..start + n - 1 (n =
        len(next_ids[i]): the tokens after them) from the trunk's states, and keep the output
        at the last one for the next drafts. Works with no kept positions are skipped."""
        steps: list[TokenWork] = []
        rows: list[int] = []
        for i, (w, ids) in enumerate(zip(works, next_ids, strict=True)):
            if not ids:
                continue
            steps.append(TokenWork(w.request_id, ids, w.start, w.table, want_logits=False))
            first = trunk.query_start[i]
            rows.extend(range(first, first + len(ids)))
        if not steps:
            return
        if trunk.normed is None:
            raise ValueError("extend needs the trunk's states: this runner's own trunk output")
        batch = self.base.build_batch(steps)
        hooks = self._hooks(batch)
        out = self.layer.forward(trunk.normed[rows], batch.input_ids, batch.positions, hooks)
        for n, w in enumerate(steps):
            self._last[w.request_id] = out[batch.query_start[n + 1] - 1].clone()
