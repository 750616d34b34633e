"""`loom up CARD.yaml`: run a deployment's fleet on this machine in the foreground — the router
and every role worker as processes on 127.0.0.1 — until Ctrl-C, which drains and stops them.

Prints progress and events; the fleet itself lives in loom_operator.local.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loom_operator.fleet.commands import diffusion_steps
from loom_operator.fleet.conditions import ALL_READY, SCALED_TO_ZERO
from loom_operator.local.cards import LocalCardError, parse_fleet_cards
from loom_operator.local.checkpoints import CheckpointError
from loom_operator.local.events import FleetEvent
from loom_operator.local.fleet import LocalFleet, UpSettings
from loom_operator.local.launch import ROUTER_MODULE, LaunchOptions
from loom_operator.local.ports import PortError
from loom_operator.local.snapshot import FleetStatus
from loom_operator.local.state import DEFAULT_ROOT, StateError, StatePaths
from loom_runtime.card.workflow import Workflow

READY_POLL_S = 0.2
STYLES = {"info": "", "warning": "yellow", "error": "bold red"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="run a DeploymentCard's fleet on this machine (router + workers) until Ctrl-C",
        description="Start the router and every role worker of the card as local processes, "
        "print the OpenAI endpoint, restart crashed workers, follow edits of the card file "
        "(replicas, weightsVersion) and drain everything on Ctrl-C.",
    )
    p.add_argument("card", type=Path, metavar="CARD.yaml", help="ModelCard + DeploymentCard")
    p.add_argument("--port", type=int, default=8000, help="the endpoint's port (default 8000)")
    p.add_argument("--state-dir", type=Path, help=f"default {DEFAULT_ROOT}/<deployment>")
    p.add_argument("--kv-connector", choices=("nixl", "tcp"), help="P/D KV transfer")
    p.add_argument(
        "--ready-timeout", type=float, default=600.0, help="warn if not ready by then (s)"
    )
    p.add_argument(
        "--drain-timeout", type=float, help="Ctrl-C: wait for requests (default: the card's)"
    )
    p.add_argument("--router-module", default=ROUTER_MODULE, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # events show up at once, piped or not
    console = Console(highlight=False)
    try:
        cards = parse_fleet_cards(args.card)
    except (LocalCardError, OSError) as exc:
        console.print(f"[bold red]loom up:[/] {exc}")
        return 2
    paths = StatePaths(args.state_dir) if args.state_dir else StatePaths.for_deployment(cards.name)
    fresh = not paths.root.exists()  # made by this run: a failed start leaves nothing behind
    _log_to_file(paths)
    settings = UpSettings(
        port=args.port,
        shutdown_drain_s=args.drain_timeout,
        options=LaunchOptions(kv_connector=args.kv_connector, router_module=args.router_module),
    )
    ui = _Console(console, _Commands(loom_command(), args.card, paths.root))
    fleet = LocalFleet(paths, cards, args.card, settings, ui.event)
    try:
        return asyncio.run(_up(fleet, ui, args.ready_timeout))
    except (StateError, PortError, CheckpointError) as exc:
        console.print(f"[bold red]loom up:[/] {exc}")
        return 1
    finally:
        if fresh and not ui.started:
            _remove_state(console, paths)


def loom_command(argv0: str | None = None) -> str:
    """How to run `loom` from this shell: `loom` when that is on PATH and the same program,
    else the path that works (`.venv/bin/loom`), else `python -m loom_operator.cli`."""
    exe = Path(argv0 if argv0 is not None else sys.argv[0])
    if exe.name != "loom":
        return f"{sys.executable} -m loom_operator.cli"
    found = shutil.which("loom")
    if found is not None and Path(found).resolve() == exe.resolve():
        return "loom"
    try:
        return str(exe.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(exe.resolve())


def _remove_state(console: Console, paths: StatePaths) -> None:
    """A start that failed leaves no state folder (so a plain `loom status` is not confused
    by it); its logs move to a temporary folder that is named."""
    root_logger = logging.getLogger("loom_operator")
    for handler in list(root_logger.handlers):  # close the controller log first
        root_logger.removeHandler(handler)
        handler.close()
    kept = None
    if paths.logs.is_dir() and any(paths.logs.iterdir()):
        kept = Path(tempfile.mkdtemp(prefix=f"loom-up-{paths.root.name}-"))
        shutil.move(str(paths.logs), kept / "logs")
    shutil.rmtree(paths.root, ignore_errors=True)
    if kept is not None:
        msg = f"loom up: removed {paths.root}; its logs are in {kept / 'logs'}"
        console.print(msg, soft_wrap=True, markup=False)


def _log_to_file(paths: StatePaths) -> None:
    """The controller's own log goes to the state directory; the console shows events."""
    paths.logs.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(paths.log("controller"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("loom_operator")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


@dataclass(frozen=True)
class _Commands:
    """What the banner tells a user to run next, with the path to `loom` that works."""

    loom: str
    card: Path
    state: Path

    def lines(self) -> tuple[str, ...]:
        at = f"--state-dir {self.state}"
        return (
            f"  {self.loom} status {at}            (workers, versions, load, conditions)",
            f"  {self.loom} apply {self.card} {at}  (after editing the card; or just save it)",
            f"  {self.loom} down {at}              (drain and stop; or Ctrl-C here)",
        )


class _Console:
    """Renders fleet events: into the progress display while starting, as lines afterwards."""

    def __init__(self, console: Console, commands: _Commands) -> None:
        self.console = console
        self.commands = commands
        self.progress: Progress | None = None
        self.started = False  # the fleet's start succeeded: its state folder is kept

    def event(self, event: FleetEvent) -> None:
        if event.kind == "condition" and event.level == "info" and self.progress is not None:
            return  # while starting, the progress display says it
        style = STYLES[event.level] or "default"
        console = self.progress.console if self.progress is not None else self.console
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] ", end="")
        console.print(event.message, style=style, markup=False, soft_wrap=True)


def _signals(stop: asyncio.Event, force: asyncio.Event) -> None:
    event_loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        event_loop.add_signal_handler(sig, on_signal)


async def _up(fleet: LocalFleet, ui: _Console, ready_timeout: float) -> int:
    stop, force = asyncio.Event(), asyncio.Event()
    _signals(stop, force)
    console = ui.console
    console.print(f"Loom: bringing up [bold]{fleet.cards.name}[/] (state in {fleet.paths.root})")
    with console.status("starting the router…"):
        starting = asyncio.create_task(fleet.start())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not starting.done():  # Ctrl-C while starting: start() undoes what it did
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            console.print("Loom: stopped before the fleet started.")
            return 0
        starting.result()  # raises what made the start fail
    ui.started = True
    loop_task = asyncio.create_task(fleet.run(stop), name="fleet")
    try:
        ready = await _wait_ready(fleet, ui, stop, ready_timeout)
        if ready:
            _print_endpoint(console, fleet, ui.commands)
        await stop.wait()
    finally:
        stop.set()
        await loop_task
        console.print("Loom: draining and stopping (Ctrl-C again to stop at once)…")
        drain = asyncio.create_task(fleet.shutdown(drain=True))
        forced = asyncio.create_task(force.wait())
        done, _ = await asyncio.wait({drain, forced}, return_when=asyncio.FIRST_COMPLETED)
        if forced in done and not drain.done():
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
            await fleet.shutdown(drain=False)
        forced.cancel()
    console.print("Loom: stopped.")
    return 0


def _rows(status: FleetStatus | None) -> dict[str, str]:
    if status is None:
        return {}
    return {w.name: f"{w.role:<10} {w.state:<12} {w.version or '-'}" for w in status.workers}


async def _wait_ready(fleet: LocalFleet, ui: _Console, stop: asyncio.Event, timeout: float) -> bool:
    """Progress per worker until the fleet is Ready; False if stopped or not ready in time."""
    deadline = time.monotonic() + timeout
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=ui.console, transient=False) as progress:
        ui.progress = progress
        tasks = {s.name: progress.add_task(s.name, total=1) for s in fleet.cards.desired.slots}
        try:
            while not stop.is_set():
                status = fleet.status
                rows = _rows(status)
                for name, task in tasks.items():
                    row = (
                        next((w for w in status.workers if w.name == name), None)
                        if status
                        else None
                    )
                    done = row is not None and row.ready and row.routed
                    progress.update(task, description=f"{name:<24} {rows.get(name, 'starting')}",
                                    completed=1 if done else 0)  # fmt: skip
                ready = status.condition("Ready") if status else None
                if ready is not None and ready.reason == ALL_READY:
                    return True
                if ready is not None and ready.reason == SCALED_TO_ZERO and fleet.autoscaler:
                    return True  # the endpoint serves: a request starts a worker
                if time.monotonic() > deadline:
                    msg = ready.message if ready else "no status yet"
                    ui.console.print(
                        f"[yellow]not every worker is ready after {timeout:g}s: {msg}[/]"
                    )
                    return ready is not None and ready.status == "True"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), READY_POLL_S)
        finally:
            ui.progress = None
    return False


def try_lines(url: str, model: str, diffusion: bool) -> tuple[str, ...]:
    """What to run first against a fleet that is up (pure)."""
    if not diffusion:
        body = f'{{"model": "{model}", "prompt": "Once upon a time", "max_tokens": 16}}'
        return (f"  curl {url}/completions -H 'Content-Type: application/json' -d '{body}'",)
    return (
        f"  loom video 'a red fox in the snow' --url {url} --size 64x64 --frames 5 --out fox.mp4",
        f"  loom image 'a lighthouse at dusk' --url {url} --size 64x64 --out lighthouse.png",
    )


def workflow_lines(url: str, workflows: Sequence[Workflow]) -> tuple[str, ...]:
    """How to run each workflow the fleet serves (pure): its route's command, the earlier
    stages sized small (a tiny card's step budget)."""
    lines = []
    for flow in workflows:
        stages = " ".join(f"--stage {s.name}.size=32x32" for s in flow.stages[:-1])
        if flow.route == "videos":
            lines.append(f"  loom video 'a lighthouse at dusk' --url {url} --model {flow.name} "
                         f"--size 64x64 --frames 5 {stages} --out {flow.name}.mp4")  # fmt: skip
        else:
            lines.append(f"  loom image 'a lighthouse at dusk' --url {url} --model {flow.name} "
                         f"--size 32x32 {stages} --out {flow.name}.png")  # fmt: skip
    return tuple(lines)


def _print_endpoint(console: Console, fleet: LocalFleet, commands: _Commands) -> None:
    url = fleet.endpoint
    model = fleet.cards.model.name
    console.print(f"\n[bold green]Ready.[/] OpenAI endpoint: [bold]{url}[/]  (model {model!r})")
    flows = fleet.cards.deployment.spec.workflows
    if flows:
        console.print(f"Workflows (docs/composite.md): {', '.join(f.name for f in flows)}")
    lines = (*try_lines(url, model, diffusion_steps(fleet.cards.model) is not None),
             *workflow_lines(url, flows), *commands.lines(), "")  # fmt: skip
    for line in lines:
        console.print(line, soft_wrap=True, markup=False)
    secrets = fleet.paths.secrets
    console.print(
        f"Trainers push weights to {fleet.weights_url} with the admin_token in {secrets} "
        "(docs/rl.md)",
        soft_wrap=True,
        markup=False,
    )
    sys.stdout.flush()
