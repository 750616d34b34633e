"""`loom down [CARD.yaml | --state-dir DIR]`: stop a local fleet. With a controller running it
asks that controller to drain and stop everything (as Ctrl-C does); without one it stops the
processes the fleet left behind.

Signals processes and waits (bounded); the drain itself is the controller's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import time
from typing import Any

from rich.console import Console

from loom_operator.cli.status import add_target, target
from loom_operator.local.cards import LocalCardError
from loom_operator.local.process import LocalProcess
from loom_operator.local.state import (
    StateError,
    StatePaths,
    controller_running,
    load_controller,
    load_processes,
    save_processes,
)

POLL_S = 0.1
STOP_GRACE_S = 10.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("down", help="drain and stop a local fleet started by `loom up`")
    add_target(p)
    p.add_argument(
        "--timeout", type=float, default=180.0, help="longest wait for the drain (s, default 180)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    try:
        paths = target(args)
        if controller_running(paths):
            return _ask_controller(console, paths, args.timeout)
        return _stop_leftovers(console, paths)
    except (StateError, LocalCardError, OSError) as exc:
        console.print(f"[bold red]loom down:[/] {exc}")
        return 1


def _ask_controller(console: Console, paths: StatePaths, timeout: float) -> int:
    info = load_controller(paths)
    if info is None:
        console.print(f"[bold red]loom down:[/] a controller holds {paths.root} but left no pid")
        return 1
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    with console.status(f"draining and stopping {paths.root.name} (controller pid {info.pid})…"):
        while controller_running(paths):
            if time.monotonic() > deadline:
                console.print(f"[bold red]loom down:[/] still stopping after {timeout:g}s")
                return 1
            time.sleep(POLL_S)
    console.print(f"stopped {paths.root.name}")
    return 0


def _stop_leftovers(console: Console, paths: StatePaths) -> int:
    table = load_processes(paths)
    procs = [LocalProcess.adopt(w.name, w.pid, w.ident) for w in table.workers]
    if table.router is not None:
        procs.append(LocalProcess.adopt("router", table.router.pid, table.router.ident))
    live = [p for p in procs if p is not None]
    with console.status(f"stopping {len(live)} process(es) of {paths.root.name}…"):
        for p in live:
            p.signal(signal.SIGTERM)
        for p in live:
            p.stop_blocking(STOP_GRACE_S)
    save_processes(paths, dataclasses.replace(table, workers=(), router=None))
    console.print(
        f"no controller was running; stopped {len(live)} process(es) of {paths.root.name}"
    )
    return 0
