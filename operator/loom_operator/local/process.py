"""One local process of a fleet (a worker or the router): start it with its own log file, tell
whether it still runs, stop it gracefully (SIGTERM, a bounded wait, then SIGKILL).

Owns process lifecycles and identity (a pid plus its start time, so a recycled pid is never
mistaken for the process); never decides when to start or stop (the fleet controller does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the process to be gone
POLL_S = 0.05


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 is [0]); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def process_ident(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None without /proc or if gone)."""
    fields = _stat_fields(pid)
    return None if fields is None or len(fields) < 20 else fields[19]


def pid_alive(pid: int, ident: str | None) -> bool:
    """True when `pid` runs and, where `ident` is known, is the process that had it then."""
    if Path("/proc").is_dir() and Path("/proc/self/stat").exists():
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return ident is None or (len(fields) >= 20 and fields[19] == ident)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalProcess:
    """A process this controller started (a child) or adopted from an earlier controller."""

    def __init__(
        self, name: str, pid: int, ident: str | None, popen: subprocess.Popen[bytes] | None = None
    ) -> None:
        self.name = name
        self.pid = pid
        self.ident = ident
        self._popen = popen

    @classmethod
    def spawn(
        cls, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path
    ) -> LocalProcess:
        """Start `argv` in its own session (a terminal's Ctrl-C reaches only the controller),
        appending its output to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"=== {stamp} loom starts {name}: {' '.join(argv)}\n".encode())
            out.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        logger.info("started", extra={"proc": name, "pid": popen.pid, "log": str(log)})
        return cls(name, popen.pid, process_ident(popen.pid), popen)

    @classmethod
    def adopt(cls, name: str, pid: int, ident: str | None) -> LocalProcess | None:
        """The still-running process `pid` of an earlier controller, or None if it is gone."""
        if not pid_alive(pid, ident):
            return None
        return cls(name, pid, ident)

    @property
    def adopted(self) -> bool:
        return self._popen is None

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid, self.ident)

    def exit_code(self) -> int | None:
        """The exit status of a child that ended (negative: killed by that signal)."""
        return None if self._popen is None else self._popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, without waiting (for a process that failed and is replaced at once)."""
        self.signal(signal.SIGKILL)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, wait up to `grace_s`, then SIGKILL and wait until it is gone."""
        self.signal(signal.SIGTERM)
        if await self._wait(grace_s):
            return
        logger.warning("did not stop in time; killing", extra={"proc": self.name})
        self.signal(signal.SIGKILL)
        await self._wait(KILL_WAIT_S)

    async def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def stop_blocking(self, grace_s: float) -> None:
        """`stop` for callers without an event loop (`loom down` when no controller runs)."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self.alive():
            self.signal(signal.SIGKILL)
            deadline = time.monotonic() + KILL_WAIT_S
            while self.alive() and time.monotonic() < deadline:
                time.sleep(POLL_S)
