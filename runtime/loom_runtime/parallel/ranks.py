"""Rank processes of one worker: W processes join one torch.distributed world (gloo on CPU,
NCCL on GPU) under a collective timeout, run the same program, and go down together.

Owns starting, watching and stopping the rank processes; never decides what a rank computes
(its program does). A rank whose program raises, whose collective fails because a peer died,
or whose collective times out writes why and exits EXIT_FAILED on its own; a rank whose
supervisor is gone exits EXIT_ORPHANED; the supervisor stops whatever outlives a grace period.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_sentinels
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from loom_runtime.errors import WorkerLostError

logger = logging.getLogger(__name__)

EXIT_FAILED = 3  # the rank's program raised: a failed or timed-out collective included
EXIT_ORPHANED = 4  # the supervisor went away
PARENT_POLL_S = 0.5
STOP_TIMEOUT_S = 5.0  # between terminate and kill


class RankFailure(WorkerLostError):
    """A rank of a worker failed; the others were taken down with it."""

    def __init__(self, message: str, outcomes: tuple[RankOutcome, ...]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


@dataclass(frozen=True)
class RankConfig:
    """How one worker's ranks run. Defaults suit CPU tests: gloo, one torch thread each."""

    world: int
    backend: str = "gloo"  # "nccl" on GPUs: rank r uses cuda:r
    collective_timeout_s: float = 60.0  # no collective waits longer than this
    grace_s: float = 30.0  # after one rank fails, how long the others get to exit on their own
    threads: int = 1


@dataclass(frozen=True)
class RankContext:
    """What a rank's program is given: who it is, on what device, in which world."""

    rank: int
    world: int
    backend: str
    device: torch.device
    collective_timeout_s: float


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended, as the supervisor saw it."""

    rank: int
    exitcode: int | None
    result: Any  # the program's return value, None unless it returned
    error: str | None  # the rank's own account of its failure
    exited_at: float | None  # time.monotonic() when the supervisor saw it gone
    stopped: bool  # True when the supervisor had to stop it
    failed_at: float | None = None  # wall time the rank wrote its account of a failure

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and not self.stopped


Program = Callable[..., Any]


class RankGroup:
    """Start with `start()`, collect with `wait()`; leaving the `with` block stops every rank
    that is still running, whatever happened."""

    def __init__(self, config: RankConfig, program: Program, args: tuple[Any, ...], workdir: Path):
        self.config = config
        self.program = program
        self.args = args
        self.workdir = Path(workdir)
        self.processes: list[Any] = []

    def __enter__(self) -> RankGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ctx = mp.get_context("spawn")
        for rank in range(self.config.world):
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, self.config, self.program, self.args, str(self.workdir), os.getpid()),
                name=f"loom-rank-{rank}",
            )
            proc.start()
            self.processes.append(proc)

    def wait(self, timeout_s: float) -> tuple[RankOutcome, ...]:
        """Until every rank is gone: once one fails the rest get `grace_s` to follow on their
        own, and past `timeout_s` all are stopped. Never raises for a rank's failure."""
        deadline = time.monotonic() + timeout_s
        exited: dict[int, float] = {}
        stopped: set[int] = set()
        failed_at: float | None = None
        while len(exited) < len(self.processes):
            wait_sentinels([p.sentinel for p in self.processes if p.exitcode is None], 0.05)
            now = time.monotonic()
            for rank, proc in enumerate(self.processes):
                if proc.exitcode is not None and rank not in exited:
                    exited[rank] = now
                    if proc.exitcode != 0 and failed_at is None:
                        failed_at = now
            late = failed_at is not None and now > failed_at + self.config.grace_s
            if late or now > deadline:
                for rank, proc in enumerate(self.processes):
                    if proc.exitcode is None:
                        stopped.add(rank)
                        _stop(proc)
        ranks = range(len(self.processes))
        return tuple(self._outcome(r, exited.get(r), r in stopped) for r in ranks)

    def stop(self) -> None:
        for proc in self.processes:
            if proc.exitcode is None:
                _stop(proc)

    def _outcome(self, rank: int, exited_at: float | None, stopped: bool) -> RankOutcome:
        proc = self.processes[rank]
        result_file = self.workdir / f"rank{rank}.result"
        error_file = self.workdir / f"rank{rank}.error"
        result = torch.load(result_file, weights_only=False) if result_file.exists() else None
        error = failed_at = None
        if error_file.exists():
            error, failed_at = error_file.read_text(), error_file.stat().st_mtime
        return RankOutcome(rank, proc.exitcode, result, error, exited_at, stopped, failed_at)


def run_ranks(
    config: RankConfig, program: Program, *args: Any, workdir: Path, timeout_s: float = 600.0
) -> list[Any]:
    """Run `program(ctx, *args)` on every rank; their results in rank order, or RankFailure."""
    with RankGroup(config, program, args, workdir) as group:
        outcomes = group.wait(timeout_s)
    if all(o.ok for o in outcomes):
        return [o.result for o in outcomes]
    bad = sorted((o for o in outcomes if not o.ok), key=_failure_order)
    lines = (bad[0].error or "").strip().splitlines()
    first = lines[0] if lines else f"rank {bad[0].rank}: no account (killed?)"
    codes = [o.exitcode for o in outcomes]
    raise RankFailure(
        f"{len(bad)} of {config.world} ranks failed (exit codes {codes}); first {first}", outcomes
    )


class StepServer(Protocol):
    """A rank's answers to its engine: `ready` once started, then one reply per message."""

    def ready(self) -> Any: ...

    def handle(self, message: Any) -> Any: ...


def serve_steps(
    ctx: RankContext, conns: tuple[Connection, ...], start: Callable[[], StepServer]
) -> int:
    """A rank's loop under an engine: keep its own pipe of `conns`, build its server with
    `start` (joining groups, loading weights), send the server's ready record, then answer
    every message until the engine closes the pipe or sends None. Returns the messages
    answered. A message that raises fails the rank (its account goes to rankN.error); the
    engine sees its pipe close and takes the worker down."""
    conn = conns[ctx.rank]
    for i, other in enumerate(conns):
        if i != ctx.rank:
            other.close()
    with torch.inference_mode():
        server = start()
        conn.send(server.ready())
        answered = 0
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the engine went away
                return answered
            if message is None:
                return answered
            conn.send(server.handle(message))
            answered += 1


def _failure_order(outcome: RankOutcome) -> tuple[int, float, float]:
    """The likely root cause first: a rank that died without an account (killed), then
    the one whose account was written first."""
    never = float("inf")
    return (outcome.error is not None, outcome.failed_at or never, outcome.exited_at or never)


def _stop(proc: Any) -> None:
    proc.terminate()
    proc.join(STOP_TIMEOUT_S)
    if proc.exitcode is None:
        proc.kill()
        proc.join(STOP_TIMEOUT_S)


def _rank_main(
    rank: int,
    config: RankConfig,
    program: Program,
    args: tuple[Any, ...],
    workdir: str,
    supervisor: int,
) -> None:
    """A rank process: join the world, run the program, leave its result or its last words."""
    _exit_when_orphaned(supervisor)
    torch.set_num_threads(config.threads)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    out = Path(workdir)
    try:
        ctx = _join(rank, config, out)
        result = program(ctx, *args)
        torch.save(result, out / f"rank{rank}.result.tmp")
        os.replace(out / f"rank{rank}.result.tmp", out / f"rank{rank}.result")
    except BaseException as err:
        account = f"rank {rank} of {config.world} failed: {type(err).__name__}: {err}"
        (out / f"rank{rank}.error").write_text(account + "\n\n" + traceback.format_exc())
        logger.error("rank failed", extra={"rank": rank, "error": account})
        # Never tear the group down through a dead peer: that can hang. The process goes.
        os._exit(EXIT_FAILED)
    dist.destroy_process_group()


def _join(rank: int, config: RankConfig, workdir: Path) -> RankContext:
    if config.backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        config.backend,
        init_method=(workdir / "rendezvous").absolute().as_uri(),
        rank=rank,
        world_size=config.world,
        timeout=timedelta(seconds=config.collective_timeout_s),
    )
    return RankContext(rank, config.world, config.backend, device, config.collective_timeout_s)


def _exit_when_orphaned(supervisor: int) -> None:
    """A daemon thread: when the supervisor process is gone, so is this rank."""

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(PARENT_POLL_S)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="loom-rank-orphan-watch", daemon=True).start()
