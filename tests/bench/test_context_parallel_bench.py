"""bench/context_parallel.py in its smallest form (--quick: one short prompt, one round) runs
on real gloo ranks and reports every layout with one-rank tokens, and the indexer phase."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_bench_runs_every_layout_token_identical(tmp_path: Path) -> None:
    doc, stdout = run_quick("context_parallel.py", tmp_path)
    layouts = {(r["length"], r["layout"]) for r in doc["runs"]}
    assert layouts == {(n, name) for n in (256,) for name in ("1 rank", "PCP2", "PCP2xDCP2")}
    assert all(r["tokens_equal_one_rank"] and r["prefill_s"] > 0 for r in doc["runs"])
    assert [s["length"] for s in doc["shares"]] == [256]
    assert all(0 < s["indexer_s"] < s["prefill_s"] for s in doc["shares"])
    assert doc["planner_crossover"] > 0
    assert "PCP2 speed-up" in stdout and "indexer share" in stdout
