"""The Engine: the thread-safe shell around one Batcher (admission, abort, pause, weights).

Owns the step thread, the bounded inbox between callers and that thread, and the in-flight
set; never decides scheduling itself and never calls a client callback while holding a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

import torch

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState, CompletedRequest
from loom_runtime.engine.batcher import Batcher
from loom_runtime.engine.build import (
    build_forward,
    build_frees,
    build_lane,
    build_reloads,
    build_remote,
)
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.drain_clock import DrainClock
from loom_runtime.engine.draw import check_draw
from loom_runtime.engine.grammar.check import check_grammar
from loom_runtime.engine.grammar.compiler import GrammarCompiler
from loom_runtime.engine.keep_swap import check_keep
from loom_runtime.engine.kv_memory.hisparse import hisparse_stats
from loom_runtime.engine.kv_memory.pool import engine_kv, kv_offload, offload_stats
from loom_runtime.engine.model_weights import ModelWeights, Swap
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.ranks.check import check_ranks
from loom_runtime.engine.ranks.start import start_engine_ranks
from loom_runtime.engine.remote import check_transfer_request
from loom_runtime.engine.runner import TOKEN_FORWARD
from loom_runtime.engine.shared_step_thread import SharedStepThread, condition_for, step_thread_for
from loom_runtime.engine.spec.check import check_mtp
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.transfer_port import DisaggSettings, KVConnectorPort
from loom_runtime.engine.types import EngineRequest, EngineStats, RequestOutput, SamplingParams
from loom_runtime.engine.validate import check_prompt_logprobs, validate_request
from loom_runtime.errors import AdmissionError, InvalidRequestError
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.loop.contract import LoopContext
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.transfer.weight_push import StagedPush
from loom_runtime.wire.kv_events import KVEventSink
from loom_runtime.wire.prefix_hash import PrefixHasher
from loom_trainer.protocol import TensorSpec

logger = logging.getLogger(__name__)

OnOutput = Callable[[RequestOutput], None]


class Engine:
    """Continuous-batching engine over one model. Public methods are thread-safe.

    Without `start()`, `generate` and `pause` drive steps on the calling thread, which tests use
    for deterministic runs; with it, a daemon thread runs the steps. A P/D worker passes its
    role (`disagg`) and a KV connector; the engine registers its KV pool with the connector.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        events: KVEventSink | None = None,
        disagg: DisaggSettings | None = None,
        connector: KVConnectorPort | None = None,
        shared_thread: SharedStepThread | None = None,
        ranks: EngineRanks | None = None,
        drafter: Drafter | None = None,
        checkpoint: Path | None = None,
    ) -> None:
        """`shared_thread`: share one step thread (and lock) with the other engines of this worker.
        `ranks`: the rank processes of a parallel engine (config.parallel; `from_checkpoint`
        starts them); the engine then schedules and samples here and runs every forward on
        them, and closes them at shutdown. `drafter`: with MTP speculation, what proposes the
        drafts instead of the MTP layer (tests force acceptances with an oracle). `checkpoint`:
        the directory the ranks started from (a push becomes a checkpoint beside it)."""
        check_ranks(loaded.config, config, ranks, disagg)
        if (disagg is None) != (connector is None):
            raise ValueError("a P/D engine needs both its role (disagg) and a KV connector")
        if loaded.model.dtype != config.dtype:
            raise ValueError(
                f"model weights are {loaded.model.dtype} but EngineConfig.dtype is "
                f"{config.dtype}; load the model with the config's dtype"
            )
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        self.grammars = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
        check_mtp(loaded.config, config)
        self._model = loaded.model
        mc, bs = loaded.config, config.block_size
        self.max_model_len = config.resolve_max_model_len(mc.max_position_embeddings)
        kv = engine_kv(mc, config, self.max_model_len, loaded.model.device, ranks, bool(disagg))
        cache, self.num_blocks, self._hisparse = kv.cache, kv.num_blocks, kv.hisparse
        self._kv_cache_bytes, self._kv_bytes_per_token = kv.device_bytes, kv.bytes_per_token
        self._pool = BlockPool(self.num_blocks, bs, events=events)
        self._offload = kv_offload(kv, config, events)
        hasher = PrefixHasher(bs, seed=config.prefix_hash_seed)
        k = config.mtp_draft_tokens
        self._kv = KVAllocator(
            self._pool, hasher, self._offload, config.kv_reload_async, draft_rows=k > 0
        )
        self._ranks = ranks
        self._weights = ModelWeights(loaded.model, ranks, checkpoint)
        forward = build_forward(loaded.model, cache, config, ranks, drafter)
        self._runner, self._spec = forward.runner, forward.spec
        self._prompt_logprobs = forward.prompt_logprobs
        self._loop = ARDecodeLoop(
            self._kv,
            new_decoder=loaded.tokenizer.incremental_decoder,
            eos_token_ids=loaded.tokenizer.eos_token_ids,
            prefix_caching=config.use_prefix_cache,
            on_free=build_frees(ranks, self._hisparse, self._runner),
            draft_tokens=forward.draft_tokens,
            grammars=self.grammars.compile,
        )
        self.disagg = disagg
        remote = build_remote(
            self._loop, config, disagg, connector, cache, self._hisparse, self._wake
        )
        self._reloads = build_reloads(self._loop, config, self._offload, self._wake)
        self._lane = build_lane(
            loaded.model, cache, self._kv, self._emit, self._runner, ranks, disagg
        )
        limits = (config.max_num_batched_tokens, config.max_num_seqs)
        self._batcher = Batcher(
            self._loop, {TOKEN_FORWARD: forward.executor}, limits, self._emit, remote,
            self._reloads, kv.replica_blocks, self._lane,
        )  # fmt: skip
        self._weights_version = config.weights_version
        # Shared with callers, guarded by _lock; _cond wakes the step thread and pause waiters.
        self._cond = condition_for(shared_thread)
        self._lock = self._cond  # `with self._lock` takes the condition's lock
        self._inbox: deque[ARDecodeState] = deque()
        self._aborts: set[str] = set()
        self._callbacks: dict[str, OnOutput] = {}  # in flight: added, final output not yet sent
        self._admission_open = True
        self._drain = DrainClock()  # guarded by _lock
        self._closed = False  # shut down: never reopens
        self._stats = self._snapshot()
        # Held around every step and every weight swap: the step boundary.
        self._step_lock = threading.Lock()
        self._thread = step_thread_for(
            shared_thread, self._cond, "engine", config.model_name,
            self.step, self._has_work, self._abort_all_now, config.idle_wait_s,
        )  # fmt: skip

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: EngineConfig,
        events: KVEventSink | None = None,
        disagg: DisaggSettings | None = None,
        connector: KVConnectorPort | None = None,
        shared_thread: SharedStepThread | None = None,
        drafter: Drafter | None = None,
    ) -> Engine:
        if config.parallel.world == 1:
            loaded = load_model(path, dtype=config.dtype, device=config.device)
            return cls(loaded, config, events, disagg, connector, shared_thread, drafter=drafter)
        # the ranks load the weights; this process needs the config and tokenizer only
        loaded = load_model(path, dtype=config.dtype, device=config.device, weights=False)
        ranks = start_engine_ranks(str(path), loaded, config, disagg)
        try:
            return cls(
                loaded, config, events, disagg, connector, shared_thread, ranks, drafter, Path(path)
            )
        except BaseException:
            ranks.close()
            raise

    @property
    def weights_version(self) -> str:
        return self._weights_version

    @property
    def tokens_run(self) -> int:
        """Tokens pushed through the model so far (prefill, decode and recompute)."""
        return self._runner.tokens_run

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise AdmissionError("the engine was shut down; build a new one")
            self._thread.start()

    def shutdown(self, timeout: float = 10) -> None:
        """Abort everything in flight, stop the step thread and join it (bounded by timeout)."""
        with self._lock:
            self._closed = True
            self._admission_open = False
            self._aborts.update(self._callbacks)
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        if not self._wait_idle(deadline):
            logger.warning("shutdown: requests still in flight after %.1fs", timeout)
        if not self._thread.stop(deadline - time.monotonic()):
            logger.warning("shutdown: step thread did not stop within %.1fs", timeout)
        if self._reloads is not None:
            self._reloads.close(max(0.0, deadline - time.monotonic()))
        if self._ranks is not None:
            self._ranks.close(max(1.0, deadline - time.monotonic()))

    # --- requests -----------------------------------------------------------------------------

    def add_request(self, req: EngineRequest, on_output: OnOutput) -> None:
        """Queue a request; raises InvalidRequestError (bad input) or AdmissionError (closed)."""
        validate_request(req, self.max_model_len, self.model_config.vocab_size)
        check_transfer_request(req, self.disagg)
        check_prompt_logprobs(req, self._prompt_logprobs)
        check_grammar(req, self.grammars, self._loop.draft_tokens)
        patch = None if self._lane is None else self._lane.loop.patch_size
        check_draw(req, patch, self.config.max_num_batched_tokens)
        with self._lock:
            if self._thread.lost is not None:
                raise AdmissionError(
                    f"request {req.request_id!r} refused: the worker is lost "
                    f"({self._thread.lost}); retry on another worker"
                )
            if not self._admission_open:
                raise AdmissionError(
                    f"request {req.request_id!r} refused: admission is closed "
                    f"({'shut down' if self._closed else 'paused'}); retry on another worker"
                )
            if req.request_id in self._callbacks:
                raise InvalidRequestError(
                    f"request id {req.request_id!r} is already in flight", param="request_id"
                )
            limit = self.config.max_waiting + self.config.max_num_seqs
            if len(self._callbacks) >= limit:
                raise AdmissionError(
                    f"request {req.request_id!r} refused: {len(self._callbacks)} requests in "
                    f"flight (limit {limit}: max_num_seqs + max_waiting); retry later"
                )
            ctx = LoopContext(weights_version=self._weights_version)
            self._inbox.append(self._loop.init(req, ctx))
            self._callbacks[req.request_id] = on_output
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        """Finish the request at the next step boundary with finish_reason "abort"."""
        with self._lock:
            if request_id in self._callbacks:
                self._aborts.add(request_id)
                self._cond.notify_all()

    def loop_models(self) -> dict[str, object]:
        """The live model object each of this engine's loops runs: "text" (the AR loop) and, with
        a denoise lane, "denoise" (for a MoT worker both are one object: its weights once)."""
        models: dict[str, object] = {"text": self._model}
        if self._lane is not None:
            models["denoise"] = self._lane.executor.model
        return models

    def in_flight(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def stats(self) -> EngineStats:
        with self._lock:
            s, d = self._stats, self._settle_drain()
            return replace(
                s,
                num_waiting=s.num_waiting + len(self._inbox),
                admission_open=self._admission_open,
                weights_version=self._weights_version,
                drains=d.drains,
                drain_seconds=d.seconds,
                last_drain_seconds=d.last_seconds,
            )

    # --- drain and weights --------------------------------------------------------------------

    def pause(self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None) -> bool:
        """Close admission now. "wait": True once nothing is in flight and no KV lease waits for
        a remote decode, False on timeout. "abort": abort everything in flight, then True once
        their final outputs are out."""
        if mode not in ("wait", "abort"):
            raise InvalidRequestError(f"pause mode must be 'wait' or 'abort', got {mode!r}", "mode")
        with self._lock:
            self._drain.close(time.monotonic(), already_closed=not self._admission_open)
            self._admission_open = False
            if mode == "abort":
                self._aborts.update(self._callbacks)
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait_idle(deadline, leases=mode == "wait")

    def resume(self) -> None:
        with self._lock:
            if self._closed:
                raise AdmissionError("the engine was shut down; it cannot resume")
            self._drain.reopen()
            self._admission_open = True

    def load_weights(self, path: str, version: str) -> None:
        """Swap weights in place at a step boundary; needs paused with nothing in flight. A
        parallel engine checks the checkpoint's names and shapes here, then every rank loads
        it (a rank that fails after that takes the worker down: WorkerLostError)."""
        self._require_drained(version)
        self._swap(self._weights.from_checkpoint(path), version)

    def push_specs(self) -> dict[str, TensorSpec]:
        """What a pushed version must send (ModelWeights.specs)."""
        return self._weights.specs()

    def push_tensors(self) -> Mapping[str, torch.Tensor]:
        """The live tensors push_specs describes (what this worker sends a restarted peer);
        the caller reads them only while no swap can run."""
        return self._weights.tensors()

    def load_pushed(self, staged: StagedPush) -> None:
        """Swap a staged push in at a step boundary, like load_weights (paused and drained)."""
        self._require_drained(staged.version)
        self._swap(self._weights.from_push(staged), staged.version)

    def _swap(self, swap: Swap, version: str) -> None:
        with self._step_lock:
            self._require_drained(version)
            swap()
            self._batcher.drained_weights()
            self._bump(version)

    def load_pushed_keep(self, staged: StagedPush, kv: str = "keep") -> None:
        """Swap a staged push in under the running requests (push mode keep), nothing aborted:
        at a step boundary (a request added meanwhile waits in the inbox and runs on the new
        version), then every request goes on, its next tokens carrying the new version. `kv`
        "keep": running requests keep the KV computed under the old weights; "recompute": they
        re-prefill prompt + output so far under the new ones (also a decode's prompt KV still
        to pull, and a drawing's text KV). The prefix cache is dropped; old KV never re-enters."""
        check_keep(kv, staged.version, self.weights_version)  # before any work
        swap = self._weights.from_push(staged)  # ranks: the checkpoint written, outside the lock
        with self._step_lock:
            old = self.weights_version
            policy = check_keep(kv, staged.version, old)
            swap()
            self._batcher.new_weights(old, staged.version, policy)
            self._bump(staged.version)

    def _bump(self, version: str) -> None:
        """The new weights are in: drop the prefix cache (keyed by the old weights), bump the
        version (requests still in the inbox will run on it). Called under the step lock."""
        dropped = self._kv.reset_prefix_cache()
        with self._lock:
            self._weights_version = version
            for state in self._inbox:
                self._loop.rebase(state, version)
            self._stats = self._snapshot()
        logger.info("weights loaded", extra={"version": version, "uncached_blocks": dropped})

    def _require_drained(self, version: str) -> None:
        with self._lock:
            if self._admission_open or self._callbacks:
                raise AdmissionError(
                    f"load_weights({version!r}) needs a paused engine with nothing in flight "
                    f"(admission {'open' if self._admission_open else 'closed'}, "
                    f"{len(self._callbacks)} in flight); call pause() first"
                )

    # --- convenience --------------------------------------------------------------------------

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        timeout: float = 300.0,
    ) -> CompletedRequest:
        """Run one request to the end and return all of it (blocking; for tests and tools)."""
        rid = request_id or f"generate-{time.monotonic_ns()}"
        req = EngineRequest(rid, tuple(prompt_token_ids), sampling or SamplingParams())
        collector = OutputCollector(req)
        self.add_request(req, collector)
        drive = None if self.step_thread_alive() else self.step
        if not collector.wait(time.monotonic() + timeout, drive):
            self.abort(rid)
            raise TimeoutError(f"request {rid!r} did not finish within {timeout}s")
        return collector.result()

    # --- the step thread ----------------------------------------------------------------------

    def step(self) -> bool:
        """One step on the calling thread: take the inbox and aborts, then schedule/run/update.

        False when there was nothing to run. The step thread calls this in a loop.
        """
        with self._step_lock:
            with self._lock:
                new = list(self._inbox)
                self._inbox.clear()
                aborts, self._aborts = self._aborts, set()
            for state in new:
                self._batcher.add(state)
            if aborts:
                self._batcher.abort(aborts)
            ran = self._batcher.step()
            if self._ranks is not None:
                self._ranks.flush()  # finished requests leave the ranks now, not at the next step
            with self._lock:
                self._stats = self._snapshot()
                self._settle_drain()
            return ran

    def _abort_all_now(self) -> None:
        """After a step raised: finish every request with an abort (the error path)."""
        with self._step_lock:
            self._batcher.abort_all()

    def _has_work(self) -> bool:
        return bool(self._inbox or self._aborts or self._batcher.has_work)

    def _wake(self) -> None:
        """Called by the KV connector from its threads when a pull or a lease finished."""
        with self._lock:
            self._cond.notify_all()

    def step_thread_alive(self) -> bool:
        return self._thread.alive

    def _wait_idle(self, deadline: float | None, leases: bool = False) -> bool:
        """Until nothing is in flight (True) or the deadline passes (False); with `leases`, also
        until no KV lease waits for its pull (a draining prefill keeps its promises).

        Drives steps on this thread when no step thread runs.
        """
        while True:
            with self._lock:
                if not self._callbacks and not (leases and self._stats.num_kv_leases):
                    return True
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self.step_thread_alive():
                    wait = self.config.idle_wait_s if remaining is None else remaining
                    self._cond.wait(min(wait, 1.0))
                    continue
            if not self.step():
                with self._lock:  # nothing can run now: do not spin
                    self._cond.wait(self.config.idle_wait_s)

    def _emit(self, out: RequestOutput) -> None:
        """Deliver to the request's callback (never under _lock); a failing callback aborts."""
        with self._lock:
            callback = self._callbacks.get(out.request_id)
        if callback is None:
            return
        try:
            callback(out)
        except Exception:
            logger.exception("on_output raised; aborting", extra={"request_id": out.request_id})
            if not out.finished:
                self.abort(out.request_id)
        if out.finished:
            with self._lock:
                self._callbacks.pop(out.request_id, None)
                self._cond.notify_all()

    def _settle_drain(self) -> DrainClock:
        """Count a drain that just ended (call under _lock: idle and closed)."""
        idle = not self._callbacks and not self._stats.num_kv_leases
        self._drain.settle(time.monotonic(), idle)
        return self._drain

    def _snapshot(self) -> EngineStats:
        pool = self._pool
        return EngineStats(
            kv_usage=pool.usage,
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            block_size=pool.block_size,
            admission_open=self._admission_open,
            weights_version=self._weights_version,
            prefix_queries=self._kv.prefix_queries,
            prefix_hits=self._kv.prefix_hits,
            kv_cache_bytes=self._kv_cache_bytes,
            kv_bytes_per_token=self._kv_bytes_per_token,
            **self._batcher.stats_counts(),
            **offload_stats(self._offload),
            **hisparse_stats(self._hisparse, self._ranks, self.config),
            ranks=() if self._ranks is None else self._ranks.kv(),
            spec=None if self._spec is None else self._spec.stats,
        )
