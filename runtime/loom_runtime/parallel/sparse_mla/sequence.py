"""ParallelSequence: one sequence's forwards on one rank of a sparse-mla worker: a prefill
split over the PCP group by DualChunkSwap, decode steps over the DCP-sharded cache (or the
whole one), MoE layers through EP; the same calls on every rank of the worker, in step.

Owns the sequence's store and the shape of each forward (the MTP layer's drafts and rows
included), and `decode_batch`: one decode forward over several sequences; never samples or
decides acceptance (the engine does, in its own process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HotRows, TierCounters
from loom_runtime.models.sparse_mla.cache import SparseMlaCache
from loom_runtime.models.sparse_mla.hooks import LayerHooks
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.parallel.collectives import all_gather_rows, broadcast
from loom_runtime.parallel.dcp_shard import ShardMap
from loom_runtime.parallel.dual_chunk import DualChunkPlan
from loom_runtime.parallel.sparse_mla.ep_moe import ExpertParallelMoe
from loom_runtime.parallel.sparse_mla.hooks import BatchedHooks, ParallelHooks, PcpSplit
from loom_runtime.parallel.sparse_mla.packed_cache import PackedCache
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.store import (
    FullStore,
    SequenceCache,
    ShardStore,
    shard_capacity,
)
from loom_runtime.parallel.sparse_mla.tiered_hooks import TieredHooks
from loom_runtime.parallel.sparse_mla.tiered_store import DeviceKeys, TieredStore


class ParallelSequence:
    """Every rank of the worker builds one per sequence and calls prefill/decode together."""

    def __init__(
        self,
        model: SparseMlaForCausalLM,
        plan: RankPlan,
        capacity: int,
        experts: Mapping[int, ExpertParallelMoe] | None = None,
        block_size: int = 16,
        kv_fp8: Fp8Format | None = None,
        mtp: bool = False,
        hot_slots: int = 0,
        counters: TierCounters | None = None,
    ) -> None:
        """`kv_fp8`: every kept row is stored packed in that format (PackedCache: the fp8 KV
        numerics and memory).
        `mtp`: the store also keeps the first MTP layer's rows, which `prefill` computes for
        the prompt (a P/D prefill's: the decode drafts from them).
        `hot_slots` > 0: Hybrid HiSparse (no PCP, no DCP): the rows live in a host tier, the
        keys on the device, and a hot buffer of that many rows per layer (TieredStore),
        counted in `counters` (the rank's)."""
        plan.check(model.config)
        if mtp and not model.mtp:
            raise ValueError("mtp rows need a checkpoint with an MTP layer")
        if hot_slots and (plan.pcp.size > 1 or plan.dcp.size > 1):
            raise ValueError("HiSparse tiers need a rank without PCP and DCP (a DP replica)")
        self.model = model
        self.plan = plan
        self.experts = experts or {}
        self.block_size = block_size
        self.mtp = mtp
        layers = range(model.config.num_hidden_layers + (1 if mtp else 0))
        self.store: FullStore | ShardStore
        if plan.dcp.size > 1:
            shard = ShardMap(plan.dcp.size, plan.layout.interleave, plan.dcp.index)
            rows = shard_capacity(capacity, shard, block_size)
        else:
            rows = capacity
        where = torch.device("cpu") if hot_slots else model.device  # HiSparse: the host tier
        cache: SequenceCache = (
            SparseMlaCache(model.config, rows, model.dtype, where, layers)
            if kv_fp8 is None
            else PackedCache(model.config, rows, kv_fp8, model.dtype, where, layers)
        )
        if plan.dcp.size > 1:
            self.store = ShardStore(cache, shard, plan.dcp, kv_fp8)
        elif hot_slots:
            self.store = _tiered(model, cache, hot_slots, counters or TierCounters(), kv_fp8)
        else:
            self.store = FullStore(cache, kv_fp8)

    @property
    def length(self) -> int:
        return self.store.length

    def rebind(self, model: SparseMlaForCausalLM, experts: Mapping[int, ExpertParallelMoe]) -> None:
        """Go on under new weights of the same shapes (a keep swap): the rows kept so far stay."""
        self.plan.check(model.config)
        self.model, self.experts = model, experts

    def prefill(
        self,
        input_ids: torch.Tensor,
        all_logits: bool = False,
        split: bool = True,
        next_id: int | None = None,
    ) -> torch.Tensor:
        """Logits of the prompt (chunk) input_ids ([T], the same on every rank): [T, vocab]
        with `all_logits`, else the last token's [1, vocab]. With `split` each PCP rank
        computes its two DualChunkSwap chunks, else every rank computes all T; either way
        every rank keeps (its DCP shard of) every token's rows."""
        return self.model.logits(self.prefill_states(input_ids, split, next_id, all_logits))

    def prefill_states(
        self, input_ids: torch.Tensor, split: bool, next_id: int | None, all_logits: bool = False
    ) -> torch.Tensor:
        """As `prefill`, the trunk outputs (before the final norm) instead of their logits."""
        new = int(input_ids.shape[0])
        start = self.store.length
        device = self.model.device
        pcp = self.plan.pcp
        world = pcp.size if split else 1
        chunks = DualChunkPlan.of(new, world)
        share = torch.tensor(chunks.shares[pcp.index % world], dtype=torch.long, device=device)
        pcp_split = None
        if world > 1:
            restore = torch.tensor(chunks.restore, dtype=torch.long, device=device)
            pcp_split = PcpSplit(counts=chunks.counts, restore=restore)
        self.store.begin(new)
        hooks: LayerHooks = (
            TieredHooks(self.plan, [self.store], [slice(0, new)], self.experts)
            if isinstance(self.store, TieredStore)
            else ParallelHooks(self.plan, self.store, pcp_split, False, self.experts)
        )
        ids = input_ids.to(device)
        hidden = self.model.hidden_states(ids[share], start + share, hooks)
        if self.mtp:
            self._mtp_rows(ids, next_id, hidden, share, start, hooks)
        self.store.advance()
        return self._prompt_hidden(hidden, chunks, all_logits)

    def decode(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of n new tokens (a decode step, or a verify: a token and its
        drafts), computed by every rank alike; with DCP each rank attends over its shard and
        the partial outputs are merged."""
        return self.model.logits(self.decode_states(input_ids))

    def decode_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """As `decode`, the trunk outputs [n, hidden] (before the final norm)."""
        new = int(input_ids.shape[0])
        positions = self.decode_positions(new)
        self.store.begin(new)
        hidden = self.model.hidden_states(input_ids.to(self.model.device), positions, self.hooks())
        self.store.advance()
        return hidden

    def hooks(self) -> ParallelHooks | TieredHooks:
        """The hooks of a forward whose tokens every rank computes alike (a decode's, an MTP
        layer's): over this rank's DCP shard, merged, or over the whole store (its tiers)."""
        store = self.store
        if isinstance(store, TieredStore):
            return TieredHooks(
                self.plan, [store], [slice(0, store.visible - store.length)], self.experts
            )
        sharded = isinstance(store, ShardStore)
        return ParallelHooks(self.plan, self.store, None, sharded=sharded, experts=self.experts)

    def decode_positions(self, new: int) -> torch.Tensor:
        """The positions of the next `new` tokens."""
        start = self.store.length
        return torch.arange(start, start + new, device=self.model.device)

    def _mtp_rows(
        self,
        ids: torch.Tensor,
        next_id: int | None,
        hidden: torch.Tensor,
        share: torch.Tensor,
        start: int,
        hooks: LayerHooks,
    ) -> None:
        """The MTP layer's rows of this forward's tokens (kept like a layer's: PCP-gathered,
        DCP-sharded): at position i it reads the trunk's state of token i and token i + 1. The
        chunk's last row reads `next_id`; at a prompt's end it is not known yet (None: 0
        stands in, and that one row is not what a decode reads, since a decode recomputes
        the prompt's last token itself)."""
        after = torch.cat((ids[1:], ids.new_tensor([0 if next_id is None else next_id])))
        self.model.mtp[0].forward(self.model.normed(hidden), after[share], start + share, hooks)

    def kv_block_bytes(self) -> int:
        return self.store.block_bytes(self.block_size)

    def _prompt_hidden(
        self, hidden: torch.Tensor, chunks: DualChunkPlan, all_logits: bool
    ) -> torch.Tensor:
        """The trunk outputs whose logits prefill returns, on every rank."""
        pcp = self.plan.pcp
        if chunks.world == 1:
            return hidden if all_logits else hidden[-1:]
        if all_logits:
            parts = all_gather_rows(pcp, hidden, chunks.counts)
            return torch.cat(parts, dim=0)[torch.tensor(chunks.restore, device=hidden.device)]
        last = chunks.length - 1
        holder = next(r for r, share in enumerate(chunks.shares) if last in share)
        if holder == pcp.index:
            row = hidden[chunks.shares[holder].index(last)][None]
        else:
            row = hidden.new_empty(1, hidden.shape[1])
        return broadcast(pcp, row, holder)


def decode_batch(sequences: Sequence[ParallelSequence], input_ids: torch.Tensor) -> torch.Tensor:
    """One decode step of several sequences as one forward: logits [n, vocab] of input_ids
    ([n], token i for sequences[i]), each equal to sequences[i].decode alone."""
    return forward_batch(sequences, [input_ids[i : i + 1] for i in range(len(input_ids))])


def forward_batch(
    sequences: Sequence[ParallelSequence], chunks: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Several sequences' next tokens as one forward: chunks[i] ([n_i]) continue sequences[i];
    the logits [len(chunks), vocab] of each chunk's last token, each equal to running that
    chunk alone. Chunks of more than one token need a plan without PCP or DCP (their rows are
    attended whole; a split prefill or a DCP copy is one sequence's forward). Every rank calls
    it with the same sequences in the same order; their model, plan and experts are shared."""
    hidden = batch_states(sequences, chunks)
    ends = torch.tensor([int(c.shape[0]) for c in chunks]).cumsum(0)
    return sequences[0].model.logits(hidden[ends - 1])


def batch_states(
    sequences: Sequence[ParallelSequence], chunks: Sequence[torch.Tensor]
) -> torch.Tensor:
    """As `forward_batch`, the trunk outputs of every chunk's every token, chunk after chunk
    ([sum n_i, hidden], before the final norm)."""
    if not sequences:
        raise ValueError("a forward batch needs at least one sequence")
    if len(sequences) != len(chunks):
        raise ValueError(f"{len(sequences)} sequences for {len(chunks)} chunks")
    first = sequences[0]
    if len({id(s) for s in sequences}) != len(sequences):
        raise ValueError("a sequence appears twice in one forward batch")
    if any(s.model is not first.model or s.plan is not first.plan for s in sequences):
        raise ValueError("a forward batch's sequences must share one model and plan")
    sizes = [int(c.shape[0]) for c in chunks]
    if min(sizes) < 1:
        raise ValueError("every chunk of a forward batch needs a token")
    split = first.plan.pcp.size > 1 or first.plan.dcp.size > 1
    if split and max(sizes) > 1:
        raise ValueError("chunks of several tokens batch only without PCP and DCP")
    positions, hooks = _begin(sequences, sizes)
    ids = torch.cat(list(chunks)).to(first.model.device)
    hidden = first.model.hidden_states(ids, positions, hooks)
    for s in sequences:
        s.store.advance()
    return hidden


# --- MTP drafting (a speculating engine's ranks) ----------------------------------------------


def write_mtp(
    sequences: Sequence[ParallelSequence],
    normed: Sequence[torch.Tensor],
    next_ids: Sequence[torch.Tensor],
    starts: Sequence[int],
) -> list[torch.Tensor]:
    """The MTP layer's rows of each sequence's kept positions start..start + n - 1 (n =
    len(next_ids[i]), the tokens after them) from the trunk's final-normed states there
    (normed[i], [n, hidden]); each sequence then ends at start + n (a verify's rejected drafts
    are dropped). One MTP-layer forward for them all (under DCP a sequence with several kept
    positions runs alone). Per sequence, the MTP output at its last kept position: what its
    next step's first draft reads."""
    for seq, ids, start in zip(sequences, next_ids, starts, strict=True):
        n = int(ids.shape[0])
        if not seq.mtp:
            raise ValueError("write_mtp on a sequence kept without MTP rows")
        if n < 1 or start + n > seq.store.length:
            raise ValueError(
                f"MTP rows at {start}..{start + n - 1}: the sequence has {seq.store.length} tokens"
            )
        seq.store.truncate(start)
    out: dict[int, torch.Tensor] = {}
    for group in _mtp_groups(sequences, [int(ids.shape[0]) for ids in next_ids]):
        rows = _mtp_forward(
            [sequences[i] for i in group], [normed[i] for i in group], [next_ids[i] for i in group]
        )
        out.update((i, r[-1]) for i, r in zip(group, rows, strict=True))
    return [out[i] for i in range(len(sequences))]


def draft(
    sequences: Sequence[ParallelSequence], last: Sequence[torch.Tensor], ks: Sequence[int]
) -> list[list[int]]:
    """ks[i] MTP drafts after each sequence: the first from last[i] (its MTP output at its
    last kept position), draft j + 1 from a scratch row at position length + j, one batched
    MTP-layer forward per draft for every sequence still drafting; the scratch rows are
    dropped once all are proposed (engine/spec/mtp_runner.py drafts alike on one rank)."""
    if not sequences:
        return []
    layer = sequences[0].model.mtp[0]
    committed = [seq.store.length for seq in sequences]
    hidden = [row[None] for row in last]
    drafts: list[list[int]] = [[] for _ in sequences]
    for j in range(max(ks)):
        active = [i for i, k in enumerate(ks) if j < k]
        logits = layer.logits(torch.cat([hidden[i] for i in active]))
        for i, row in zip(active, logits, strict=True):
            drafts[i].append(int(torch.argmax(row)))
        going = [i for i in active if j + 1 < ks[i]]
        if not going:
            break
        device = sequences[0].model.device
        tokens = [torch.tensor([drafts[i][-1]], dtype=torch.long, device=device) for i in going]
        rows = _mtp_forward([sequences[i] for i in going], [hidden[i] for i in going], tokens)
        for i, r in zip(going, rows, strict=True):
            hidden[i] = r
    for seq, length in zip(sequences, committed, strict=True):
        seq.store.truncate(length)
    return drafts


def _mtp_groups(sequences: Sequence[ParallelSequence], sizes: Sequence[int]) -> list[list[int]]:
    """Which sequences share one MTP-layer forward: all, but under DCP a sequence extended by
    several tokens runs alone (a batch's sharded selection takes one query per sequence)."""
    if not sequences or sequences[0].plan.dcp.size == 1:
        return [list(range(len(sequences)))] if sequences else []
    alone = [[i] for i, n in enumerate(sizes) if n > 1]
    together = [i for i, n in enumerate(sizes) if n == 1]
    return alone + ([together] if together else [])


def _mtp_forward(
    sequences: Sequence[ParallelSequence],
    hidden: Sequence[torch.Tensor],
    next_ids: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """One MTP-layer forward extending each sequence by len(next_ids[i]) rows (hidden[i]:
    the states they read); each sequence's outputs."""
    first = sequences[0]
    sizes = [int(ids.shape[0]) for ids in next_ids]
    positions, batched = _begin(sequences, sizes)
    hooks = batched if len(sequences) > 1 else first.hooks()
    ids = torch.cat(list(next_ids)).to(first.model.device)
    out = first.model.mtp[0].forward(torch.cat(list(hidden)), ids, positions, hooks)
    for s in sequences:
        s.store.advance()
    return list(torch.split(out, sizes))


def _begin(
    sequences: Sequence[ParallelSequence], sizes: Sequence[int]
) -> tuple[torch.Tensor, BatchedHooks | TieredHooks]:
    """Begin the rows of each sequence's next sizes[i] tokens: their positions, and the hooks
    of one forward over them all (sequence i's tokens are the i-th run of sizes)."""
    first = sequences[0]
    positions = torch.cat([s.decode_positions(n) for s, n in zip(sequences, sizes, strict=True)])
    for s, n in zip(sequences, sizes, strict=True):
        s.store.begin(n)
    ends = torch.tensor(sizes).cumsum(0)
    queries = [slice(int(end) - n, int(end)) for end, n in zip(ends, sizes, strict=True)]
    stores = [s.store for s in sequences]
    tiered = [s for s in stores if isinstance(s, TieredStore)]
    if len(tiered) == len(stores):
        return positions, TieredHooks(first.plan, tiered, queries, first.experts)
    return positions, BatchedHooks(first.plan, stores, queries, first.experts)


def _tiered(
    model: SparseMlaForCausalLM,
    cache: SequenceCache,
    hot_slots: int,
    counters: TierCounters,
    fp8: Fp8Format | None,
) -> TieredStore:
    """A HiSparse store over `cache` (the host tier): its keys and hot rows on the device."""
    c, device, dtype = model.config, model.device, model.dtype
    keys = DeviceKeys(cache.num_index_layers, c.index_head_dim, cache.capacity, dtype, device, fp8)
    hot = HotRows(cache.num_layers, hot_slots, c.kv_lora_rank, c.qk_rope_head_dim, dtype, device)
    return TieredStore(cache, keys, hot, counters, fp8)
