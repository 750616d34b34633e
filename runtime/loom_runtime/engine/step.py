"""One engine step over the waiting and running AR-decode loops: schedule -> execute -> update.

Owns the waiting queue, the running set and the step counters; single-threaded (the Engine
holds its step lock around every call) and never blocks, sleeps or talks to a client directly.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loom_runtime.engine.ar_decode import ARDecodeLoop, ARDecodeState, TokenResult
from loom_runtime.engine.remote import RemoteKV
from loom_runtime.engine.runner import TOKEN_FORWARD, ModelRunner, TokenWork
from loom_runtime.engine.sampler import SampledToken, sample
from loom_runtime.engine.scheduler import Schedule, StepLimits, WaitingSeq, blocks_for, schedule
from loom_runtime.engine.types import RequestOutput
from loom_runtime.loop.contract import Done, WorkPlan

logger = logging.getLogger(__name__)

Emit = Callable[[RequestOutput], None]


@dataclass(frozen=True)
class StepCounters:
    """Monotonic counters of a StepLoop (the engine adds them to its stats)."""

    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_tokens_computed: int = 0
    num_requests_finished: int = 0
    num_requests_aborted: int = 0


class StepLoop:
    """The continuous batcher: every step folds the plans of all running loops into one forward.

    `emit` receives each RequestOutput (increments, then one final) on the calling thread.
    `remote` (P/D workers only) leases finished prefills and pulls remote prompts first.
    """

    def __init__(
        self,
        loop: ARDecodeLoop,
        runner: ModelRunner,
        limits: tuple[int, int],  # (max_num_batched_tokens, max_num_seqs)
        emit: Emit,
        remote: RemoteKV | None = None,
    ) -> None:
        self.loop = loop
        self.runner = runner
        self.kv = loop.kv
        self.token_budget, self.max_num_seqs = limits
        self.emit = emit
        self.waiting: deque[ARDecodeState] = deque()
        self.running: list[ARDecodeState] = []  # admission order, oldest first
        self.counters = StepCounters()
        self.remote = remote

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or (self.remote and self.remote.has_work))

    def add(self, state: ARDecodeState) -> None:
        if self.remote is not None and self.remote.wants(state):
            self.remote.add(state)
        else:
            self.waiting.append(state)

    def abort(self, request_ids: set[str]) -> None:
        """Finish these requests now with finish_reason "abort", freeing their blocks (a request
        whose KV is being pulled finishes once the pull has stopped writing its blocks)."""
        for state in [s for s in [*self.running, *self.waiting] if s.request_id in request_ids]:
            self.loop.abort(state)
            self._finish(state)
        if self.remote is not None:
            for state in self.remote.abort(request_ids):
                self._finish(state)

    def abort_all(self) -> None:
        remote = self.remote.request_ids if self.remote is not None else set()
        self.abort({s.request_id for s in [*self.running, *self.waiting]} | remote)

    # --- the step -----------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one step; False when nothing could be scheduled."""
        if self.remote is not None:
            self._remote_step(self.remote)
        decision = self._schedule()
        if decision.empty:
            return False
        batch = self._apply(decision)
        if not batch:
            return False
        try:
            results = self._execute(batch)
        except Exception:
            logger.exception("step failed; aborting its requests", extra={"size": len(batch)})
            for state, _ in batch:
                self.loop.abort(state)
                self._finish(state)
            return True
        self._update(batch, results)
        return True

    def _remote_step(self, remote: RemoteKV) -> None:
        """Free pulled/expired leases, fold in finished pulls and start new ones (before the
        schedule, so a just-pulled request runs its last prompt token in this step)."""
        remote.reap()
        free = self.kv.pool.num_free - self._growth()
        progress = remote.progress(free, self.max_num_seqs - len(self.running))
        if progress.admitted_prompt_tokens:
            self._count(num_prompt_tokens=progress.admitted_prompt_tokens)
        self.running.extend(progress.ready)
        self.waiting.extend(progress.local)
        for state in progress.failed:
            self._finish(state)

    def _growth(self) -> int:
        """Blocks the running requests need added to run their next tokens."""
        return sum(
            max(0, blocks_for(len(s.tokens), self.kv.block_size) - len(s.table.block_ids))
            for s in self.running
        )

    def _schedule(self) -> Schedule:
        pool = self.kv.pool
        growth = self._growth()
        exact = growth > pool.num_free  # shared-block counts only matter when preempting
        running = [self.loop.running_view(s, exact) for s in self.running]
        max_seqs = self.max_num_seqs - (len(self.remote.pulling) if self.remote else 0)
        candidates = min(len(self.waiting), max_seqs - len(self.running))
        waiting: list[WaitingSeq] = [
            self.loop.admission_view(self.waiting[i]) for i in range(max(0, candidates))
        ]
        limits = StepLimits(self.token_budget, max_seqs, pool.num_free, self.kv.block_size)
        return schedule(running, waiting, limits)

    def _apply(self, decision: Schedule) -> list[tuple[ARDecodeState, WorkPlan[TokenResult]]]:
        by_id = {s.request_id: s for s in self.running}
        for rid in decision.preempted:
            state = by_id.pop(rid)
            self._preempt(state)
        batch: list[tuple[ARDecodeState, WorkPlan[TokenResult]]] = []
        admitted = set(decision.admitted)
        for chunk in decision.chunks:
            if chunk.request_id in admitted:
                state = self.waiting[0]
                if state.request_id != chunk.request_id or not self._admit(state):
                    break  # the views went stale; admit the rest next step
            else:
                state = by_id[chunk.request_id]
                if chunk.new_blocks and not self.loop.grow(state, chunk.num_tokens):
                    logger.warning(
                        "grow failed after scheduling", extra={"request_id": state.request_id}
                    )
                    self._preempt(state)
                    continue
            plan = self.loop.next(state)
            if isinstance(plan, Done):
                continue
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

    def _execute(
        self, batch: Sequence[tuple[ARDecodeState, WorkPlan[TokenResult]]]
    ) -> list[TokenResult]:
        forward = [(i, p.work) for i, (_, p) in enumerate(batch) if p.shape == TOKEN_FORWARD]
        works = [w for _, w in forward if isinstance(w, TokenWork)]
        if len(works) != len(forward):
            raise TypeError("a token_forward plan without a TokenWork payload")
        results: list[TokenResult | None] = [None] * len(batch)
        if works:
            logits = self.runner.execute(works)
            rows = [
                (i, row) for (i, _), row in zip(forward, logits, strict=True) if row is not None
            ]
            by_index: dict[int, SampledToken] = {}
            if rows:
                picked = sample(
                    torch.stack([row for _, row in rows]),
                    [batch[i][0].request.sampling for i, _ in rows],
                    [batch[i][0].generator for i, _ in rows],
                )
                by_index = {i: tok for (i, _), tok in zip(rows, picked, strict=True)}
            for i, w in forward:
                assert isinstance(w, TokenWork)
                results[i] = TokenResult(len(w.token_ids), by_index.get(i))
        for i, (_, plan) in enumerate(batch):
            if results[i] is None:  # a plan no batched executor knows: run it alone
                results[i] = plan.thunk()
        return [r for r in results if r is not None]

    def _update(
        self,
        batch: Sequence[tuple[ARDecodeState, WorkPlan[TokenResult]]],
        results: Sequence[TokenResult],
    ) -> None:
        computed = sum(r.num_tokens for r in results)
        sampled = sum(1 for r in results if r.sampled is not None)
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
        if self.remote is not None:
            self.remote.hold(state)  # a P/D prefill keeps its prompt blocks under a lease
        self.loop.finalize(state)
        out = self.loop.take_output(state)
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

    def _count(self, **deltas: int) -> None:
        c = self.counters
        self.counters = StepCounters(
            **{k: getattr(c, k) + deltas.get(k, 0) for k in StepCounters.__dataclass_fields__}
        )
