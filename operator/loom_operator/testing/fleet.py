"""A local fleet under test: `loom up` in a child process on free ports of 127.0.0.1, waited on
through its status file (never a fixed sleep), and always stopped with everything it started.

Owns starting, killing and restarting the controller, and leaving no process behind; never
judges results. Also starts single reference workers (`loom runtime`) for expected outputs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loom_operator.local.ports import free_ports
from loom_operator.local.process import pid_alive
from loom_operator.local.snapshot import FleetStatus, WorkerRow, load_status
from loom_operator.local.state import StatePaths, load_processes, write_atomic

POLL_S = 0.1
STOP_TIMEOUT_S = 120.0


class FleetTimeout(AssertionError):
    """A wait ran out; the message says what was awaited and the last status seen."""


def wait_for(
    check: Callable[[], bool], timeout: float, what: str, interval: float = POLL_S
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise FleetTimeout(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@dataclass
class FleetProcess:
    """`loom up CARD --state-dir DIR --port PORT`, run as a child process."""

    card: Path
    state: StatePaths
    port: int
    env: Mapping[str, str]
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    starts: int = 0

    def __post_init__(self) -> None:
        self.log = self.state.root.parent / f"{self.state.root.name}-up.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start the controller (again, after a kill: it adopts what still runs)."""
        argv = [
            sys.executable, "-m", "loom_operator.cli", "up", str(self.card),
            "--state-dir", str(self.state.root), "--port", str(self.port), *self.extra,
        ]  # fmt: skip
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=dict(self.env)
            )
        self.starts += 1

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def status(self) -> FleetStatus | None:
        try:
            return load_status(self.state)
        except Exception:  # mid-write by another process: read again next poll
            return None

    def wait(self, check: Callable[[FleetStatus], bool], timeout: float, what: str) -> FleetStatus:
        """Poll the status file, as written by the running controller, until `check` holds;
        FleetTimeout with the last status."""
        seen: list[FleetStatus | None] = [None]

        def ok() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise FleetTimeout(f"`loom up` exited ({self.proc.returncode}):\n{self.output()}")
            s = self.status()
            seen[0] = s
            mine = s is not None and self.proc is not None and s.controller_pid == self.proc.pid
            return s is not None and mine and not s.stopped and check(s)

        try:
            wait_for(ok, timeout, what)
        except FleetTimeout as exc:
            raise FleetTimeout(f"{exc}\nlast status: {seen[0]}\n{self.output()[-3000:]}") from None
        s = seen[0]
        assert s is not None
        return s

    def wait_settled(self, timeout: float, version: str | None = None) -> FleetStatus:
        """Every desired worker ready, routed and on `version`, nothing in progress."""

        def settled(s: FleetStatus) -> bool:
            ready, prog = s.condition("Ready"), s.condition("Progressing")
            on = version is None or all(w.version == version for w in s.workers)
            return (
                ready is not None
                and ready.reason == "AllReplicasReady"
                and prog is not None
                and prog.status == "False"
                and on
                and s.target_version == (version or s.target_version)
                and all(w.ready and w.routed for w in s.workers)
            )

        return self.wait(settled, timeout, f"the fleet to settle on {version or 'its target'}")

    def worker(self, name: str) -> WorkerRow:
        s = self.status()
        row = None if s is None else next((w for w in s.workers if w.name == name), None)
        if row is None:
            raise AssertionError(f"no worker {name} in {s}")
        return row

    def edit_card(self, text: str) -> None:
        """Replace the card file (an edit the controller picks up)."""
        write_atomic(self.card, text)

    def kill_controller(self) -> None:
        """SIGKILL `loom up` (its workers and router keep running)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def interrupt(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Ctrl-C: the controller drains and stops everything; its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def leftovers(self) -> list[int]:
        """Pids of fleet processes still running."""
        table = load_processes(self.state)
        pids = [(w.pid, w.ident) for w in table.workers]
        if table.router is not None:
            pids.append((table.router.pid, table.router.ident))
        return [pid for pid, ident in pids if pid_alive(pid, ident)]

    def cleanup(self) -> None:
        """Stop the controller (SIGINT, then SIGKILL) and kill anything it left running."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.interrupt(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        with contextlib.suppress(Exception):
            for pid in self.leftovers():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def run_fleet(
    card: Path,
    state_dir: Path,
    env: Mapping[str, str],
    extra: tuple[str, ...] = (),
    ready_timeout: float = 180.0,
) -> Iterator[FleetProcess]:
    """`loom up` on a free port, settled (all workers ready and routed) and its endpoint
    printed; always cleaned up."""
    fleet = FleetProcess(card, StatePaths(state_dir), free_ports(1)[0], env, extra)
    try:
        fleet.start()
        fleet.wait_settled(ready_timeout)
        wait_for(
            lambda: "OpenAI endpoint:" in fleet.output(), 60, "`loom up` to print the endpoint"
        )
        yield fleet
    finally:
        fleet.cleanup()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextlib.contextmanager
def reference_worker(
    card: Path, dtype: str, log: Path, env: Mapping[str, str], timeout: float = 120.0
) -> Iterator[str]:
    """A plain aggregated `loom runtime` worker of `card` (its base URL); always stopped."""
    port = free_ports(1)[0]
    argv = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card),
        "--role", "aggregated", "--port", str(port), "--dtype", dtype,
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise FleetTimeout(f"reference worker exited:\n{log.read_text()[-3000:]}")
            return _ready(url)

        wait_for(up, timeout, f"the reference worker {card}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
