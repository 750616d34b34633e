"""`loom router`: the OpenAI proxy and endpoint picker in front of a fleet's workers.

Registers the flags without importing the router (it loads aiohttp, ZMQ and a tokenizer).
"""

from __future__ import annotations

import argparse
from typing import Any

from loom_router.shell.config import add_arguments


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "router",
        help="run the router: loom router --config ROUTER.json --port P --admin-port A",
        description="Serve the OpenAI API in front of the workers listed in ROUTER.json (and "
        "registered later over the admin API), routing by prefix cache and load.",
    )
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loom_router.shell.main import run as run_router

    return run_router(args)
