"""Worker-side commands: `runtime` (serve one role), `vllm-sidecar` (Loom's control API in front
of vLLM) and `model init-tiny`.

Parses arguments and hands off; the work lives in serve/ and models/.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loom", description="Loom worker commands.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from loom_runtime.serve import main as serve_main
    from loom_runtime.serve import vllm_sidecar

    serve_main.add_parser(sub)
    vllm_sidecar.add_parser(sub)

    model = sub.add_parser("model", help="model tools")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    from loom_runtime.models import tiny

    tiny.add_parser(model_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    code: int = args.run(args)
    return code
