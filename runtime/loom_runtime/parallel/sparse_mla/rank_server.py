"""The program every rank of a parallel sparse-mla worker runs under the engine: join the
layout's groups, load the checkpoint (each rank keeps its EP share of the experts), then run
the engine's steps as they arrive over its pipe: each scheduled prompt chunk on its
ParallelSequence, then the step's decodes as one batched forward (without PCP and DCP the
chunks join that forward), the same calls on every rank, in the same order. Under MTP
speculation (`drafts`) a step first writes the MTP rows of the previous step's kept positions
(the engine's verdict), then proposes the drafts the engine asks for, then runs the trunk over
the works (a verify: its token and drafts, every row's logits back).

Owns the rank's sequences (one ParallelSequence per request, dropped when the engine releases
it) and their draft states, the wire records of a step and of a weight load, and, for a P/D
prefill, the copies of each step's new rows sent back to the engine (whose pool the KV
connector moves); never schedules, never samples or accepts drafts (the engine does, in its
own process), never decides which request runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import TierCounters
from loom_runtime.models.sparse_mla.loader import load_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.ranks import RankContext, serve_steps
from loom_runtime.parallel.sparse_mla.ep_moe import shard_experts
from loom_runtime.parallel.sparse_mla.plan import DcpBackend, join_groups
from loom_runtime.parallel.sparse_mla.sequence import (
    ParallelSequence,
    batch_states,
    draft,
    write_mtp,
)
from loom_runtime.parallel.sparse_mla.store import HeldRows
from loom_runtime.parallel.sparse_mla.tiered_store import TieredStore


@dataclass(frozen=True)
class RankServeSpec:
    """What each rank loads and how it holds sequences."""

    checkpoint: str
    layout: ParallelLayout
    dtype: str  # torch dtype name: "float32", "float64", ...
    capacity: int  # rows a sequence may reach: the engine's max_model_len
    block_size: int
    dcp_backend: DcpBackend = "ag_rs"
    export_rows: bool = False  # send each step's new rows to the engine (its pool mirrors them)
    kv_fp8: Fp8Format | None = None  # rows rounded through fp8 as the engine's fp8 pool keeps them
    mtp: bool = False  # keep (and export) the MTP layer's rows beside the trunk's
    # MTP speculation on the ranks: they draft and verify (needs mtp). Without it, a P/D
    # prefill with mtp computes its prompts' MTP rows inline and never drafts.
    drafts: bool = False
    # A step's one-token decodes as one forward over their sequences (decode_batch); False:
    # one forward each, the baseline bench/ranked_batch.py measures against.
    batch_decodes: bool = True
    # Hybrid HiSparse (a decode role's hiSparse, DP × EP ranks): rows per layer of each
    # sequence's hot buffer; its rows in the host tier, its keys on the device. 0: off.
    hot_slots: int = 0


@dataclass(frozen=True)
class RankWork:
    """One sequence's share of a step: `token_ids` at positions start.. (start 0: a new
    sequence, replacing any earlier one of that id, as after a preemption). `prefix`: a new
    sequence that starts at a cached prefix, the rows of its tokens 0..start-1 (each rank
    keeps the ones it owns)."""

    request_id: str
    token_ids: tuple[int, ...]
    start: int
    want_logits: bool
    prefix: HeldRows | None = None
    next_id: int | None = None  # the token after token_ids, when known (the MTP rows read it)
    replica: int = 0  # the DP replica whose ranks hold the sequence and run the work
    draft_tokens: int = 0  # a verify: token_ids are its token and this many drafts


@dataclass(frozen=True)
class RankSettle:
    """The engine's verdict on a work of the previous step (MTP speculation): `next_ids`, the
    token after each of its kept positions start.. (fewer than it ran: drafts were rejected).
    The ranks write the MTP rows there and drop the rows after them."""

    request_id: str
    start: int
    next_ids: tuple[int, ...]


@dataclass(frozen=True)
class RankDraftAsk:
    """Up to `k` MTP drafts after a sequence (none until its first verdict is settled)."""

    request_id: str
    k: int
    replica: int = 0


@dataclass(frozen=True)
class RankStep:
    """One message of an engine step for the ranks, done in this order: release these
    sequences, settle the previous step's verdicts, propose these drafts, run these works."""

    works: tuple[RankWork, ...]
    release: tuple[str, ...] = ()
    settle: tuple[RankSettle, ...] = ()
    drafts: tuple[RankDraftAsk, ...] = ()


@dataclass(frozen=True)
class RankRows:
    """The rows one work's step wrote that this rank holds (an exporting rank's share)."""

    request_id: str
    rows: HeldRows


@dataclass(frozen=True)
class RankReply:
    """A rank's answer to a step. `logits`: the rows of its replica's works that wanted them,
    in order ([n, vocab]: a verify's every row, else its last; the replica's first rank only,
    None elsewhere). `drafts`: per draft ask of its replica, in order (its first rank only).
    `kv_tokens`/`kv_bytes`: the rows this rank holds for every live sequence, and their bytes
    in whole blocks. `rows`: with `export_rows`, the new rows of every work of its replica that
    this rank holds, when it is one of the replica's first DCP group (together they hold every
    token once); a settled verdict's rows (the MTP rows rewritten) come first."""

    logits: torch.Tensor | None
    kv_tokens: int
    kv_bytes: int
    sequences: int
    rows: tuple[RankRows, ...] = ()
    forwards: int = 0  # model forwards the step ran (its decodes batched count as one)
    drafts: tuple[tuple[int, ...], ...] = ()
    tiers: TierCounters | None = None  # HiSparse: the rank's tier counters, cumulative
    device_kv_bytes: int = 0  # HiSparse: its sequences' device keys and hot buffers


@dataclass(frozen=True)
class _Held:
    """A speculating sequence's trunk states from its last forward, kept for its verdict:
    final-normed rows [n, hidden] of positions first.. (a prompt chunk split or sharded over
    the ranks keeps only its last: its other MTP rows were written in its forward)."""

    first: int
    normed: torch.Tensor


@dataclass(frozen=True)
class RankLoad:
    """Replace the weights with a checkpoint's (a weight sync, drained or a keep swap: the live
    sequences keep their rows and go on under the new weights)."""

    checkpoint: str


@dataclass(frozen=True)
class RankLoaded:
    """Sent once the rank serves the new weights."""

    rank: int
    expert_bytes: int


@dataclass(frozen=True)
class RankReady:
    """Sent once the rank has joined its groups and loaded its weights."""

    rank: int
    kv_bytes_per_token: int  # rows of one token this rank holds, in bytes (DCP: a share)
    expert_bytes: int


class RankSequences:
    """One rank's live sequences and how a step's works run on them."""

    def __init__(self, ctx: RankContext, spec: RankServeSpec) -> None:
        self.rank = ctx.rank
        self.spec = spec
        self.plan = join_groups(
            spec.layout, ctx.rank, ctx.device, ctx.collective_timeout_s, spec.dcp_backend
        )
        dtype = getattr(torch, spec.dtype)
        self.model = load_sparse_mla(spec.checkpoint, dtype, ctx.device).model
        self.experts = shard_experts(self.model, self.plan.ep)
        self.live: dict[str, ParallelSequence] = {}
        self.tiers = TierCounters() if spec.hot_slots else None
        self._held: dict[str, _Held] = {}  # under MTP speculation, awaiting the verdict
        self._last: dict[str, torch.Tensor] = {}  # MTP output at the last kept position
        layout, coords = spec.layout, self.plan.coords
        self.replica = coords.dp
        first = coords.dp * layout.tp * layout.pcp  # the replica's first rank
        self.lead = ctx.rank == first
        # the replica's first DCP group holds every token of its sequences once
        self.exports = spec.export_rows and first in self.plan.dcp.ranks

    def ready(self) -> RankReady:
        probe = self._new_sequence(1)
        expert_bytes = sum(e.expert_bytes for e in self.experts.values())
        return RankReady(self.rank, probe.store.bytes_per_token, expert_bytes)

    def load(self, message: RankLoad) -> RankLoaded:
        """The checkpoint's weights, loaded whole and then sharded as at start (this rank's EP
        experts only); the old model serves until the new one is complete. Live sequences keep
        their rows (a keep swap; the engine re-prefills those it recomputes) and their MTP
        state: drafts proposed from it are only proposals, which the new trunk verifies."""
        model = load_sparse_mla(message.checkpoint, self.model.dtype, self.model.device).model
        self.plan.check(model.config)
        self.model, self.experts = model, shard_experts(model, self.plan.ep)
        for sequence in self.live.values():
            sequence.rebind(self.model, self.experts)
        return RankLoaded(self.rank, sum(e.expert_bytes for e in self.experts.values()))

    def handle(self, message: RankStep | RankLoad) -> RankReply | RankLoaded:
        return self.load(message) if isinstance(message, RankLoad) else self.step(message)

    def step(self, step: RankStep) -> RankReply:
        for request_id in step.release:
            self.live.pop(request_id, None)
            self._held.pop(request_id, None)
            self._last.pop(request_id, None)
        settled = self._settle([s for s in step.settle if s.request_id in self._held])
        drafts = self._draft([a for a in step.drafts if a.replica == self.replica])
        mine = tuple(w for w in step.works if w.replica == self.replica)
        logits, forwards = self._run_all(mine)
        self._pad_expert_exchanges(step.works, forwards)
        stores = [seq.store for seq in self.live.values()]
        ran = [(w.request_id, w.start, w.start + len(w.token_ids)) for w in mine]
        bs = self.spec.block_size
        return RankReply(
            logits=None if logits is None else logits.cpu(),
            kv_tokens=sum(s.kv_tokens for s in stores),
            kv_bytes=sum(s.block_bytes(self.spec.block_size) for s in stores),
            sequences=len(stores),
            rows=self._exported(settled + ran) if self.exports else (),
            forwards=forwards,
            drafts=drafts if self.lead else (),
            tiers=None if self.tiers is None else replace(self.tiers),
            device_kv_bytes=sum(s.device_bytes(bs) for s in stores if isinstance(s, TieredStore)),
        )

    def _settle(self, verdicts: Sequence[RankSettle]) -> list[tuple[str, int, int]]:
        """Write the MTP rows of each work's kept positions (those its forward left to the
        verdict), in one MTP-layer forward, and keep the output at each one's last; the spans
        (request, first, end) rewritten."""
        held = [self._held.pop(v.request_id) for v in verdicts]
        ids = [v.next_ids[h.first - v.start :] for v, h in zip(verdicts, held, strict=True)]
        for v, h, kept in zip(verdicts, held, ids, strict=True):
            if not kept or len(kept) > h.normed.shape[0]:
                raise RuntimeError(
                    f"rank {self.rank}: request {v.request_id!r}'s verdict keeps "
                    f"{len(v.next_ids)} positions from {v.start}, its forward held "
                    f"{h.normed.shape[0]} from {h.first}: the ranks fell out of step"
                )
        outputs = write_mtp(
            [self.live[v.request_id] for v in verdicts],
            [h.normed[: len(kept)] for h, kept in zip(held, ids, strict=True)],
            [torch.tensor(kept, dtype=torch.long) for kept in ids],
            [h.first for h in held],
        )
        self._last.update((v.request_id, out) for v, out in zip(verdicts, outputs, strict=True))
        return [(v.request_id, h.first, h.first + len(kept))
                for v, h, kept in zip(verdicts, held, ids, strict=True)]  # fmt: skip

    def _draft(self, asks: Sequence[RankDraftAsk]) -> tuple[tuple[int, ...], ...]:
        """Each ask's drafts, proposed together (none for a sequence with no verdict yet)."""
        ready = [a for a in asks if a.request_id in self._last]
        proposed = draft(
            [self.live[a.request_id] for a in ready],
            [self._last[a.request_id] for a in ready],
            [a.k for a in ready],
        )
        by_id = {a.request_id: tuple(d) for a, d in zip(ready, proposed, strict=True)}
        return tuple(by_id.get(a.request_id, ()) for a in asks)

    def _run_all(self, works: Sequence[RankWork]) -> tuple[torch.Tensor | None, int]:
        """Every work of a step (spec.batch_decodes): without PCP and DCP all in one batched
        forward, else the prompt chunks and verifies one by one and then every one-token
        decode in one batched forward. The logits rows of the works that want them, in the
        works' order (the replica's first rank only), and the number of forwards run."""
        rows: dict[int, torch.Tensor] = {}
        batched: list[int] = []
        for i, work in enumerate(works):
            seq = self._sequence(work)
            if self._batched(work):
                batched.append(i)
            else:
                rows[i] = self._run(seq, work)
        if batched:
            chunks = [torch.tensor(works[i].token_ids, dtype=torch.long) for i in batched]
            hidden = batch_states([self.live[works[i].request_id] for i in batched], chunks)
            at = 0
            for i, chunk in zip(batched, chunks, strict=True):
                part, at = hidden[at : at + len(chunk)], at + len(chunk)
                rows[i] = self._outputs(works[i], part, works[i].start)
        wanted = [rows[i] for i, w in enumerate(works) if w.want_logits or w.draft_tokens]
        return (torch.cat(wanted) if wanted and self.lead else None), self._forwards(works)

    def _outputs(self, work: RankWork, hidden: torch.Tensor, first: int) -> torch.Tensor:
        """The logits rows a work returns from its trunk outputs (positions first..): a
        verify's every row, else its last; under speculation its states wait for the verdict."""
        normed = self.model.normed(hidden)
        if self.spec.drafts:
            self._held[work.request_id] = _Held(first, normed)
        return self.model.head(normed if work.draft_tokens else normed[-1:])

    def _batched(self, work: RankWork) -> bool:
        """Whether the work joins the step's batched forward: every work without PCP and DCP,
        else a one-token decode."""
        if not self.spec.batch_decodes:
            return False
        return self._one_forward() or (self._is_decode(work) and len(work.token_ids) == 1)

    def _forwards(self, works: Sequence[RankWork]) -> int:
        """The trunk forwards `works` take: one, or each prompt chunk (and verify) alone and
        the decodes as one. (The MTP layer's forwards make no expert exchange: its experts
        stay whole on every rank.)"""
        batched = sum(self._batched(w) for w in works)
        return len(works) - batched + bool(batched)

    def _one_forward(self) -> bool:
        """Whether a step's prompt chunks join its decodes' forward: no PCP split or DCP copy
        to make per sequence, and no MTP rows to write inline (a P/D prefill's read each
        chunk's own trunk states; under speculation the verdict writes them after)."""
        inline_mtp = self.spec.mtp and not self.spec.drafts
        return self.plan.pcp.size == 1 and self.plan.dcp.size == 1 and not inline_mtp

    def _pad_expert_exchanges(self, works: tuple[RankWork, ...], ran: int) -> None:
        """DP replicas share their EP groups: every rank must make as many expert exchanges as
        the busiest replica's forwards make, so a rank that ran fewer forwards (or none) makes
        the rest with no tokens. Each replica's forward count is computed from the step alone,
        the same on every rank."""
        replicas = self.spec.layout.dp
        if replicas == 1 or not self.experts:
            return
        counts = [self._forwards([w for w in works if w.replica == d]) for d in range(replicas)]
        empty = self.model.embed_tokens.new_zeros(0, self.model.config.hidden_size)
        for _ in range(max(counts) - ran):
            for layer in sorted(self.experts):
                self.experts[layer].forward(empty)

    def _exported(self, spans: Sequence[tuple[str, int, int]]) -> tuple[RankRows, ...]:
        """The rows this rank holds of each (request, first, end) span the step wrote."""
        return tuple(
            RankRows(request_id, self.live[request_id].store.rows_between(first, end))
            for request_id, first, end in spans
        )

    def _sequence(self, work: RankWork) -> ParallelSequence:
        """The work's sequence, new (a first chunk, or one seeded from a cached prefix) or
        live, checked to be where the work continues."""
        if work.start == 0 or work.prefix is not None:
            self.live[work.request_id] = self._new_sequence(self.spec.capacity)
            self._held.pop(work.request_id, None)
            self._last.pop(work.request_id, None)
        seq = self.live.get(work.request_id)
        if seq is not None and work.prefix is not None:
            seq.store.seed(work.prefix)
        if seq is None or seq.length != work.start:
            held = "no sequence" if seq is None else f"{seq.length} tokens"
            raise RuntimeError(
                f"rank {self.rank}: request {work.request_id!r} continues at {work.start} but "
                f"this rank holds {held}: the ranks fell out of step with the engine"
            )
        return seq

    def _is_decode(self, work: RankWork) -> bool:
        """A token after the sequence's first, or a verify (with MTP rows written inline, a
        P/D prefill's, every work runs as a chunk)."""
        if self.spec.mtp and not self.spec.drafts:
            return False
        return work.start > 0 and len(work.token_ids) == 1 + work.draft_tokens

    def _run(self, seq: ParallelSequence, work: RankWork) -> torch.Tensor:
        """One work alone: its logits rows (`_outputs`)."""
        ids = torch.tensor(work.token_ids, dtype=torch.long)
        if self._is_decode(work):
            return self._outputs(work, seq.decode_states(ids), work.start)
        # a prompt chunk: split over the PCP group when every chunk gets a token
        split = len(ids) >= 2 * self.plan.pcp.size
        hidden = seq.prefill_states(ids, split=split, next_id=work.next_id)
        return self._outputs(work, hidden, work.start + len(ids) - 1)

    def _new_sequence(self, capacity: int) -> ParallelSequence:
        s = self.spec
        return ParallelSequence(
            self.model, self.plan, capacity, self.experts, s.block_size, s.kv_fp8, s.mtp,
            s.hot_slots, self.tiers,
        )  # fmt: skip


def serve_rank(ctx: RankContext, spec: RankServeSpec, conns: tuple[Connection, ...]) -> int:
    """A rank's program (parallel/ranks.py): steps and weight loads from its pipe until the
    engine closes it or sends None."""
    return serve_steps(ctx, conns, lambda: RankSequences(ctx, spec))
