"""Local processes: started in their own session with a log, stopped gracefully or killed after
the grace period, adopted by pid only while it is still the same process."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from loom_operator.local.process import LocalProcess, pid_alive, process_ident

IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(600)"
)


def test_spawned_process_logs_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    script = "print('hello', flush=True); import time; time.sleep(600)"
    p = LocalProcess.spawn("sleeper", [sys.executable, "-c", script], {}, log)
    try:
        assert p.alive() and p.ident == process_ident(p.pid)
        deadline = time.monotonic() + 30
        while "hello" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "loom starts sleeper" in log.read_text() and "hello" in log.read_text()
        asyncio.run(p.stop(grace_s=10))
        assert not p.alive()
        assert p.exit_code() == -signal.SIGTERM
    finally:
        p.kill()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    p = LocalProcess.spawn("stubborn", [sys.executable, "-c", IGNORE_TERM], {}, tmp_path / "s.log")
    try:
        deadline = time.monotonic() + 30
        while "\nup\n" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        asyncio.run(p.stop(grace_s=0.5))
        assert not p.alive()
        assert p.exit_code() == -signal.SIGKILL
        assert time.monotonic() - start < 10
    finally:
        p.kill()


def test_adoption_checks_the_process_is_still_the_same(tmp_path: Path) -> None:
    p = LocalProcess.spawn("x", [sys.executable, "-c", "import time; time.sleep(600)"], {},
                           tmp_path / "x.log")  # fmt: skip
    try:
        adopted = LocalProcess.adopt("x", p.pid, p.ident)
        assert adopted is not None and adopted.alive() and adopted.adopted
        assert LocalProcess.adopt("x", p.pid, "1") is None  # a recycled pid is not our process
        p.kill()
        deadline = time.monotonic() + 10
        while p.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not adopted.alive()
        assert not pid_alive(p.pid, p.ident)
    finally:
        p.kill()
