"""bench/mtp.py in its smallest form (--quick: a 96-token prompt, 12 new tokens, k = 3, one
round) runs plain and speculative decoding side by side, every speculative run token-identical
to the plain one, and the replay drafter's acceptances really make steps emit several tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_bench_reports_identical_tokens_and_acceptance(tmp_path: Path) -> None:
    out = tmp_path / "mtp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mtp.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = {(r["drafter"], r["k"]): r for r in json.loads(out.read_text())}
    assert set(rows) == {
        ("none (plain greedy)", 0),
        ("mtp (random weights)", 3),
        ("replay alpha=0.8", 3),
    }
    assert all(r["identical"] and r["seconds"] > 0 for r in rows.values())
    assert rows[("replay alpha=0.8", 3)]["tokens_per_step"] > 1.5
    assert 1.0 <= rows[("mtp (random weights)", 3)]["tokens_per_step"] <= 4.0
