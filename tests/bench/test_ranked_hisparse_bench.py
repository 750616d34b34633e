"""bench/ranked_hisparse.py in its smallest form (--quick: two concurrent 160-token prompts, 8
new tokens, one round, DP2×EP2 gloo ranks) serves them with every row on the rank and over
HiSparse tiers side by side: the tiers' tokens are identical, their hot buffers hit and miss,
and they keep a fraction of a token's bytes on the device."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_ranked_hisparse_bench_reports_identical_tokens_and_tier_traffic(
    tmp_path: Path,
) -> None:
    doc, stdout = run_quick("ranked_hisparse.py", tmp_path)
    assert "| context | concurrent | tiers |" in stdout  # the table it prints
    rows = {r["mode"]: r for r in doc}
    assert set(rows) == {"all rows on the rank", "HiSparse, top-k + 1", "HiSparse, 2 × top-k + 1"}
    assert all(r["identical"] and r["tokens_per_s"] > 0 for r in rows.values())
    off = rows.pop("all rows on the rank")
    assert off["ratio"] == 1.0 and off["device_bytes_per_token"] == 0
    for r in rows.values():
        assert 0 < r["hit_rate"] < 1 and r["h2d_kib_per_token"] > 0
        assert r["device_bytes_per_token"] > 0 and r["host_bytes_per_token"] > 0
