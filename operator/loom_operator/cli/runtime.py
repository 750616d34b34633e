"""`loom runtime …`, `loom vllm-sidecar …` and `loom model …`: forwarded to
`python -m loom_runtime` in a new process.

The operator never imports the heavy runtime; a worker is its own process anyway.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

FORWARDED = ("runtime", "vllm-sidecar", "model")


def add_parser(sub: Any) -> None:
    for name, text in (
        ("runtime", "start a worker: loom runtime --card CARD.yaml --role ROLE --port P"),
        ("vllm-sidecar", "Loom's control API in front of vLLM (backend: vllm pods)"),
        ("model", "model tools: loom model init-tiny DIR"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.set_defaults(run=lambda _args: 2)


def forward(argv: Sequence[str]) -> int:
    """Replace this process with the runtime's own CLI (never returns on success)."""
    os.execv(sys.executable, [sys.executable, "-m", "loom_runtime", *argv])
    return 2  # unreachable: execv raises OSError on failure


def run(_args: argparse.Namespace) -> int:
    return 2
