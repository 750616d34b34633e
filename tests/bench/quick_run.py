"""Running a bench/ script's --quick mode the way the bench tests do: a fresh interpreter, one
OpenMP thread, the JSON it writes read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_quick(
    script: str, tmp_path: Path, timeout: float = 600, extra: Sequence[str] = ()
) -> tuple[Any, str]:
    """`bench/<script> --quick --json OUT [extra]` in `tmp_path`; fails the test with its stderr
    tail unless it exits 0; the parsed JSON and what it printed."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(out.read_text()), ran.stdout
