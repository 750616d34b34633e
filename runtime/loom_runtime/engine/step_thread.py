"""StepThread: the daemon thread that runs an engine's `step` while it has work, and otherwise
sleeps on the engine's condition until a caller wakes it (or `idle_wait_s` passes).

Owns the thread, its stop flag and its wait loop; never decides what a step does. Shared by the
LLM Engine and the DiffusionEngine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from loom_runtime.errors import WorkerLostError

logger = logging.getLogger(__name__)


class StepThread:
    """`cond` is the engine's condition (its lock guards what `has_work` reads); `on_error`
    runs, outside that lock, when a step raises: the engine aborts what was in it. A
    WorkerLostError also ends the thread (the worker's health check then fails)."""

    def __init__(
        self,
        name: str,
        cond: threading.Condition,
        step: Callable[[], bool],
        has_work: Callable[[], bool],
        on_error: Callable[[], None],
        idle_wait_s: float,
    ) -> None:
        self.name = name
        self._cond = cond
        self._step, self._has_work, self._on_error = step, has_work, on_error
        self._idle_wait_s = idle_wait_s
        self.lost: WorkerLostError | None = None  # why the thread stopped for good
        self._stop = False
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (call under the engine's lock); a running thread is left as it is."""
        if self.alive:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop after its current step and join it; False if it did not end
        within `timeout` seconds. Call without holding the engine's lock."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(max(0.0, timeout))
        return not thread.is_alive()

    def _run(self) -> None:
        logger.info("step thread started", extra={"step_thread": self.name})
        while True:
            with self._cond:
                while not self._stop and not self._has_work():
                    self._cond.wait(self._idle_wait_s)
                if self._stop:
                    break
            try:
                ran = self._step()
            except WorkerLostError as lost:
                self.lost = lost
                logger.exception(
                    "the worker is lost; aborting its requests and stopping",
                    extra={"step_thread": self.name},
                )
                self._on_error()
                break
            except Exception:
                logger.exception(
                    "step raised; aborting its requests", extra={"step_thread": self.name}
                )
                self._on_error()
                ran = True
            if not ran:
                with self._cond:  # nothing schedulable: wait for a change instead of spinning
                    self._cond.wait(self._idle_wait_s)
        logger.info("step thread stopped", extra={"step_thread": self.name})
