"""bench/batch_invariant.py in its smallest form (--quick: one and four concurrent requests,
12 new tokens, a 96-token prefill, one round) reports both sides at both concurrencies and the
prefill, and in batch-invariant mode every request's tokens and log-probs batched were the same
bits as alone, and the prompt's whole, chunked and cached."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_batch_invariant_bench_reports_both_sides_alone_equal_batched_when_on(
    tmp_path: Path,
) -> None:
    doc, stdout = run_quick("batch_invariant.py", tmp_path)
    assert "| mode | concurrent |" in stdout and "| mode | prompt |" in stdout
    decode, prefill = doc["decode"], doc["prefill"]
    assert [(r["side"], r["concurrency"]) for r in decode] == [
        ("off (baseline)", 1), ("on", 1), ("off (baseline)", 4), ("on", 4),
    ]  # fmt: skip
    assert all(r["alone_equal"] for r in decode if r["side"] == "on")
    assert all(r["identical"] and r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in decode)
    assert [(r["side"], r["prompt_tokens"]) for r in prefill] == [
        ("off (baseline)", 96), ("on", 96),
    ]  # fmt: skip
    assert all(r["identical"] and r["prefill_ms"] > 0 for r in prefill)
    assert prefill[1]["chunked_equal"]
