"""bench/diffusion.py in its smallest form (`--quick`): every engine runs every workload at each
concurrency, the JSON holds a median row per workload and concurrency with positive rates and
latencies, Loom's step cost model has fitted each workload's denoise forward and VAE decode
call, and the markdown table is printed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "diffusion.py"


def test_the_quick_diffusion_bench_measures_every_engine_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("bench_diffusion", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look themselves up
    spec.loader.exec_module(bench)
    out = tmp_path / "diffusion.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert bench.main(["--quick", "--out", str(out), "--cache", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert sorted(report["median"]) == ["image@1", "image@2", "video@1", "video@2"]
    for med in report["median"].values():
        for engine in ("loom", "one-by-one", "diffusers"):
            assert med[f"{engine}_jobs_per_s"] > 0
            assert 0 < med[f"{engine}_p50_s"] <= med[f"{engine}_p90_s"]
        assert med["batching_gain"] > 0 and med["vs_diffusers"] > 0
    engines = {(r["engine"], r["workload"], r["concurrency"]) for r in report["runs"]}
    assert len(engines) == 3 * 2 * 2  # one measured round of each
    printed = capsys.readouterr().out
    assert "| image | 2 | **gain** | batching" in printed
    assert "fitted video denoise forward" in printed
    assert "fitted video VAE decode call" in printed
    for costs in ("loom_denoise_cost", "loom_vae_decode_cost"):
        fit = report[costs]["image"]  # what the step cost model learnt
        assert fit["fixed_s"] + fit["per_item_s"] > 0, costs
