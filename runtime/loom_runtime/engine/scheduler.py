"""Scheduling decisions for one step: which running loops run how many tokens, who is preempted,
who is admitted (and, on DP ranks, on which replica). Pure functions over plain records,
table-tested.

Never touches the block pool, the model or a loop state: the engine builds the views and applies
the decision with the pool's atomic operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RunningSeq:
    """A running request as the scheduler sees it. Listed oldest admission first."""

    request_id: str
    num_new_tokens: int  # tokens its loop wants to run next (1 for a decode)
    context_len: int  # tokens whose KV is already computed
    blocks_held: int
    freeable_blocks: int  # blocks preempting it returns to the pool (not shared with others)
    num_draft_tokens: int = 0  # of num_new_tokens, drafts a speculative decode verifies
    replica: int = 0  # the DP replica whose ranks hold its rows (StepLimits.replica_free)

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 + self.num_draft_tokens


@dataclass(frozen=True)
class WaitingSeq:
    """A waiting request (new or preempted), listed in queue order."""

    request_id: str
    num_tokens: int  # tokens whose KV it needs: prompt plus output to recompute
    num_cached: int  # of those, served by the prefix cache on admission
    admit_blocks: int  # free blocks admission consumes (reservation for all num_tokens)


@dataclass(frozen=True)
class StepLimits:
    token_budget: int  # max_num_batched_tokens
    max_num_seqs: int
    free_blocks: int
    block_size: int
    # DP ranks (one engine, `dp` attention replicas): blocks each replica's ranks may still
    # take. A replica holds every block of its sequences' tables (its ranks keep each
    # sequence's rows themselves: a prefix shared in the pool is one copy per sequence there).
    # Empty: one pool, no replicas.
    replica_free: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScheduledChunk:
    request_id: str
    num_tokens: int
    new_blocks: int  # blocks to add before running (admission reservations are not counted)


@dataclass(frozen=True)
class Schedule:
    """One step's decision. `chunks` is in batch order: running decodes, running prefill
    chunks, then admitted requests' first chunks."""

    chunks: tuple[ScheduledChunk, ...] = ()
    preempted: tuple[str, ...] = ()  # newest first, in the order they were chosen
    admitted: tuple[str, ...] = ()
    free_blocks_left: int = 0
    replicas: tuple[int, ...] = ()  # with replica_free: the replica of each admitted request

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def pick_replica(replica_free: Sequence[int], blocks: int) -> int | None:
    """The replica a new sequence of `blocks` blocks goes to: the one with the most free
    blocks (the lowest on a tie), or None when it fits on none."""
    best = max(range(len(replica_free)), key=lambda r: (replica_free[r], -r), default=None)
    return best if best is not None and replica_free[best] >= blocks else None


def schedule(
    running: Sequence[RunningSeq], waiting: Sequence[WaitingSeq], limits: StepLimits
) -> Schedule:
    """Decode tokens first, then running prefill chunks, then admissions, under the budget.

    A running request that cannot get its blocks preempts the most recently admitted running
    request (possibly itself); on DP ranks, when its replica is what is short, the most recently
    admitted one of that replica. Nothing is admitted in a step that preempted, and admission
    is FIFO: it stops at the first waiting request that does not fit (in the pool, or on any
    replica: it goes to the one with the most free blocks), so none starves.
    """
    plan = _RunningPlan(list(running), limits)
    ordered = [r for r in running if r.is_decode] + [r for r in running if not r.is_decode]
    for seq in ordered:
        plan.place(seq)
    chunks = [plan.chosen[r.request_id] for r in ordered if r.request_id in plan.chosen]
    admitted: list[str] = []
    replicas: list[int] = []
    budget, free, replica_free = limits.token_budget - plan.tokens, plan.free, plan.replica_free
    slots = limits.max_num_seqs - (len(running) - len(plan.preempted))
    if not plan.preempted:
        for w in waiting:
            if budget <= 0 or slots <= 0 or w.admit_blocks > free:
                break
            if replica_free:
                whole = blocks_for(w.num_tokens, limits.block_size)
                replica = pick_replica(replica_free, whole)
                if replica is None:
                    break
                replica_free[replica] -= whole
                replicas.append(replica)
            n = min(w.num_tokens - w.num_cached, budget)
            chunks.append(ScheduledChunk(w.request_id, n, 0))
            admitted.append(w.request_id)
            budget, free, slots = budget - n, free - w.admit_blocks, slots - 1
    return Schedule(tuple(chunks), tuple(plan.preempted), tuple(admitted), free, tuple(replicas))


class _RunningPlan:
    """Working state of one schedule() call: chosen chunks, preemptions, what is left."""

    def __init__(self, running: list[RunningSeq], limits: StepLimits) -> None:
        self.alive = running  # admission order; victims come off the end
        self.limits = limits
        self.free = limits.free_blocks
        self.replica_free = list(limits.replica_free)
        self.tokens = 0
        self.chosen: dict[str, ScheduledChunk] = {}
        self.preempted: list[str] = []

    def place(self, seq: RunningSeq) -> None:
        if seq.request_id in self.preempted:
            return
        n = min(seq.num_new_tokens, self.limits.token_budget - self.tokens)
        if n <= 0:
            return
        bs = self.limits.block_size
        need = max(0, blocks_for(seq.context_len + n, bs) - seq.blocks_held)
        while need > self.free or self._replica_short(seq.replica, need):
            victim = self._victim(seq.replica, need)
            self._preempt(victim)
            if victim.request_id == seq.request_id:
                return
        self.free -= need
        if self.replica_free:
            self.replica_free[seq.replica] -= need
        self.tokens += n
        self.chosen[seq.request_id] = ScheduledChunk(seq.request_id, n, need)

    def _replica_short(self, replica: int, need: int) -> bool:
        return bool(self.replica_free) and need > self.replica_free[replica]

    def _victim(self, replica: int, need: int) -> RunningSeq:
        """The newest running request; the newest of `replica` when that replica is short (the
        one asking is among them, so there is one)."""
        if self._replica_short(replica, need):
            return next(r for r in reversed(self.alive) if r.replica == replica)
        return self.alive[-1]

    def _preempt(self, victim: RunningSeq) -> None:
        self.alive.remove(victim)
        self.preempted.append(victim.request_id)
        self.free += victim.freeable_blocks
        undone = self.chosen.pop(victim.request_id, None)
        returned = victim.blocks_held + (0 if undone is None else undone.new_blocks)
        if self.replica_free:  # its replica's ranks drop every row of the sequence
            self.replica_free[victim.replica] += returned
        if undone is not None:
            self.free += undone.new_blocks
            self.tokens -= undone.num_tokens
