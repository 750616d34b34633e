"""bench/ranked_mirror.py in its smallest form (--quick: one pair of 96-token turns, two new
tokens, one round) serves the same turns on PCP2×DCP2 ranks without and with prefix caching
(the engine's pool mirroring the ranks), every run token-identical to the baseline, and the
shared-prefix case really is served from the cache."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_mirror_bench_reports_identical_tokens_and_cache_hits(tmp_path: Path) -> None:
    doc, stdout = run_quick("ranked_mirror.py", tmp_path)
    assert "| prompt | case |" in stdout
    rows = {r["case"]: r for r in doc}
    assert len(rows) == 4 and all(r["identical"] and r["seconds_per_turn"] > 0 for r in doc)
    assert rows["no prefix caching (baseline)"]["ratio"] == 1.0
    assert rows["prefix caching, no shared prefix (mirror cost)"]["cached_tokens"] == 0
    assert rows["prefix caching, shared prefixes (seeded)"]["cached_tokens"] > 0
