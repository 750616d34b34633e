"""Where a fleet's checkpoint lives on this machine (the router reads its tokenizer from there).

Owns turning a source URI into a directory; `loom://` checkpoints are generated and located by the
runtime, so they are resolved by a short-lived runtime process (the operator imports no runtime
code). Never downloads anything.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from loom_runtime.card import Source

RESOLVE_TIMEOUT_S = 300.0  # generating the tiny checkpoint on first use takes seconds
# The runtime's own resolution (what a worker does with the same URI), printed as one line.
_RESOLVE = (
    "import sys\n"
    "from loom_runtime.serve.sources import checkpoint_path\n"
    "print(checkpoint_path(sys.argv[1]))\n"
)


class CheckpointError(RuntimeError):
    """The source cannot be resolved to a local directory."""


async def checkpoint_dir(
    uri: str, env: Mapping[str, str] | None = None, timeout: float = RESOLVE_TIMEOUT_S
) -> Path:
    """The local directory of an absolute `file:` URI, or of `loom://tiny` (generated on first
    use, where every worker will find it)."""
    path = Source(uri=uri).local_path()
    if path is not None:
        return path
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _RESOLVE,
        uri,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ if env is None else env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CheckpointError(f"{uri}: not resolved within {timeout:g}s") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise CheckpointError(f"{uri}: cannot prepare the checkpoint: {tail[0]}")
    return Path(out.decode().strip())
