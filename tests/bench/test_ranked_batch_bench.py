"""bench/ranked_batch.py in its smallest form (--quick: three concurrent 40-token requests,
three new tokens, one round on PCP2×DCP2 ranks) serves the same requests with a step's
decodes one forward each and batched into one: token-identical, and the batched ranks ran
fewer forwards than works."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_batch_bench_is_identical_and_batches_the_decodes(tmp_path: Path) -> None:
    doc, stdout = run_quick("ranked_batch.py", tmp_path)
    assert "| layout | requests | case |" in stdout
    rows = {r["case"]: r for r in doc}
    assert len(rows) == 2 and all(r["identical"] and r["tokens_per_s"] > 0 for r in doc)
    alone, batched = rows["one forward per decode"], rows["batched decodes"]
    assert alone["ratio"] == 1.0
    assert alone["rank_forwards"] == alone["works"]
    assert batched["works"] == alone["works"]
    assert batched["rank_forwards"] < batched["works"]
