"""The RL example's rollout fleet: a `loom up` fleet it starts (and stops), or one already
running, and the three things a trainer needs from it: the OpenAI endpoint, the weight-push URL
and the admin token.

Owns starting and stopping the fleet it started; never stops or edits a fleet it connected to,
and reads only the files `loom up` documents in its state directory (docs/local.md).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

READY_LINE = "Trainers push weights to"
"""What `loom up` prints once every worker is ready (after the OpenAI endpoint)."""
POLL_S = 0.2


@dataclass(frozen=True)
class Fleet:
    """Where a trainer reaches a running `loom up` fleet."""

    endpoint: str
    """The router's OpenAI base URL (http://127.0.0.1:PORT/v1)."""
    weights_url: str
    """The controller's weight-push API, for `loom_trainer.WeightSync.connect`."""
    token: str
    """The fleet's admin token (secrets.json)."""


def connect(state_dir: Path) -> Fleet:
    """The fleet whose `loom up` runs with `--state-dir state_dir`."""
    try:
        controller = json.loads((state_dir / "controller.json").read_text())
        secrets = json.loads((state_dir / "secrets.json").read_text())
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"{state_dir}: no running `loom up` here ({exc.filename} is missing); start one with "
            f"`loom up examples/rl/card.yaml --state-dir {state_dir}`"
        ) from None
    if not controller.get("weights_url"):
        raise RuntimeError(f"{state_dir}/controller.json has no weights_url: a `loom up` too old")
    return Fleet(controller["endpoint"], controller["weights_url"], secrets["admin_token"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def started(card: Path, state_dir: Path, timeout_s: float = 300.0) -> Iterator[Fleet]:
    """`loom up card` on a free port, waited on until every worker is ready; always stopped
    (Ctrl-C, then a kill) when the block ends. Its output goes to `state_dir`.log."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    log = state_dir.with_suffix(".log")
    argv = [sys.executable, "-m", "loom_operator.cli", "up", str(card),
            "--state-dir", str(state_dir), "--port", str(free_port())]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, log, timeout_s)
        yield connect(state_dir)
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while READY_LINE not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"`loom up` exited ({proc.returncode}) before it was ready:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"`loom up` was not ready after {timeout_s:g}s (see {log})")
        time.sleep(POLL_S)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)  # `loom up` drains and stops every process it started
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
