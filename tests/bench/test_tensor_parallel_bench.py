"""bench/tensor_parallel.py in its smallest form (--quick: two concurrent 40-token requests,
three new tokens, one round) serves the same requests on one rank and on TP2 ranks:
token-identical, and a TP2 rank holds half the KV bytes of a token."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_tp_bench_is_identical_and_halves_each_ranks_kv(tmp_path: Path) -> None:
    doc, stdout = run_quick("tensor_parallel.py", tmp_path)
    assert "| requests | case |" in stdout
    rows = {r["case"]: r for r in doc}
    assert len(rows) == 2 and all(r["identical"] and r["tokens_per_s"] > 0 for r in doc)
    one, tp = rows["one rank, 2 threads"], rows["TP2, 1 thread per rank"]
    assert one["ratio"] == 1.0
    assert tp["kv_bytes_per_token_per_rank"] * 2 == one["kv_bytes_per_token_per_rank"]
