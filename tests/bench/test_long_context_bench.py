"""bench/long_context.py in its smallest form (--quick: a 2-group trace, one round): the host
tier serves prefix hits, offload changes no greedy token, and the runtime allocates the planner's
KV bytes per token for both tiny models at both precisions. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_bench_reloads_from_the_host_tier_and_matches_the_planner(
    tmp_path: Path,
) -> None:
    doc, stdout = run_quick("long_context.py", tmp_path, timeout=300)
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
    assert "host hits" in stdout and "bytes/token" in stdout
