"""bench/decode_step.py in its smallest form (--quick: one process per path, one round of two
steps) times the torch path and Loom's CPU kernel in separate processes, and both produce the
same greedy tokens for the batch-16 step."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_decode_step_bench_times_both_paths_on_the_same_tokens(tmp_path: Path) -> None:
    doc, stdout = run_quick("decode_step.py", tmp_path)
    assert "kernel / torch" in stdout and "identical tokens" in stdout
    assert doc["identical_tokens"] is True
    assert set(doc["median_ms"]) == {"torch", "kernel"}
    assert all(ms > 0 for ms in doc["median_ms"].values())
