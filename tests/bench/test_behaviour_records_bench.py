"""bench/behaviour_records.py in its smallest form (--quick: four concurrent requests, 12 new
tokens, one round) reports both sides, and the record changed no token."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_behaviour_records_bench_reports_both_sides_with_the_same_tokens(
    tmp_path: Path,
) -> None:
    doc, stdout = run_quick("behaviour_records.py", tmp_path)
    assert "| record | concurrent |" in stdout
    assert [r["side"] for r in doc] == ["off (baseline)", "on"]
    assert all(r["identical"] and r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in doc)
