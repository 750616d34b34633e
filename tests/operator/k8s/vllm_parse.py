"""Run in vLLM's own virtual environment: parse each argv on stdin (a JSON list of `vllm serve …`
lists) with vLLM's serve parser, its serve-args validation and AsyncEngineArgs; print one JSON
result per argv. No GPU is needed (VLLM_TARGET_DEVICE=cpu)."""

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parse(argv: list[str]) -> dict[str, object]:
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
        if getattr(args, "model_tag", None) is not None:  # as `vllm serve MODEL` does
            args.model = args.model_tag
        validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
    except SystemExit:
        return {"ok": False, "error": err.getvalue().strip().splitlines()[-1:]}
    except Exception as exc:  # a validation error: report it
        return {"ok": False, "error": [f"{type(exc).__name__}: {exc}"]}
    return {
        "ok": True,
        "model": engine.model,
        "block_size": engine.block_size,
        "pcp": engine.prefill_context_parallel_size,
        "dcp": engine.decode_context_parallel_size,
        "prefix_caching": engine.enable_prefix_caching,
        "kv_cache_memory_bytes": engine.kv_cache_memory_bytes,
    }


print(json.dumps([parse(a) for a in json.load(sys.stdin)]))
