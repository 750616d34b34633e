"""The batcher: continuous batching over the AR-decode loops, one step at a time.

One step: schedule (pure, over frozen views of the loops and their next plans) -> execute the
step's plans (one batched forward and one sample per executor shape) -> advance every loop with
its result. Owns the waiting queue, the running set and the step counters; single-threaded (the
Engine holds its step lock around every call) and never blocks, sleeps or talks to a client.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState
from loom_runtime.engine.denoise_lane import DenoiseLane
from loom_runtime.engine.keep_swap import KVPolicy
from loom_runtime.engine.kv_memory.host_reload import HostReloads
from loom_runtime.engine.remote import RemoteKV
from loom_runtime.engine.scheduler import Schedule, StepLimits, WaitingSeq, schedule
from loom_runtime.engine.token_forward import TokenResult
from loom_runtime.engine.types import RequestOutput
from loom_runtime.errors import WorkerLostError
from loom_runtime.loop.contract import Done, Executor, WorkPlan
from loom_runtime.loop.execute import execute_plans

logger = logging.getLogger(__name__)

Emit = Callable[[RequestOutput], None]
_RELOAD_WAIT_S = 0.01  # a step with only reloads in flight waits this long for one to land
Batch = list[tuple[ARDecodeState, WorkPlan[TokenResult]]]


@dataclass(frozen=True)
class StepCounters:
    """Monotonic counters of a Batcher (the engine adds them to its stats)."""

    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_prompt_tokens_arrived: int = 0
    num_generation_tokens: int = 0
    num_tokens_computed: int = 0
    num_requests_finished: int = 0
    num_requests_aborted: int = 0


class Batcher:
    """The continuous batcher: every step runs the next plans of all running loops together.

    `executors` maps a plan shape to the executor that runs all of a step's plans of that shape
    (the AR-decode loop's plans are TOKEN_FORWARD: one forward, one sample). `emit` receives
    each RequestOutput (increments, then one final) on the calling thread. `remote` (P/D
    workers only) leases finished prefills and pulls remote prompts first. `reloads` (CPU KV
    offload, asynchronous) holds admitted requests while their host-tier prefix is copied in.
    `replica_blocks` (DP ranks): each attention replica's capacity in blocks; the scheduler
    places each admitted request on a replica (its table's `replica`) and keeps every replica
    within its own. Empty: one pool. `lane` (a MoT model): the denoise loops of think-then-draw
    requests, whose steps share each step's token budget with the AR loops (denoise_lane.py).
    """

    def __init__(
        self,
        loop: ARDecodeLoop,
        executors: Mapping[Hashable, Executor[TokenResult]],
        limits: tuple[int, int],  # (max_num_batched_tokens, max_num_seqs)
        emit: Emit,
        remote: RemoteKV | None = None,
        reloads: HostReloads | None = None,
        replica_blocks: tuple[int, ...] = (),
        lane: DenoiseLane | None = None,
    ) -> None:
        self.loop = loop
        self.executors = executors
        self.kv = loop.kv
        self.token_budget, self.max_num_seqs = limits
        self.emit = emit
        self.waiting: deque[ARDecodeState] = deque()
        self.running: list[ARDecodeState] = []  # admission order, oldest first
        # Samples of one prompt (n > 1) waiting for the first sample's prompt KV, by its id:
        # they join the queue once it is computed and take its full blocks from the prefix cache.
        self.parked: dict[str, list[ARDecodeState]] = {}
        self.counters = StepCounters()
        self.remote = remote
        self.reloads = reloads
        self.replica_blocks = replica_blocks
        self.lane = lane

    @property
    def has_work(self) -> bool:
        return bool(
            self.waiting
            or self.running
            or self.parked
            or (self.remote and self.remote.has_work)
            or (self.reloads and self.reloads.reloading)
            or (self.lane and len(self.lane))
        )

    def stats_counts(self) -> dict[str, int]:
        """What the engine's stats take from the batcher: its queues, the prompt backlog, its
        step counters and the P/D transfer counts (EngineStats field names)."""
        c, remote = self.counters, self.remote
        t = remote.counters if remote is not None else None
        return {
            "num_running": len(self.running) + (len(self.lane) if self.lane is not None else 0),
            "num_waiting": len(self.waiting) + sum(len(p) for p in self.parked.values()),
            "num_preemptions": c.num_preemptions,
            "prefill_backlog_tokens": self.prefill_backlog_tokens(),
            "num_prompt_tokens": c.num_prompt_tokens,
            "num_prompt_tokens_arrived": c.num_prompt_tokens_arrived,
            "num_generation_tokens": c.num_generation_tokens,
            "num_tokens_computed": c.num_tokens_computed,
            "num_requests_finished": c.num_requests_finished,
            "num_requests_aborted": c.num_requests_aborted,
            "num_kv_leases": len(remote.held) if remote is not None else 0,
            "num_kv_pulls": len(remote.waiting) + len(remote.pulling) if remote is not None else 0,
            "kv_expired": t.kv_expired if t is not None else 0,
            "kv_transfer_failures": t.kv_transfer_failures if t is not None else 0,
            "kv_pulled_tokens": t.kv_pulled_tokens if t is not None else 0,
            "kv_pulled_bytes": t.kv_pulled_bytes if t is not None else 0,
        }

    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens of queued and running requests whose KV is not computed yet (what the
        planner's prefill target reads)."""
        parked = [s for p in self.parked.values() for s in p]
        return sum(
            max(0, s.num_prompt_tokens - s.num_computed)
            for s in (*self.waiting, *self.running, *parked)
        )

    def _busy_slots(self) -> int:
        """Sequence slots held outside the running set (pulling or reloading KV)."""
        pulling = len(self.remote.pulling) if self.remote is not None else 0
        return pulling + (len(self.reloads) if self.reloads is not None else 0)

    def add(self, state: ARDecodeState) -> None:
        self._count(num_prompt_tokens_arrived=state.num_prompt_tokens)
        leader = state.request.shares_prompt_of
        if leader is not None and self.loop.prefix_caching and self._prompt_pending(leader):
            self.parked.setdefault(leader, []).append(state)
        elif self.remote is not None and self.remote.wants(state):
            self.remote.add(state)
        else:
            self.waiting.append(state)

    def _prompt_pending(self, request_id: str) -> bool:
        """Whether that request is here and its prompt KV is not computed yet."""
        if any(s.request_id == request_id for s in self.waiting):
            return True
        if any(s.request_id == request_id and s.num_computed < s.num_prompt_tokens
               for s in self.running):  # fmt: skip
            return True
        if self.remote is not None and request_id in self.remote.request_ids:
            return True
        return self.reloads is not None and request_id in self.reloads.reloading

    def _unpark(self) -> None:
        """Parked samples whose first sample's prompt KV is computed (or which is gone) join
        the front of the queue: they came with a request already admitted."""
        for leader in [r for r in self.parked if not self._prompt_pending(r)]:
            self.waiting.extendleft(reversed(self.parked.pop(leader)))

    def abort(self, request_ids: set[str]) -> None:
        """Finish these requests now with finish_reason "abort", freeing their blocks (a request
        whose KV is being pulled finishes once the pull has stopped writing its blocks)."""
        parked = [s for p in self.parked.values() for s in p]
        for state in [s for s in [*self.running, *self.waiting, *parked]
                      if s.request_id in request_ids]:  # fmt: skip
            self.loop.abort(state)
            self._finish(state)
        if self.remote is not None:
            for state in self.remote.abort(request_ids):
                self._finish(state)
        if self.reloads is not None:
            self.reloads.abort(request_ids)
        if self.lane is not None:
            self.lane.abort(request_ids)
        self._unpark()

    def abort_all(self) -> None:
        remote = self.remote.request_ids if self.remote is not None else set()
        reloading = set(self.reloads.reloading) if self.reloads is not None else set()
        parked = {s.request_id for p in self.parked.values() for s in p}
        local = {s.request_id for s in [*self.running, *self.waiting]}
        drawing = set(self.lane.drawing) if self.lane is not None else set()
        self.abort(local | parked | remote | reloading | drawing)

    def new_weights(self, old: str, version: str, kv: KVPolicy) -> None:
        """New weights are in under these requests (a keep swap from `old`, at a step boundary):
        each one's next tokens carry `version`. kv "recompute": every running request drops its
        KV and is re-prefilled (prompt + output so far) under the new weights, oldest first, as
        after a preemption (and counted as one); "keep": it keeps its KV and goes on. A decode's
        requests still to pull their prompt KV follow the same policy (remote.py), and so do the
        drawing requests' text KV (denoise_lane.py)."""
        if kv == "recompute":
            for state in self.running[::-1]:  # each goes to the queue's front: oldest first
                self._preempt(state)
        if self.lane is not None:  # after the preemptions: their blocks are free for its recompute
            self.lane.new_weights(version, kv)
        parked = [s for p in self.parked.values() for s in p]
        reloading = self.reloads.new_weights(kv) if self.reloads is not None else []
        for state in [*self.running, *self.waiting, *parked, *reloading]:
            self.loop.rebase(state, version)
        if self.remote is not None:
            self.remote.new_weights(old, version, kv)

    def drained_weights(self) -> None:
        """New weights are in with nothing in flight (a drained load): a decode takes KV of no
        earlier version from now on, keep swaps before it included."""
        if self.remote is not None:
            self.remote.drained_weights()

    # --- the step -----------------------------------------------------------------------------

    def step(self) -> bool:
        """schedule -> execute -> advance, once; False when nothing could be scheduled."""
        self._unpark()
        if self.reloads is not None:
            self._reload_step(self.reloads)
        if self.remote is not None:
            self._remote_step(self.remote)
        # denoise steps first (oldest always), leaving each running AR loop at least one token
        denoise = self.lane.schedule(self.token_budget - len(self.running)) if self.lane else []
        batch = self._schedule_batch(sum(p.resources.compute_tokens for _, p in denoise))
        if denoise and self.lane is not None:
            self.lane.run(denoise)
        if not batch:
            if denoise:
                return True
            if self.reloads is None or not self.reloads.reloading:
                return False
            self.reloads.wait(_RELOAD_WAIT_S)  # only copies in flight: let them land
            return True
        try:
            results = execute_plans([plan for _, plan in batch], self.executors)
        except Exception as exc:
            logger.exception("step failed; aborting its requests", extra={"size": len(batch)})
            for state, _ in batch:
                self.loop.abort(state)
                self._finish(state)
            if isinstance(exc, WorkerLostError):
                raise  # its ranks are gone: no later step can run (the step thread stops)
            return True
        self._advance(batch, results)
        return True

    def _reload_step(self, reloads: HostReloads) -> None:
        """Requests whose host-tier prefix is copied in resume (before the schedule, so they
        run in this step)."""
        progress = reloads.progress()
        self.running.extend(progress.ready)
        for state in progress.recompute:  # a keep swap's recompute came while it copied
            self.running.append(state)
            self._preempt(state)
        for state in progress.failed:
            self._finish(state)

    def _remote_step(self, remote: RemoteKV) -> None:
        """Free pulled/expired leases, fold in finished pulls and start new ones (before the
        schedule, so a just-pulled request runs its last prompt token in this step)."""
        remote.reap()
        plans = self._next_plans()
        free = self.kv.pool.num_free - self._growth(plans)
        replica_free = self._replica_free(plans)
        reloading = len(self.reloads) if self.reloads is not None else 0
        slots = self.max_num_seqs - len(self.running) - reloading
        progress = remote.progress(free, slots, list(replica_free))
        if progress.admitted_prompt_tokens:
            self._count(num_prompt_tokens=progress.admitted_prompt_tokens)
        self.running.extend(progress.ready)
        self.waiting.extend(progress.local)
        for state in progress.failed:
            self._finish(state)

    def _next_plans(self) -> dict[str, WorkPlan[TokenResult]]:
        """Each running loop's next plan (described, not run), by request id."""
        plans: dict[str, WorkPlan[TokenResult]] = {}
        for state in list(self.running):
            plan = self.loop.next(state)
            if isinstance(plan, Done):  # finished outside a step: nothing left to run
                self._finish(state)
            else:
                plans[state.request_id] = plan
        return plans

    @staticmethod
    def _growth(plans: Mapping[str, WorkPlan[TokenResult]]) -> int:
        """Blocks the running loops' next plans need added to what they hold."""
        return sum(p.resources.cache_blocks for p in plans.values())

    def _replica_free(
        self, plans: Mapping[str, WorkPlan[TokenResult]] | None = None
    ) -> tuple[int, ...]:
        """DP ranks: blocks each replica may still take, its capacity less every block of the
        tables placed on it (running, pulling, reloading) and, given `plans`, the blocks the
        running loops' next plans add. Empty: one pool."""
        if not self.replica_blocks:
            return ()
        free = list(self.replica_blocks)
        placed = [*self.running]
        if self.remote is not None:
            placed += self.remote.pulling.values()
        if self.reloads is not None:
            placed += self.reloads.reloading.values()
        for state in placed:
            free[state.table.replica] -= state.table.num_blocks
        for state in self.running:
            plan = (plans or {}).get(state.request_id)
            if plan is not None:
                free[state.table.replica] -= plan.resources.cache_blocks
        return tuple(free)

    def _schedule_batch(self, denoise_tokens: int = 0) -> Batch:
        """Schedule this step and take its KV steps: the batch of (state, plan) to execute
        (`denoise_tokens` of the step's budget went to denoise steps)."""
        plans = self._next_plans()
        decision = self._schedule(plans, self.token_budget - denoise_tokens)
        return [] if decision.empty else self._apply(decision, plans)

    def _schedule(self, plans: Mapping[str, WorkPlan[TokenResult]], budget: int) -> Schedule:
        pool = self.kv.pool
        exact = self._growth(plans) > pool.num_free  # shared blocks only matter when preempting
        running = [
            self.loop.running_view(s, plans[s.request_id], exact)
            for s in self.running
            if s.request_id in plans
        ]
        max_seqs = self.max_num_seqs - self._busy_slots()
        candidates = min(len(self.waiting), max_seqs - len(self.running))
        waiting: list[WaitingSeq] = [
            self.loop.admission_view(self.waiting[i]) for i in range(max(0, candidates))
        ]
        limits = StepLimits(
            budget, max_seqs, pool.num_free, self.kv.block_size, self._replica_free()
        )
        return schedule(running, waiting, limits)

    def _apply(self, decision: Schedule, plans: Mapping[str, WorkPlan[TokenResult]]) -> Batch:
        by_id = {s.request_id: s for s in self.running}
        for rid in decision.preempted:
            state = by_id.pop(rid)
            self._preempt(state)
        batch: Batch = []
        placed = decision.replicas or (0,) * len(decision.admitted)  # () without replicas
        replicas = dict(zip(decision.admitted, placed, strict=True))
        admitted = set(decision.admitted)
        for chunk in decision.chunks:
            if chunk.request_id in admitted:
                state = self.waiting[0]
                if state.request_id != chunk.request_id:
                    break  # the views went stale; admit the rest next step
                state.table.replica = replicas[chunk.request_id]
                if not self._admit(state):
                    break
                if self.reloads is not None and self.reloads.wants(state):
                    self.running.remove(state)  # it runs once its prefix is copied in
                    self.reloads.add(state)
                    continue
                plan = self.loop.next(state)
                if isinstance(plan, Done):
                    continue
            else:
                state = by_id[chunk.request_id]
                if chunk.new_blocks and not self.loop.grow(state, chunk.num_tokens):
                    logger.warning(
                        "grow failed after scheduling", extra={"request_id": state.request_id}
                    )
                    self._preempt(state)
                    continue
                plan = plans[chunk.request_id]
            batch.append((state, plan.chunk(chunk.num_tokens)))
        return batch

    def _admit(self, state: ARDecodeState) -> bool:
        first = state.scheduled_time is None
        if not self.loop.admit(state):
            return False
        self.waiting.popleft()
        self.running.append(state)
        if first:
            self._count(num_prompt_tokens=state.num_prompt_tokens)
        return True

    def _preempt(self, state: ARDecodeState) -> None:
        self.running.remove(state)
        self.loop.preempt(state)
        self.waiting.appendleft(state)
        self._count(num_preemptions=1)
        logger.info("preempted", extra={"request_id": state.request_id})

    def _advance(self, batch: Batch, results: Sequence[TokenResult]) -> None:
        computed = sum(r.num_tokens for r in results)
        sampled = sum(r.num_emitted for r in results)
        self._count(num_tokens_computed=computed, num_generation_tokens=sampled)
        for (state, _), result in zip(batch, results, strict=True):
            self.loop.advance(state, result)
            if state.finished:
                self._finish(state)
            else:
                out = self.loop.take_output(state)
                if out is not None:
                    self.emit(out)

    def _finish(self, state: ARDecodeState) -> None:
        if state in self.running:
            self.running.remove(state)
        elif state in self.waiting:
            self.waiting.remove(state)
        else:
            self._drop_parked(state)
        if self.remote is not None:
            self.remote.hold(state)  # a P/D prefill keeps its prompt blocks under a lease
        drawing = self.lane is not None and self.lane.take(state)  # it keeps the text KV
        self.loop.finalize(state)
        out = self.loop.take_output(state)
        if drawing and out is not None and self.lane is not None:
            out = self.lane.hold(out)  # its final output comes with the image
        if state.finish_reason == "abort":
            self._count(num_requests_aborted=1)
        else:
            self._count(num_requests_finished=1)
        logger.debug(
            "finished",
            extra={"request_id": state.request_id, "finish_reason": state.finish_reason},
        )
        if out is not None:
            self.emit(out)

    def _drop_parked(self, state: ARDecodeState) -> None:
        leader = state.request.shares_prompt_of
        if leader is None or state not in self.parked.get(leader, ()):
            return
        self.parked[leader].remove(state)
        if not self.parked[leader]:
            del self.parked[leader]

    def _count(self, **deltas: int) -> None:
        c = self.counters
        self.counters = StepCounters(
            **{k: getattr(c, k) + deltas.get(k, 0) for k in StepCounters.__dataclass_fields__}
        )
