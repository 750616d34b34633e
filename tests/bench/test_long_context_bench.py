"""bench/long_context.py in its smallest form (--quick: a 2-group trace, one round): the host
tier serves prefix hits, offload changes no greedy token, and the runtime allocates the planner's
KV bytes per token for both tiny models at both precisions. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_bench_reloads_from_the_host_tier_and_matches_the_planner(
    tmp_path: Path,
) -> None:
    out = tmp_path / "long_context.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = ROOT / "bench" / "long_context.py"
    ran = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    doc = json.loads(out.read_text())
    off, on = doc["offload"]["off"], doc["offload"]["on"]
    assert on["host_hit_tokens"] > 0 and off["host_hit_tokens"] == 0
    assert doc["offload"]["greedy_outputs_equal"] is True
    # The reloaded tokens were not run through the model again.
    assert off["tokens_run"] - on["tokens_run"] >= on["host_hit_tokens"]
    runs = {(r["model"], r["kv"]): r for r in doc["precision"]}
    assert set(runs) == {(m, kv) for m in ("llama", "sparse-mla") for kv in ("fp32", "fp8")}
    for r in runs.values():
        assert r["allocated_bytes_per_token"] == r["planner_bytes_per_token"], r
        assert r["reported_bytes_per_token"] == r["planner_bytes_per_token"], r
    for model in ("llama", "sparse-mla"):
        fp8, fp32 = runs[(model, "fp8")], runs[(model, "fp32")]
        assert fp8["allocated_bytes_per_token"] < fp32["allocated_bytes_per_token"]
    assert "host hits" in ran.stdout and "bytes/token" in ran.stdout
