"""The engine's side of a worker's rank processes: EngineRanks, what the engine asks of them,
and RankChannel — one pipe per rank, a message sent to every rank, each rank's reply awaited
under a timeout, and the group taken down together when one rank fails (RankFailure, a
WorkerLostError: the fleet's failover handles the worker's requests).

Owns the pipes, the rank group's lifetime and those waits; never says what a message means (the
runners do: engine/ranks/ranked_runner.py for sparse-mla, engine/ranks/tp_runner.py for llama TP).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.types import RankKVStats
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.parallel.ranks import Program, RankConfig, RankFailure, RankGroup

START_TIMEOUT_S = 300.0  # joining the groups and loading the checkpoint, on every rank
FAIL_GRACE_S = 10.0  # after a failure, how long the other ranks get to exit on their own
Reply = TypeVar("Reply")


def rank_config(config: EngineConfig) -> RankConfig:
    """How an engine's ranks run: NCCL on GPUs (gloo on CPU), its collective timeout, the
    engine's CPU threads split between them."""
    world = config.parallel.world
    return RankConfig(
        world=world,
        backend="nccl" if config.device.startswith("cuda") else "gloo",
        collective_timeout_s=config.collective_timeout_s,
        threads=max(1, torch.get_num_threads() // world),
    )


class EngineRanks(Protocol):
    """A parallel engine's ranks as the engine drives them (RankedRunner, TpRunner): the
    step's runner, plus what frees, reports, mirrors and reloads what they hold."""

    tokens_run: int

    @property
    def world(self) -> int: ...

    @property
    def export_rows(self) -> bool:
        """Every step's new rows come back to the engine's pool (its mirror)."""
        ...

    @property
    def num_blocks(self) -> int | None:
        """The pool size the ranks were started with (None: the engine chooses)."""
        ...

    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]: ...

    def release(self, request_id: str) -> None: ...

    def flush(self) -> None: ...

    def kv(self) -> tuple[RankKVStats, ...]: ...

    def mirror_into(self, cache: LatentKVCache) -> None: ...

    def load_weights(self, checkpoint: str) -> None:
        """Every rank serves the checkpoint's weights; live requests (a keep swap) go on over
        the KV the ranks hold for them."""
        ...

    def close(self, timeout_s: float = 10.0) -> None: ...


class RankChannel:
    """Start the ranks with `program(ctx, *args, conns)`; `send_all` then `receive_all` per
    exchange; `close` at shutdown. Not thread-safe: one caller (the engine's step thread)."""

    def __init__(
        self,
        config: RankConfig,
        program: Program,
        args: Sequence[Any],
        workdir: Path | None = None,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="loom-ranks-") if workdir is None else None
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(config.world)]
        self._conns: list[Connection] = [mine for mine, _ in pipes]
        theirs = tuple(child for _, child in pipes)
        where = Path(self._dir.name) if self._dir is not None else Path(workdir or ".")
        self._group = RankGroup(config, program, (*args, theirs), where)
        self._group.start()
        for child in theirs:  # a dead rank's pipe then reads as closed here
            child.close()

    @property
    def world(self) -> int:
        return len(self._conns)

    @property
    def pids(self) -> list[int]:
        return self._group.pids

    def send_all(self, message: object) -> None:
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(message)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
                self.fail(f"rank {rank} is gone ({type(exc).__name__})")

    def receive_all(self, kind: type[Reply], what: str, timeout_s: float) -> list[Reply]:
        """Every rank's reply, in rank order, each of `kind` (`what` names the exchange in a
        failure's message)."""
        return [self.receive(r, kind, what, timeout_s) for r in range(self.world)]

    def receive(self, rank: int, kind: type[Reply], what: str, timeout_s: float) -> Reply:
        conn, proc = self._conns[rank], self._group.processes[rank]
        deadline = time.monotonic() + timeout_s
        try:
            while not conn.poll(max(0.0, min(1.0, deadline - time.monotonic()))):
                if proc.exitcode is not None:
                    self.fail(f"rank {rank} exited (code {proc.exitcode}) during the {what}")
                if time.monotonic() >= deadline:
                    self.fail(f"rank {rank} did not answer the {what} in {timeout_s:.0f} s")
            reply = conn.recv()
        except (EOFError, OSError) as exc:
            self.fail(f"rank {rank} closed its pipe during the {what} ({type(exc).__name__})")
        if not isinstance(reply, kind):
            self.fail(f"rank {rank} answered the {what} with a {type(reply).__name__}")
        return reply

    def fail(self, why: str) -> NoReturn:
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
