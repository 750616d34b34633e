"""bench/context_parallel.py in its smallest form (--quick: one short prompt, one round) runs
on real gloo ranks and reports every layout with one-rank tokens, and the indexer phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_bench_runs_every_layout_token_identical(tmp_path: Path) -> None:
    out = tmp_path / "cp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = ROOT / "bench" / "context_parallel.py"
    ran = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    doc = json.loads(out.read_text())
    layouts = {(r["length"], r["layout"]) for r in doc["runs"]}
    assert layouts == {(n, name) for n in (256,) for name in ("1 rank", "PCP2", "PCP2xDCP2")}
    assert all(r["tokens_equal_one_rank"] and r["prefill_s"] > 0 for r in doc["runs"])
    assert [s["length"] for s in doc["shares"]] == [256]
    assert all(0 < s["indexer_s"] < s["prefill_s"] for s in doc["shares"])
    assert doc["planner_crossover"] > 0
    assert "PCP2 speed-up" in ran.stdout and "indexer share" in ran.stdout
