"""StepThread: steps while there is work, sleeps when there is none, survives a raising step
through the engine's error path, and stops within its timeout."""

from __future__ import annotations

import threading
import time

from loom_runtime.engine.step_thread import StepThread


def wait_for(check: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_it_runs_the_work_given_then_idles_and_stops() -> None:
    cond = threading.Condition()
    work = [3]
    steps: list[int] = []

    def step() -> bool:
        with cond:
            if not work[0]:
                return False
            work[0] -= 1
        steps.append(1)
        return True

    thread = StepThread("t", cond, step, lambda: work[0] > 0, lambda: None, 0.01)
    with cond:
        thread.start()
    assert wait_for(lambda: len(steps) == 3)
    time.sleep(0.1)
    assert len(steps) == 3  # no work: no steps
    with cond:
        work[0] = 2
        cond.notify_all()
    assert wait_for(lambda: len(steps) == 5)
    assert thread.alive and thread.stop(5.0) and not thread.alive


def test_a_raising_step_takes_the_error_path_and_the_thread_goes_on() -> None:
    cond = threading.Condition()
    calls = {"step": 0, "error": 0}

    def step() -> bool:
        calls["step"] += 1
        if calls["step"] == 1:
            raise RuntimeError("a broken forward")
        return False

    def on_error() -> None:
        calls["error"] += 1

    thread = StepThread("t", cond, step, lambda: calls["step"] < 3, on_error, 0.01)
    with cond:
        thread.start()
    assert wait_for(lambda: calls["step"] >= 3)
    assert calls["error"] == 1 and thread.alive
    assert thread.stop(5.0)


def test_stop_before_start_is_a_no_op() -> None:
    thread = StepThread("t", threading.Condition(), lambda: False, lambda: False, lambda: None, 1)
    assert thread.stop(0.1) and not thread.alive
