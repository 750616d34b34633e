"""bench/composite.py in its smallest form (`--quick`, float64): both arrangements run in every
round at each concurrency, the two-engine baseline draws the same images as the shared instance
(the same thoughts, latents within 1e-12: it does the same work, its text KV recomputed), and
the separate engines hold the weights twice where the shared instance holds them once."""

from __future__ import annotations

from pathlib import Path

from tests.bench.quick_run import run_quick


def test_the_quick_composite_bench_compares_one_instance_with_two_engines(tmp_path: Path) -> None:
    doc, stdout = run_quick("composite.py", tmp_path, extra=["--cache", str(tmp_path)])
    assert doc["dtype"] == "float64"
    assert doc["parity"]["identical_thoughts"] and doc["parity"]["max_latent_diff"] <= 1e-12
    memory = doc["median"]["memory"]
    assert memory["separate_parameter_bytes"] == 2 * memory["shared_parameter_bytes"] > 0
    for c in ("1", "2"):
        med = doc["median"][c]
        for arr in ("shared", "separate"):
            assert med[f"{arr}_requests_per_s"] > med[f"{arr}_images_per_s"] > 0
            assert med[f"{arr}_requests_per_cpu_s"] > 0
        assert med["shared_vs_separate"] > 0 and med["shared_vs_separate_cpu"] > 0
    assert {(r["arrangement"], r["round"]) for r in doc["runs"]} == {
        ("shared", 1),
        ("separate", 1),
    }
    assert "| arrangement | parameter MB |" in stdout and "**shared ÷ separate**" in stdout
