"""The `loom` command: one subcommand per module in this package.

The one place in Loom that prints. Runtime subcommands run in their own process (see runtime.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from loom_operator.cli import (
    apply,
    crds,
    dashboards,
    down,
    media,
    operate,
    plan,
    profile,
    router,
    runtime,
    status,
    up,
    validate,
)

# Each command module offers add_parser(subparsers) and run(args) -> exit code.
COMMANDS: tuple[ModuleType, ...] = (
    validate, plan, profile, crds, dashboards, runtime, up, status, apply, down, router, operate,
    media,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loom", description="Serve composite models with Loom.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in runtime.FORWARDED:
        return runtime.forward(args_list)
    args = build_parser().parse_args(args_list)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
