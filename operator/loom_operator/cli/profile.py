"""`loom profile CARD.yaml`: measure what one worker of the card serves on this machine and print
the card's `autoscaling.capacity` section, with the measurements behind each figure.

Prints: progress lines and the sweep's table on stderr, the section alone on stdout (so it pipes
into a file as valid YAML). The measuring lives in loom_operator.profile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from loom_operator.fleet.commands import diffusion_steps
from loom_operator.local.cards import FleetCards, LocalCardError, parse_fleet_cards
from loom_operator.profile.decide import FULL, QUICK, Profile, profile_json, snippet, within_target
from loom_operator.profile.load import LoadError
from loom_operator.profile.session import Request, measure
from loom_operator.profile.worker import WorkerStartError

DEFAULT_START_TIMEOUT_S = 600.0


class ProfileArgsError(ValueError):
    """The card or the flags cannot be profiled; the message says why and what to do."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="measure one worker of a card and print its autoscaling.capacity section",
        description="Start one worker of the card's model on this machine, drive it with real "
        "requests (saturated long prompts; streaming decodes at 1, 2, 4, … up to maxNumSeqs "
        "sequences) and print the autoscaling.capacity section the measurements support.",
    )
    p.add_argument("card", type=Path, metavar="CARD.yaml", help="ModelCard + DeploymentCard")
    p.add_argument(
        "--itl-ms",
        type=float,
        metavar="MS",
        help="ITL p90 target for decode (default: the card's autoscaling.targets.itlP90Ms)",
    )
    p.add_argument("--quick", action="store_true", help="tiny durations: a first look, tests")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the raw measurements")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT_S,
        metavar="S",
        help=f"seconds a worker may take to be ready (default {DEFAULT_START_TIMEOUT_S:g})",
    )
    p.set_defaults(run=run)


def itl_target(cards: FleetCards, itl_ms: float | None) -> float:
    """--itl-ms, else the card's ITL target; ProfileArgsError when neither is set."""
    if itl_ms is not None:
        if itl_ms <= 0:
            raise ProfileArgsError(f"--itl-ms {itl_ms:g}: must be positive")
        return itl_ms
    scaling = cards.deployment.spec.autoscaling
    target = None if scaling is None else scaling.targets.itl_p90_ms
    if target is None:
        raise ProfileArgsError(
            f"{cards.name}: no ITL target to size decode by: set "
            "spec.autoscaling.targets.itlP90Ms in the card or pass --itl-ms"
        )
    return target


def _checked_cards(args: argparse.Namespace) -> tuple[FleetCards, float]:
    cards = parse_fleet_cards(args.card)
    if diffusion_steps(cards.model) is not None:
        raise ProfileArgsError(
            f"{cards.name}: {cards.model.name} is a diffusion model; the capacity section "
            "sizes text models (prompt and generated tokens)"
        )
    return cards, itl_target(cards, args.itl_ms)


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, highlight=False)
    try:
        cards, target = _checked_cards(args)
    except (LocalCardError, ProfileArgsError, OSError) as exc:
        err.print(f"loom profile: {exc}", markup=False, soft_wrap=True)
        return 2
    logs = Path(tempfile.mkdtemp(prefix=f"loom-profile-{cards.name}-"))
    req = Request(cards, QUICK if args.quick else FULL, target, logs, dict(os.environ),
                  args.start_timeout)  # fmt: skip
    try:
        profile = asyncio.run(measure(req, lambda line: _progress(err, line)))
    except (WorkerStartError, LoadError, aiohttp.ClientError, TimeoutError) as exc:
        what = str(exc) or type(exc).__name__  # a worker that died mid-run: its log says why
        err.print(f"loom profile: {what} (logs kept in {logs})", markup=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:  # the worker was stopped on the way out
        err.print(f"loom profile: interrupted; nothing measured is printed (logs in {logs})")
        return 130
    shutil.rmtree(logs, ignore_errors=True)
    err.print(sweep_table(profile))
    if within_target(profile.decode, profile.itl_target_ms) is None:
        err.print(
            f"loom profile: not even one sequence kept the ITL p90 within "
            f"{profile.itl_target_ms:g} ms: the decode figures stay unset",
            style="yellow",
            soft_wrap=True,
        )
    sys.stdout.write(snippet(profile))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(profile_json(profile), indent=2) + "\n")
        except OSError as exc:
            err.print(f"loom profile: --json {args.json}: {exc}", markup=False, soft_wrap=True)
            return 1
    return 0


def _progress(console: Console, line: str) -> None:
    console.print(f"loom profile: {line}", markup=False, soft_wrap=True)


def sweep_table(profile: Profile) -> Table:
    """The decode sweep, the chosen level marked, and the prefill rounds' rates under it."""
    best = within_target(profile.decode, profile.itl_target_ms)
    table = Table(title=f"Decode sweep ({profile.decode_role} engine), ITL target "
                        f"{profile.itl_target_ms:g} ms")  # fmt: skip
    for col in ("sequences", "ITL p90 ms", "tokens/s", "streams", ""):
        table.add_column(col, justify="right")
    for lvl in profile.decode:
        mark = (
            "capacity"
            if lvl is best
            else ("over" if lvl.itl_p90_ms > profile.itl_target_ms else "")
        )
        table.add_row(f"{lvl.concurrency}", f"{lvl.itl_p90_ms:.1f}",
                      f"{lvl.tokens_per_second:,.0f}", f"{lvl.requests}", mark)  # fmt: skip
    rates = ", ".join(f"{r.tokens_per_second:,.0f}" for r in profile.prefill)
    table.caption = f"prefill ({profile.prefill_role} engine), prompt tokens/s per round: {rates}"
    return table
