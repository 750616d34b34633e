"""One container as a local process: started in its own session and mount namespace.

Owns the process and its log file; never decides when to restart (the pod runner does).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.node_agent.volumes import Mount

# Runs inside `unshare -m`: make each mount point, bind the volume onto it, then exec.
_MOUNT_SCRIPT = """set -e
{binds}
exec "$@"
"""


def mount_script(mounts: Sequence[Mount]) -> str:
    lines = []
    for m in mounts:
        target = shlex.quote(m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"mkdir -p $(dirname {target}); [ -e {target} ] || : > {target}")
        lines.append(f"mount --bind {shlex.quote(str(m.source))} {target}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    return _MOUNT_SCRIPT.format(binds="\n".join(lines))


class ContainerProcess:
    """A started container. `exit_code()` is None while it runs."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        mounts: Sequence[Mount],
        log: Path,
    ) -> None:
        full = list(argv)
        if mounts:
            script = mount_script(mounts)
            full = ["unshare", "-m", "--propagation", "private", "--", "/bin/sh", "-c", script]
            full += ["loom-pod", *argv]
        cwd.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                full,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self.started_at = time.time()
        self.finished_at: float | None = None

    def exit_code(self) -> int | None:
        code = self._proc.poll()
        if code is not None and self.finished_at is None:
            self.finished_at = time.time()
        return code

    def wait(self, timeout_s: float) -> int | None:
        """The exit code once it exits within `timeout_s`, else None (still running)."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def stop(self, grace_s: float) -> int:
        """SIGTERM, up to `grace_s` for it to exit, then SIGKILL; returns the exit code."""
        if self.exit_code() is None:
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=max(grace_s, 0.0))
        # The whole process group goes: a container's children never outlive it.
        self.signal(signal.SIGKILL)
        code = self._proc.wait()
        self.exit_code()
        return code
