"""The ranked runner: ModelRunner's interface over the rank processes of a parallel sparse-mla
worker (PCP, DCP, EP). The engine schedules and samples in its own process as on one rank;
each step's token works go to every rank over a pipe, every rank runs them in the same order
(parallel/sparse_mla/rank_server.py), and rank 0 sends back the logits rows. Under MTP
speculation it is also the SpecRunner of engine/spec/forward.py: the ranks propose the drafts,
verify them, and write the MTP rows of what the engine's verdict kept with the next message.

Owns the rank group's lifetime, the step exchange and its timeout, the sequences to release
and the verdicts to settle at the next message and, for a P/D prefill, writing the rows the
ranks export into the engine's
own pool (the one the KV connector moves) at the slots of each work's block table; never
schedules, samples or changes a block table. A rank that
dies, raises or does not answer in time takes the runner down with RankFailure (every rank
stopped): the worker fails cleanly and the fleet's failover handles its requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.ranks.channel import START_TIMEOUT_S, RankChannel, rank_config
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import TrunkOutput
from loom_runtime.engine.types import RankKVStats
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.hisparse_cache import TierCounters
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.parallel.ranks import RankConfig
from loom_runtime.parallel.sparse_mla.rank_server import (
    RankDraftAsk,
    RankLoad,
    RankLoaded,
    RankReady,
    RankReply,
    RankServeSpec,
    RankSettle,
    RankStep,
    RankWork,
    serve_rank,
)
from loom_runtime.parallel.sparse_mla.store import HeldRows

logger = logging.getLogger(__name__)


class RankedRunner:
    """Start with the spec; `execute` as ModelRunner; `release` after a request's blocks are
    freed; `close` at shutdown. Not thread-safe: the engine's step thread is its one caller."""

    def __init__(
        self,
        spec: RankServeSpec,
        config: RankConfig,
        workdir: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if config.world != spec.layout.world:
            raise ValueError(
                f"RankedRunner: layout {spec.layout.describe()} has {spec.layout.world} ranks, "
                f"the rank config {config.world}"
            )
        self.spec = spec
        self.block_size = spec.block_size
        self.device = torch.device("cpu")  # where logits rows arrive
        self.tokens_run = 0
        self.forwards = 0
        self.works_run = 0  # sequences' works sent to the ranks
        self.rank_forwards = 0  # the forwards each rank ran for them (a step's decodes: one)
        self._timeout_s = config.collective_timeout_s
        self._released: list[str] = []
        self._settle: dict[str, RankSettle] = {}  # verdicts the next message carries
        self._tables: dict[str, BlockTable] = {}  # each live request's, for the rows it exports
        self._held: set[str] = set()  # requests whose sequences the ranks hold
        self._mirror: LatentKVCache | None = None
        self._tiers: list[TierCounters] = []  # each HiSparse rank's, from its last reply
        self._ranks = RankChannel(config, serve_rank, (spec,), workdir)
        ready = self._ranks.receive_all(RankReady, "start", start_timeout_s)
        self._kv = [RankKVStats(r.rank, r.kv_bytes_per_token, 0, 0, 0) for r in ready]
        logger.info(
            "ranks ready",
            extra={"layout": spec.layout.describe(), "pids": self._ranks.pids},
        )

    @property
    def world(self) -> int:
        return self._ranks.world

    @property
    def pids(self) -> list[int]:
        return self._ranks.pids

    @property
    def export_rows(self) -> bool:
        return self.spec.export_rows

    @property
    def drafts(self) -> bool:
        """Whether the ranks run MTP speculation (propose, trunk, extend)."""
        return self.spec.drafts

    @property
    def num_blocks(self) -> int | None:
        """The ranks keep rows per sequence, so any pool size suits them (None: the engine's)."""
        return None

    def kv(self) -> tuple[RankKVStats, ...]:
        """Per rank, the KV it held after the last step."""
        return tuple(self._kv)

    def tiers(self) -> TierCounters | None:
        """HiSparse ranks: their tier counters summed, as of the last step (None: off)."""
        if not self.spec.hot_slots:
            return None
        names = [f.name for f in fields(TierCounters)]
        return TierCounters(**{n: sum(getattr(t, n) for t in self._tiers) for n in names})

    def mirror_into(self, cache: LatentKVCache) -> None:
        """Write every step's exported rows into `cache` (the engine's real pool, whose blocks
        its tables name: what a P/D prefill's connector moves and what a prefix hit is seeded
        from); the ranks must have been started with export_rows."""
        if not self.spec.export_rows:
            raise ValueError("mirror_into needs ranks started with export_rows (a P/D prefill)")
        self._mirror = cache

    def release(self, request_id: str) -> None:
        """The request's blocks are being freed: its sequences go with the next message. A
        verdict still pending is settled first, now, when the pool mirrors the ranks: its MTP
        rows would never reach the blocks a later prefix hit reads."""
        if request_id in self._settle and self._mirror is not None:
            self._exchange(self._message())
        self._released.append(request_id)
        self._held.discard(request_id)
        self._settle.pop(request_id, None)
        self._tables.pop(request_id, None)

    def flush(self) -> None:
        """Send the pending releases now (a step of no works), when there are any."""
        if self._released:
            self.execute(())

    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]:
        """One step on every rank; per work its logits row ([vocab]; a verify's every row,
        [1 + draft_tokens, vocab]) or None."""
        if self._settle and any(self._is_hit(w) for w in works):
            self._exchange(self._message())  # the hit reads the pool: the MTP rows reach it first
        step = self._message(works=tuple(self._rank_work(w, self._replica(w)) for w in works))
        self._held.update(w.request_id for w in works)
        self._tables.update((w.request_id, w.table) for w in works)
        replies = self._exchange(step)
        self.tokens_run += sum(len(w.token_ids) for w in works)
        self.forwards += bool(works)
        self.works_run += len(works)
        self.rank_forwards += replies[0].forwards
        leads = [replies[self._lead(d)] for d in range(self.spec.layout.dp)]
        rows = [iter(() if lead.logits is None else lead.logits) for lead in leads]
        out: list[torch.Tensor | None] = []
        for w, rank_work in zip(works, step.works, strict=True):
            mine = rows[rank_work.replica]
            if w.draft_tokens:
                out.append(torch.stack([next(mine) for _ in range(1 + w.draft_tokens)]))
            else:
                out.append(next(mine) if w.want_logits else None)
        return out

    def _message(
        self, works: tuple[RankWork, ...] = (), drafts: tuple[RankDraftAsk, ...] = ()
    ) -> RankStep:
        """The next message: what it asks for, and the releases and verdicts pending."""
        step = RankStep(works, tuple(self._released), tuple(self._settle.values()), drafts)
        self._released, self._settle = [], {}
        return step

    def _exchange(self, step: RankStep) -> list[RankReply]:
        """Send a message to every rank; their replies, with the KV they report kept and the
        rows they export written into the mirrored pool."""
        self._ranks.send_all(step)
        replies = self._ranks.receive_all(RankReply, "step", self._timeout_s)
        self._kv = [
            RankKVStats(
                kv.rank, kv.kv_bytes_per_token, r.kv_tokens, r.kv_bytes, r.sequences,
                r.device_kv_bytes,
            )
            for kv, r in zip(self._kv, replies, strict=True)
        ]  # fmt: skip
        self._tiers = [r.tiers for r in replies if r.tiers is not None]
        if self._mirror is not None:
            for reply in replies:
                for exported in reply.rows:
                    table = self._tables[exported.request_id]
                    _write_rows(self._mirror, table, exported.rows)
        return replies

    # --- MTP speculation (engine/spec/forward.py's SpecRunner) ---------------------------------

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        """The MTP layer's drafts of each work that asks for some, proposed on its replica's
        ranks (none for a sequence without a settled verdict yet, as on one rank)."""
        if not self.spec.drafts:
            raise ValueError("propose needs ranks started with MTP drafting")
        asks = tuple(
            RankDraftAsk(w.request_id, w.draft_tokens, self._replica(w))
            for w in works
            if w.draft_tokens > 0
        )
        if not asks:
            return [() for _ in works]
        replies = self._exchange(self._message(drafts=asks))
        proposed = [iter(replies[self._lead(d)].drafts) for d in range(self.spec.layout.dp)]
        by_id = {a.request_id: next(proposed[a.replica]) for a in asks}
        return [by_id.get(w.request_id, ()) if w.draft_tokens else () for w in works]

    def trunk(self, works: Sequence[TokenWork]) -> TrunkOutput:
        """The trunk over every work on the ranks; its states stay there for `extend`."""
        logits = self.execute(works)
        starts = [0]
        for w in works:
            starts.append(starts[-1] + len(w.token_ids))
        return TrunkOutput(logits, None, starts)

    def extend(
        self, works: Sequence[TokenWork], trunk: TrunkOutput, next_ids: Sequence[tuple[int, ...]]
    ) -> None:
        """The engine's verdict on each work: the next message's first job on the ranks."""
        for w, ids in zip(works, next_ids, strict=True):
            if ids:
                self._settle[w.request_id] = RankSettle(w.request_id, w.start, ids)

    def _replica(self, work: TokenWork) -> int:
        """The DP replica a work runs on: where the scheduler placed its request (its table's
        `replica`, set at admission within that replica's blocks)."""
        replica = work.table.replica
        if not 0 <= replica < self.spec.layout.dp:
            raise ValueError(
                f"request {work.request_id!r} is placed on replica {replica}; the ranks run "
                f"{self.spec.layout.dp}"
            )
        return replica

    def _lead(self, replica: int) -> int:
        """The rank that returns a replica's logits: its first."""
        layout = self.spec.layout
        return replica * layout.tp * layout.pcp

    def _is_hit(self, work: TokenWork) -> bool:
        """A sequence the ranks do not hold that starts past 0: a prefix hit."""
        return work.start > 0 and work.request_id not in self._held

    def _rank_work(self, work: TokenWork, replica: int) -> RankWork:
        """The ranks' share of a work; a sequence they do not hold that starts past 0 (a prefix
        hit) carries its prefix's rows, read from the mirrored pool."""
        prefix = None
        if self._is_hit(work):
            if self._mirror is None:
                raise RuntimeError(
                    f"request {work.request_id!r} starts at {work.start} on ranks that do not "
                    "hold it, and no mirrored pool has its rows (prefix caching needs one)"
                )
            prefix = _read_rows(self._mirror, work, work.start)
        return RankWork(
            work.request_id,
            work.token_ids,
            work.start,
            work.want_logits,
            prefix,
            work.next_id,
            replica,
            work.draft_tokens,
        )

    def load_weights(self, checkpoint: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every rank loads the checkpoint's weights (drained, or under live sequences in a keep
        swap; the caller checked the names and shapes first). A rank that fails takes the
        runner down."""
        self.flush()
        self._ranks.send_all(RankLoad(checkpoint))
        self._ranks.receive_all(RankLoaded, "weight load", timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask every rank to stop, then stop whatever is left after `timeout_s`."""
        self._ranks.close(timeout_s)


def _slots(cache: LatentKVCache, table: BlockTable, positions: list[int]) -> torch.Tensor:
    bs, blocks = cache.spec.block_size, table.block_ids
    return torch.tensor([blocks[p // bs] * bs + p % bs for p in positions], dtype=torch.long)


def _read_rows(cache: LatentKVCache, work: TokenWork, n: int) -> HeldRows:
    """Every layer's rows of the work's tokens 0..n-1 from the pool (a prefix hit's)."""
    slots = _slots(cache, work.table, list(range(n))).to(cache.data.device)
    latent, rope, keys = [], [], []
    for layer in range(cache.spec.num_layers):
        lat, rop, idx = cache.read(layer, slots)
        latent.append(lat.cpu())
        rope.append(rop.cpu())
        if idx is not None:
            keys.append(idx.cpu())
    return HeldRows(
        positions=torch.arange(n),
        latent=torch.stack(latent),
        rope_keys=torch.stack(rope),
        index_keys=torch.stack(keys) if keys else torch.zeros(0, n, cache.spec.index_dim),
    )


def _write_rows(cache: LatentKVCache, table: BlockTable, rows: HeldRows) -> None:
    """Store a rank's exported rows of a request at their slots in `cache` (its `table`'s),
    every layer."""
    slots = _slots(cache, table, rows.positions.tolist())
    if not len(slots):
        return
    index_slot = {layer: i for i, layer in enumerate(cache.spec.index_layers)}
    dev = cache.data.device
    for layer in range(cache.spec.num_layers):
        slot = index_slot.get(layer)
        keys = None if slot is None else rows.index_keys[slot].to(dev)
        cache.write(
            layer, slots.to(dev), rows.latent[layer].to(dev), rows.rope_keys[layer].to(dev), keys
        )


def start_ranks(
    checkpoint: str,
    config: EngineConfig,
    max_model_len: int,
    export_rows: bool = False,
    batch_decodes: bool = True,
    drafts: bool = False,
    hot_slots: int = 0,
) -> RankedRunner:
    """The ranks of an engine whose config asks for a parallel layout (config.parallel);
    `export_rows` for a P/D prefill, whose pool must hold the rows the connector moves;
    `drafts`: the ranks run MTP speculation (config.mtp_draft_tokens; not a P/D prefill's);
    `batch_decodes` False runs a step's decodes one forward each (bench/ranked_batch.py's
    baseline); `hot_slots` > 0: HiSparse ranks (config.hisparse), hot buffers of that many rows."""
    spec = RankServeSpec(
        checkpoint=checkpoint,
        layout=config.parallel,
        dtype=str(config.dtype).removeprefix("torch."),
        capacity=max_model_len,
        block_size=config.block_size,
        dcp_backend=config.dcp_backend,
        export_rows=export_rows,
        kv_fp8=config.kv_fp8,
        mtp=config.mtp_draft_tokens > 0,
        drafts=drafts,
        batch_decodes=batch_decodes,
        hot_slots=hot_slots,
    )
    return RankedRunner(spec, rank_config(config))
