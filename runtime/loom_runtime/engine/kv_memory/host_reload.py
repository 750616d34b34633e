"""Asynchronous CPU KV offload reloads: admitted requests whose prefix comes from the host tier
wait here, holding their blocks, while a worker thread copies it in; the step loop goes on.

Owns the reloading requests, the copy thread and its bounded queues; never schedules compute and
never changes a block table off the step thread (the thread only copies bytes).

Like a P/D pull (engine/remote.py): a request aborted while its blocks are being written
finishes when the copy has ended, never before; so does a keep swap's work on a request whose
copy is in flight: its copied prefix is KV of the old weights from a tier the swap emptied, so it
lands uncached and is computed again under the new weights.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState
from loom_runtime.engine.keep_swap import KVPolicy
from loom_runtime.kv.offload import KVOffload, ReloadJob

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # the copy thread's wait for a job, between checks of its stop flag


@dataclass
class ReloadProgress:
    """What one `progress` call hands back to the batcher."""

    ready: list[ARDecodeState] = field(default_factory=list)  # copied: resume computing
    failed: list[ARDecodeState] = field(default_factory=list)  # aborted while copying: finish
    recompute: list[ARDecodeState] = field(default_factory=list)
    """A keep swap with kv "recompute" came while copying: re-prefill from the start."""


class HostReloads:
    """The reload half of one Batcher. Every method but the thread's runs on the step
    thread. `wake` is called (from the copy thread) when a reload finished."""

    def __init__(
        self, loop: ARDecodeLoop, offload: KVOffload, max_jobs: int, wake: Callable[[], None]
    ) -> None:
        self.loop = loop
        self.offload = offload
        self.reloading: dict[str, ARDecodeState] = {}
        self._swapped: dict[str, KVPolicy] = {}  # reloading at a keep swap, with its kv policy
        self._wake = wake
        self._jobs: queue.Queue[tuple[str, ReloadJob]] = queue.Queue(max_jobs)
        self._cond = threading.Condition()
        self._done: deque[tuple[str, BaseException | None]] = deque(maxlen=max_jobs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loom-kv-reload", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return len(self.reloading)

    def wants(self, state: ARDecodeState) -> bool:
        """True for a just-admitted request whose host-tier hits are still to be copied."""
        return state.table.reload is not None

    def add(self, state: ARDecodeState) -> None:
        job = state.table.reload
        assert job is not None
        self.reloading[state.request_id] = state
        self._jobs.put_nowait((state.request_id, job))  # bounded by max_num_seqs: never full

    def new_weights(self, kv: KVPolicy) -> list[ARDecodeState]:
        """A keep swap at this step boundary: the requests being copied in, each to land
        uncached (its copy is of the old weights) and, under `kv` "recompute", to re-prefill
        (a later swap's "keep" does not undo an earlier one's "recompute")."""
        for rid in self.reloading:
            if self._swapped.get(rid) != "recompute":
                self._swapped[rid] = kv
        return list(self.reloading.values())

    def progress(self) -> ReloadProgress:
        """Fold in the finished reloads."""
        out = ReloadProgress()
        with self._cond:
            done = list(self._done)
            self._done.clear()
        for request_id, error in done:
            state = self.reloading.pop(request_id)
            swapped = self._swapped.pop(request_id, None)
            if error is not None:  # the bytes may be partial: recompute them instead
                logger.warning(
                    "KV reload failed; recomputing: %s", error, extra={"request_id": request_id}
                )
            self.loop.reloaded(state, copied=error is None and swapped is None)
            if state.finished:
                out.failed.append(state)
            else:
                (out.recompute if swapped == "recompute" else out.ready).append(state)
        return out

    def abort(self, request_ids: Iterable[str]) -> None:
        """Mark these reloading requests aborted; they finish when their copy has ended."""
        for rid in set(request_ids) & self.reloading.keys():
            self.loop.abort(self.reloading[rid])

    def wait(self, timeout: float) -> None:
        """Block until a reload finishes or `timeout` passes (a step with nothing else to run)."""
        with self._cond:
            if self.reloading and not self._done:
                self._cond.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                request_id, job = self._jobs.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            error: BaseException | None = None
            try:
                self.offload.copy(job)
            except Exception as exc:  # reported to the step thread, which recomputes
                error = exc
            with self._cond:
                self._done.append((request_id, error))
                self._cond.notify_all()
            self._wake()
