"""The ranked runner: ModelRunner's interface over the rank processes of a parallel sparse-mla
worker (PCP, DCP, EP). The engine schedules and samples in its own process as on one rank;
each step's token works go to every rank over a pipe, every rank runs them in the same order
(parallel/sparse_mla/rank_server.py), and rank 0 sends back the logits rows.

Owns the rank group's lifetime, the step exchange and its timeout, the sequences to release
at the next step and, for a P/D prefill, writing the rows the ranks export into the engine's
own pool (the one the KV connector moves) at the slots of each work's block table; never
schedules, samples or changes a block table. A rank that
dies, raises or does not answer in time takes the runner down with RankFailure (every rank
stopped): the worker fails cleanly and the fleet's failover handles its requests.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NoReturn, TypeVar

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.engine.types import RankKVStats
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.causal_lm import DecoderConfig
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.parallel.layout import LayoutError
from loom_runtime.parallel.ranks import RankConfig, RankFailure, RankGroup
from loom_runtime.parallel.sparse_mla.rank_server import (
    RankLoad,
    RankLoaded,
    RankReady,
    RankReply,
    RankServeSpec,
    RankStep,
    RankWork,
    serve_rank,
)
from loom_runtime.parallel.sparse_mla.store import HeldRows

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # joining the groups and loading the checkpoint, on every rank
FAIL_GRACE_S = 10.0  # after a failure, how long the other ranks get to exit on their own
Reply = TypeVar("Reply", RankReady, RankReply, RankLoaded)


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
        self._held: set[str] = set()  # requests whose sequences the ranks hold
        self._mirror: LatentKVCache | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="loom-ranks-") if workdir is None else None
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(config.world)]
        self._conns: list[Connection] = [mine for mine, _ in pipes]
        theirs = tuple(child for _, child in pipes)
        where = Path(self._dir.name) if self._dir is not None else Path(workdir or ".")
        self._group = RankGroup(config, serve_rank, (spec, theirs), where)
        self._group.start()
        for child in theirs:  # a dead rank's pipe then reads as closed here
            child.close()
        ready = [self._receive(r, RankReady, start_timeout_s) for r in range(config.world)]
        self._kv = [RankKVStats(r.rank, r.kv_bytes_per_token, 0, 0, 0) for r in ready]
        logger.info(
            "ranks ready",
            extra={"layout": spec.layout.describe(), "pids": self._group.pids},
        )

    @property
    def world(self) -> int:
        return len(self._conns)

    @property
    def pids(self) -> list[int]:
        return self._group.pids

    def kv(self) -> tuple[RankKVStats, ...]:
        """Per rank, the KV it held after the last step."""
        return tuple(self._kv)

    def mirror_into(self, cache: LatentKVCache) -> None:
        """Write every step's exported rows into `cache` (the engine's real pool, whose blocks
        its tables name: what a P/D prefill's connector moves and what a prefix hit is seeded
        from); the ranks must have been started with export_rows."""
        if not self.spec.export_rows:
            raise ValueError("mirror_into needs ranks started with export_rows (a P/D prefill)")
        self._mirror = cache

    def release(self, request_id: str) -> None:
        """The request's blocks were freed: its sequences go with the next step."""
        self._released.append(request_id)
        self._held.discard(request_id)

    def flush(self) -> None:
        """Send the pending releases now (a step of no works), when there are any."""
        if self._released:
            self.execute(())

    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]:
        """One step on every rank; per work its logits row ([vocab]) or None."""
        step = RankStep(
            works=tuple(self._rank_work(w) for w in works), release=tuple(self._released)
        )
        self._released = []
        self._held.update(w.request_id for w in works)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(step)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
                self._fail(f"rank {rank} is gone ({type(exc).__name__})")
        replies = [self._receive(r, RankReply, self._timeout_s) for r in range(self.world)]
        self._kv = [
            RankKVStats(kv.rank, kv.kv_bytes_per_token, r.kv_tokens, r.kv_bytes, r.sequences)
            for kv, r in zip(self._kv, replies, strict=True)
        ]
        if self._mirror is not None:
            by_id = {w.request_id: w for w in works}
            for reply in replies:
                for exported in reply.rows:
                    _write_rows(self._mirror, by_id[exported.request_id], exported.rows)
        lead = replies[0]
        self.tokens_run += sum(len(w.token_ids) for w in works)
        self.forwards += bool(works)
        self.works_run += len(works)
        self.rank_forwards += lead.forwards
        rows = iter(() if lead.logits is None else lead.logits)
        return [next(rows) if w.want_logits else None for w in works]

    def _rank_work(self, work: TokenWork) -> RankWork:
        """The ranks' share of a work; a sequence they do not hold that starts past 0 (a prefix
        hit) carries its prefix's rows, read from the mirrored pool."""
        prefix = None
        if work.start > 0 and work.request_id not in self._held:
            if self._mirror is None:
                raise RuntimeError(
                    f"request {work.request_id!r} starts at {work.start} on ranks that do not "
                    "hold it, and no mirrored pool has its rows (prefix caching needs one)"
                )
            prefix = _read_rows(self._mirror, work, work.start)
        return RankWork(
            work.request_id, work.token_ids, work.start, work.want_logits, prefix, work.next_id
        )

    def load_weights(self, checkpoint: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every rank loads the checkpoint's weights (after every sequence was released; the
        caller checked the names and shapes first). A rank that fails takes the runner down."""
        self.flush()
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(RankLoad(checkpoint))
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
                self._fail(f"rank {rank} is gone ({type(exc).__name__})")
        for r in range(self.world):
            self._receive(r, RankLoaded, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask every rank to stop, then stop whatever is left after `timeout_s`."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        self._group.wait(timeout_s)
        self._group.stop()
        for conn in self._conns:
            conn.close()
        if self._dir is not None:
            self._dir.cleanup()

    def _receive(self, rank: int, kind: type[Reply], timeout_s: float) -> Reply:
        what = {RankReady: "start", RankReply: "step", RankLoaded: "weight load"}[kind]
        conn, proc = self._conns[rank], self._group.processes[rank]
        deadline = time.monotonic() + timeout_s
        try:
            while not conn.poll(max(0.0, min(1.0, deadline - time.monotonic()))):
                if proc.exitcode is not None:
                    self._fail(f"rank {rank} exited (code {proc.exitcode}) during the {what}")
                if time.monotonic() >= deadline:
                    self._fail(f"rank {rank} did not answer the {what} in {timeout_s:.0f} s")
            reply = conn.recv()
        except (EOFError, OSError) as exc:
            self._fail(f"rank {rank} closed its pipe during the {what} ({type(exc).__name__})")
        if not isinstance(reply, kind):
            self._fail(f"rank {rank} answered the {what} with a {type(reply).__name__}")
        return reply

    def _fail(self, why: str) -> NoReturn:
        """Every rank goes down (the pipes close: a rank waiting for a step exits; one stuck
        in a collective with a dead peer times out or is stopped); RankFailure says why, with
        the first rank's own account when one wrote it."""
        for conn in self._conns:
            conn.close()
        outcomes = self._group.wait(FAIL_GRACE_S)
        self._group.stop()
        accounts = [o.error.strip().splitlines()[0] for o in outcomes if o.error]
        detail = f"; {accounts[0]}" if accounts else ""
        raise RankFailure(f"the worker's ranks failed: {why}{detail}", outcomes)


def _slots(cache: LatentKVCache, work: TokenWork, positions: list[int]) -> torch.Tensor:
    bs, table = cache.spec.block_size, work.table.block_ids
    return torch.tensor([table[p // bs] * bs + p % bs for p in positions], dtype=torch.long)


def _read_rows(cache: LatentKVCache, work: TokenWork, n: int) -> HeldRows:
    """Every layer's rows of the work's tokens 0..n-1 from the pool (a prefix hit's)."""
    slots = _slots(cache, work, list(range(n))).to(cache.data.device)
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


def _write_rows(cache: LatentKVCache, work: TokenWork, rows: HeldRows) -> None:
    """Store a rank's exported rows of `work` at their slots in `cache`, every layer."""
    slots = _slots(cache, work, rows.positions.tolist())
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
) -> RankedRunner:
    """The ranks of an engine whose config asks for a parallel layout (config.parallel);
    `export_rows` for a P/D prefill, whose pool must hold the rows the connector moves;
    `batch_decodes` False runs a step's decodes one forward each (bench/ranked_batch.py's
    baseline)."""
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
        batch_decodes=batch_decodes,
    )
    ranks = RankConfig(
        world=config.parallel.world,
        backend="nccl" if config.device.startswith("cuda") else "gloo",
        collective_timeout_s=config.collective_timeout_s,
        threads=max(1, torch.get_num_threads() // config.parallel.world),
    )
    return RankedRunner(spec, ranks)


def check_ranks(
    model: DecoderConfig,
    config: EngineConfig,
    ranks: RankedRunner | None,
    disagg: DisaggSettings | None,
    starting: bool = False,
) -> None:
    """A parallel engine's settings and its ranks agree; LayoutError says how they do not.
    `starting`: before the ranks are started (from_checkpoint), so none are given yet."""
    layout = config.parallel
    if layout.world == 1:
        if ranks is not None:
            raise LayoutError("the engine was given ranks but its config.parallel is one rank")
        return
    where = f"parallel {layout.describe()}"
    if not isinstance(model, SparseMlaConfig):
        raise LayoutError(
            f"{where}: ranks inside the engine run the sparse-mla family only (PCP, DCP, EP); "
            f"the {model.model_type} model has no tensor parallelism in the native runtime yet"
        )
    if disagg is not None and ranks is not None and not ranks.spec.export_rows:
        raise LayoutError(
            f"{where}: a P/D {disagg.role}'s ranks must export their rows (its pool is what the "
            "connector moves, and what a pulled request's ranks are seeded from)"
        )
    if not starting and (ranks is None or ranks.world != layout.world):
        have = "none" if ranks is None else f"{ranks.world}"
        raise LayoutError(f"{where} needs {layout.world} ranks, the engine was given {have}")
    if disagg is None and ranks is not None and config.use_prefix_cache != ranks.spec.export_rows:
        raise LayoutError(f"{where}: prefix caching on ranks needs ranks that export their rows")
