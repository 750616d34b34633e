"""bench/mtp.py in its smallest form (--quick: a 96-token prompt, 12 new tokens, k = 3, one
round) runs plain and speculative decoding side by side, every speculative run token-identical
to the plain one, and the replay drafter's acceptances really make steps emit several tokens."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_bench_reports_identical_tokens_and_acceptance(tmp_path: Path) -> None:
    doc, stdout = run_quick("mtp.py", tmp_path)
    assert "| drafter |" in stdout  # the table it prints
    rows = {(r["drafter"], r["k"]): r for r in doc}
    assert set(rows) == {
        ("none (plain greedy)", 0),
        ("mtp (random weights)", 3),
        ("replay alpha=0.8", 3),
    }
    assert all(r["identical"] and r["seconds"] > 0 for r in rows.values())
    assert rows[("replay alpha=0.8", 3)]["tokens_per_step"] > 1.5
    assert 1.0 <= rows[("mtp (random weights)", 3)]["tokens_per_step"] <= 4.0
