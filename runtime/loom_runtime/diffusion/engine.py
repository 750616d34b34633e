"""The DiffusionEngine: the thread-safe shell around one DiffusionBatcher (admission by memory,
progress, abort, pause, component weight syncs).

Owns the step thread, the bounded queue of accepted requests, the memory ledger, the step cost
model (fed by every measured forward; admission reads its prediction against the step budget) and
the callbacks; never decides what shares a step (the batcher does) and never calls a callback
holding a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal

from loom_runtime.diffusion.batcher import DiffusionBatcher
from loom_runtime.diffusion.engine_types import (
    ComponentName,
    ComponentVersions,
    DiffusionEngineConfig,
    DiffusionProgress,
    DiffusionStats,
)
from loom_runtime.diffusion.forward import wan_executors, wan_shape
from loom_runtime.diffusion.loop import DiffusionLoop, DiffusionState
from loom_runtime.diffusion.memory import MemoryLedger, MemoryModel
from loom_runtime.diffusion.step_cost import StepCostModel, StepLoad, StepSample
from loom_runtime.diffusion.text_feature_cache import TextFeatureCache
from loom_runtime.diffusion.types import DENOISE, DiffusionOutput, DiffusionRequest
from loom_runtime.engine.shared_step_thread import SharedStepThread, condition_for, step_thread_for
from loom_runtime.errors import AdmissionError, InvalidRequestError
from loom_runtime.loop.contract import LoopContext
from loom_runtime.models.wan.loader import LoadedWan, load_dit, load_text_encoder, load_vae

logger = logging.getLogger(__name__)

OnDiffusionOutput = Callable[[DiffusionOutput], None]


def memory_model(loaded: LoadedWan) -> MemoryModel:
    c = loaded.config
    return MemoryModel(
        dtype_bytes=loaded.transformer.dtype.itemsize,
        text_dim=c.text_encoder.d_model,
        dit_dim=c.transformer.inner_dim,
        dit_heads=c.transformer.num_attention_heads,
        vae_channels=c.vae.decoder_base_dim * max(c.vae.dim_mult),
    )


class DiffusionEngine:
    """Runs image and video requests of one Wan checkpoint. Public methods are thread-safe.

    A request is accepted when its peak memory can ever fit the budget (else 400) and the queue
    has room (else 503); it runs once its peak fits next to the running requests' and their
    predicted denoise step with it stays within the step budget (arrival order), and its
    reservation is released when its final output is out. Without `start()`, `step()` drives it
    on the calling thread (deterministic tests)."""

    def __init__(
        self,
        loaded: LoadedWan,
        config: DiffusionEngineConfig,
        shared_thread: SharedStepThread | None = None,
    ) -> None:
        """`shared_thread`: share one step thread (and lock) with the other engines of this
        worker."""
        if loaded.transformer.dtype != config.dtype:
            raise ValueError(
                f"the Wan weights are {loaded.transformer.dtype} but the config asks for "
                f"{config.dtype}; load the checkpoint with the config's dtype"
            )
        self.config = config
        self.tokenizer = loaded.tokenizer
        self._loaded = loaded
        self.shape = wan_shape(loaded, config.text_len)
        self.memory = memory_model(loaded)
        v = config.versions
        self.features = TextFeatureCache(
            config.text_cache_entries, config.model_name, config.dtype, config.text_len,
            v.text_encoder,
        )  # fmt: skip
        self._loop = DiffusionLoop(
            self.shape, config.default_steps, config.pinned_steps, self.features
        )
        self.costs = StepCostModel()  # guarded by _lock
        executors = wan_executors(loaded, config.text_len, self._observe_cost)
        self._batcher = DiffusionBatcher(self._loop, executors, self._emit, config.max_running)
        self._versions = v
        # Shared with callers, guarded by _lock; _cond wakes the step thread and waiters.
        self._cond = condition_for(shared_thread)
        self._lock = self._cond  # `with self._lock` takes the condition's lock
        self._ledger = MemoryLedger(config.memory_budget_bytes)
        self._queue: deque[tuple[DiffusionState, int]] = deque()  # accepted, no memory yet
        self._aborts: set[str] = set()
        self._callbacks: dict[str, OnDiffusionOutput] = {}
        self._progress: dict[str, DiffusionProgress] = {}
        self._admission_open = True
        self._denoise_steps = self._finished = self._aborted = 0
        self._step_lock = threading.Lock()  # held around every step and every weight swap
        self._thread = step_thread_for(
            shared_thread, self._cond, "diffusion", config.model_name,
            self.step, self._has_work, self._abort_all_now, config.idle_wait_s,
        )  # fmt: skip

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._thread.start()

    def shutdown(self, timeout: float = 10) -> None:
        """Abort everything in flight, stop the step thread and join it (bounded by timeout)."""
        self.pause("abort", timeout)
        if not self._thread.stop(timeout):
            logger.warning("shutdown: step thread did not stop within %.1fs", timeout)

    def step_thread_alive(self) -> bool:
        return self._thread.alive

    # --- requests -----------------------------------------------------------------------------

    def peak_bytes(self, req: DiffusionRequest) -> int:
        """The request's estimated peak memory; InvalidRequestError for a size the model can't
        take."""
        return self.memory.peak_bytes(self.shape, req, self._loop.latent_shape(req))

    def add_request(self, req: DiffusionRequest, on_output: OnDiffusionOutput) -> None:
        """Accept a request; InvalidRequestError (bad input, can never fit) or AdmissionError
        (paused, queue full). Nothing is held when it raises."""
        peak = self.peak_bytes(req)
        if not self._ledger.can_ever_fit(peak):
            raise InvalidRequestError(
                f"request {req.request_id!r} ({req.width}x{req.height}, {req.num_frames} frames) "
                f"needs about {peak / 2**20:.1f} MiB at its peak, more than this worker's "
                f"diffusion memory budget ({self._ledger.budget / 2**20:.1f} MiB): ask for fewer "
                "frames or a smaller size",
                param="num_frames" if req.num_frames > 1 else "size",
            )
        with self._lock:
            if not self._admission_open:
                raise AdmissionError(
                    f"request {req.request_id!r} refused: admission is closed; retry elsewhere"
                )
            if req.request_id in self._callbacks:
                raise InvalidRequestError(f"request id {req.request_id!r} is already in flight")
            if len(self._queue) >= self.config.max_waiting:
                raise AdmissionError(
                    f"request {req.request_id!r} refused: {len(self._queue)} requests already "
                    f"wait (max_waiting {self.config.max_waiting}); retry later"
                )
            state = self._loop.init(req, LoopContext(weights_version=self._versions.transformer))
            self._queue.append((state, peak))
            self._callbacks[req.request_id] = on_output
            total = state.schedule.num_steps
            self._progress[req.request_id] = DiffusionProgress(
                req.request_id, "queued", 0, total, 0
            )
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        """Finish the request at the next step boundary with finish_reason "abort"."""
        with self._lock:
            if request_id in self._callbacks:
                self._aborts.add(request_id)
                self._cond.notify_all()

    def progress(self, request_id: str) -> DiffusionProgress | None:
        with self._lock:
            return self._progress.get(request_id)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._callbacks)

    def stats(self) -> DiffusionStats:
        with self._lock:
            running = len(self._batcher.running) + len(self._batcher.waiting)
            return DiffusionStats(
                num_running=running,
                num_waiting=len(self._queue),
                memory_reserved_bytes=self._ledger.reserved,
                memory_budget_bytes=self._ledger.budget,
                denoise_steps=self._denoise_steps,
                engine_steps=self._batcher.steps,
                requests_finished=self._finished,
                requests_aborted=self._aborted,
                text_cache_hits=self.features.hits,
                text_cache_misses=self.features.misses,
                text_cache_entries=len(self.features),
                admission_open=self._admission_open,
                versions=self._versions,
                step_costs=self.costs.kinds(),
                predicted_step_s=self.costs.predict_step(map(_step_load, self._active())),
            )

    @property
    def versions(self) -> ComponentVersions:
        return self._versions

    # --- drain and weights --------------------------------------------------------------------

    def pause(self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None) -> bool:
        """Close admission; "abort" also aborts everything in flight. True once idle."""
        with self._lock:
            self._admission_open = False
            if mode == "abort":
                self._aborts.update(self._callbacks)
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait_idle(deadline)

    def resume(self) -> None:
        with self._lock:
            self._admission_open = True

    def load_component(self, name: ComponentName, folder: str | Path, version: str) -> None:
        """Swap one component's weights at a step boundary (paused, nothing in flight). A new
        text encoder drops the feature cache; a new DiT or VAE keeps it."""
        self._require_drained(version)
        c, dtype, dev, root = (
            self._loaded.config,
            self.config.dtype,
            self.config.device,
            Path(folder),
        )
        with self._step_lock:
            self._require_drained(version)
            if name == "transformer":
                self._loaded = replace(
                    self._loaded, transformer=load_dit(root, c.transformer, dtype, dev)
                )
            elif name == "text_encoder":
                enc = load_text_encoder(root, c.text_encoder, dtype, dev)
                self._loaded = replace(self._loaded, text_encoder=enc)
                self.features.set_encoder_version(version)
            else:
                self._loaded = replace(self._loaded, vae=load_vae(root, c.vae, dtype, dev))
            self._batcher.executors = wan_executors(
                self._loaded, self.config.text_len, self._observe_cost
            )
            with self._lock:
                self._versions = replace(self._versions, **{str(name): version})
        logger.info("component weights loaded", extra={"component": name, "version": version})

    def _require_drained(self, version: str) -> None:
        with self._lock:
            if self._admission_open or self._callbacks:
                raise AdmissionError(
                    f"loading weights {version!r} needs a paused engine with nothing in flight "
                    f"({len(self._callbacks)} in flight); call pause() first"
                )

    # --- the step thread ----------------------------------------------------------------------

    def step(self) -> bool:
        """Take aborts and admit what fits, then one batcher step. False when nothing ran."""
        with self._step_lock:
            with self._lock:
                aborts, self._aborts = self._aborts, set()
                queued = [s for s, _ in self._queue if s.request_id in aborts]
                self._queue = deque((s, b) for s, b in self._queue if s.request_id not in aborts)
                admitted = self._admit()
            for state in queued:  # never reserved: finalize here, the batcher never saw them
                self._loop.abort(state)
                self._emit(self._loop.finalize(state))
            for state in admitted:
                self._batcher.add(state)
            if aborts:
                self._batcher.abort(aborts)
            before = [(s, s.step) for s in self._batcher.running + list(self._batcher.waiting)]
            ran = self._batcher.step()
            with self._lock:
                self._denoise_steps += sum(s.step - n for s, n in before)
                for s, _ in before:
                    if s.request_id in self._progress:
                        done, total = s.progress
                        self._progress[s.request_id] = DiffusionProgress(
                            s.request_id,
                            "in_progress",
                            done,
                            total,
                            self._ledger.held(s.request_id),
                        )
            return ran or bool(queued)

    def _admit(self) -> list[DiffusionState]:
        """Queued requests (in order) whose peak fits now and whose denoise step keeps the
        predicted step within the budget, under _lock; reserves their memory."""
        admitted: list[DiffusionState] = []
        loads = [_step_load(s) for s in self._active()]
        slots = self.config.max_running - len(loads)
        while self._queue and len(admitted) < slots:
            state, peak = self._queue[0]
            loads.append(_step_load(state))
            if not self._within_step_budget(loads):
                break
            if not self._ledger.try_reserve(state.request_id, peak):
                break
            self._queue.popleft()
            admitted.append(state)
        return admitted

    def _within_step_budget(self, loads: list[StepLoad]) -> bool:
        budget = self.config.step_budget_s
        return budget is None or len(loads) == 1 or self.costs.predict_step(loads) <= budget

    def _active(self) -> list[DiffusionState]:
        return [*self._batcher.running, *self._batcher.waiting]

    def _observe_cost(self, sample: StepSample) -> None:
        """A forward's measured time (from the executors, on the step thread) into the model."""
        with self._lock:
            self.costs.observe(sample)

    def _abort_all_now(self) -> None:
        """After a step raised: abort every request at the next step (the error path)."""
        with self._lock:
            self._aborts.update(self._callbacks)

    def _has_work(self) -> bool:
        return bool(self._queue or self._aborts or self._batcher.has_work)

    def _wait_idle(self, deadline: float | None) -> bool:
        while True:
            with self._lock:
                if not self._callbacks:
                    return True
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self.step_thread_alive():
                    self._cond.wait(
                        min(1.0, self.config.idle_wait_s if remaining is None else remaining)
                    )
                    continue
            if not self.step():
                with self._lock:
                    self._cond.wait(self.config.idle_wait_s)

    def _emit(self, out: DiffusionOutput) -> None:
        """Release the request's memory and progress, then deliver (never under _lock)."""
        with self._lock:
            self._ledger.release(out.request_id)
            self._progress.pop(out.request_id, None)
            callback = self._callbacks.pop(out.request_id, None)
            if out.finish_reason == "done":
                self._finished += 1
            else:
                self._aborted += 1
            self._cond.notify_all()
        if callback is None:
            return
        try:
            callback(out)
        except Exception:
            logger.exception("on_output raised", extra={"request_id": out.request_id})


def _step_load(state: DiffusionState) -> StepLoad:
    """What a request adds to a denoise step: its latents' rows (two under guidance)."""
    rows = 2 if state.request.guided else 1
    return StepLoad(DENOISE, tuple(state.latents.shape), rows)
