"""bench/structured_outputs.py in its smallest form (--quick: four concurrent requests, 12 new
tokens, one round) reports both workloads on both sides, every constrained answer valid, and a
mask that costs something and is not counted on the free side."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_structured_outputs_bench_reports_both_sides(tmp_path: Path) -> None:
    doc, stdout = run_quick("structured_outputs.py", tmp_path)
    assert "| workload | side |" in stdout
    rows = {(r["workload"], r["side"]): r for r in doc}
    assert set(rows) == {(w, s) for w in ("steps", "requests")
                         for s in ("free (baseline)", "json_schema")}  # fmt: skip
    assert all(r["identical"] and r["tokens_per_s"] > 0 and r["concurrency"] == 4
               for r in rows.values())  # fmt: skip
    assert rows[("steps", "json_schema")]["mask_ms"] > 0
    assert rows[("steps", "free (baseline)")]["mask_ms"] == 0
    assert rows[("steps", "json_schema")]["step_ms"] > 0
