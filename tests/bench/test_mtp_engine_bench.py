"""bench/mtp_engine.py (one rank) and bench/ranked_mtp.py (DP2×EP2 gloo ranks) in their smallest
form (--quick: two concurrent short prompts, 8 new tokens, k = 3, one round) serve them with
MTP off and on side by side, every speculative run token-identical to MTP off, and the replay
drafter's acceptances really make the verifies emit several tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.bench.quick_run import run_quick


@pytest.mark.parametrize("script", ["mtp_engine.py", "ranked_mtp.py"])
def test_the_quick_mtp_bench_reports_identical_tokens_and_acceptance(
    script: str, tmp_path: Path
) -> None:
    doc, stdout = run_quick(script, tmp_path)
    assert "| concurrent | drafter |" in stdout  # the table it prints
    rows = {(r["concurrency"], r["drafter"]): r for r in doc}
    assert set(rows) == {
        (2, "none (MTP off)"),
        (2, "MTP layer (random weights)"),
        (2, "replay alpha=0.8"),
    }
    assert all(r["identical"] and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows[(2, "replay alpha=0.8")]["acceptance_length"] > 1.5
    assert rows[(2, "none (MTP off)")]["ratio"] == 1.0
