"""Long-lived child processes of the e2e harness: start detached with a log, stop in order.

Owns pid bookkeeping for the control plane's processes; never kills a process it did not
start (pids are checked against their recorded command line before any signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Child:
    """One started process: its name (for logs), pid and the argv it was started with."""

    name: str
    pid: int
    argv0: str

    def alive(self) -> bool:
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return bool(cmdline) and stat[0] != "Z" and cmdline.split(b"\0")[0].decode() == self.argv0


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Child:
    """Starts `argv` in its own session (so `make e2e-cluster` can return), logging to a file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    _wait_for_exec(proc)
    return Child(name, proc.pid, argv[0])


def _wait_for_exec(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Returns once the child's new argv is visible in /proc (or it has exited). Popen returns as
    soon as the exec has replaced the child's memory, before the loader publishes its argv: in
    that window /proc/PID/cmdline is empty and `Child.alive` would read a live child as gone."""
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if cmdline.read_bytes():
                return
        time.sleep(0.001)


def stop(child: Child, timeout: float = 15.0) -> None:
    """SIGTERM the child's process group, wait up to `timeout`, then SIGKILL it."""
    if not child.alive():
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(child.pid)
        if not child.alive():
            return
        time.sleep(0.05)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(100):
        _reap(child.pid)
        if not child.alive():
            return
        time.sleep(0.05)


def _reap(pid: int) -> None:
    """Reaps `pid` if it is our own exited child (a fixture's); other processes are not ours."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_marked(variable: str, value: str) -> int:
    """SIGKILLs every process whose environment has `variable=value`: pods of a killed agent."""
    needle = f"{variable}={value}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def pids_with_argument(argument: str, program: str | None = None) -> list[int]:
    """Processes with `argument` among their argv (and, if given, `program`'s basename as
    argv[0]): the shims of one containerd socket, or a node's kubelet."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argument in argv and (program is None or Path(argv[0]).name == program):
            found.append(int(proc.name))
    return found
