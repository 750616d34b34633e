"""bench/hisparse_capacity.py: under one device budget, HiSparse fits at least 4x the 16k-token
sequences of the all-on-device cache (issue #16's target), and the engine's own sizing takes
exactly that many — one more is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench.hisparse_capacity import capacity, engine_accepts, glm5_latent, rows, tiny_latent


@pytest.mark.parametrize("fp8", [False, True])
def test_hisparse_fits_four_times_the_long_sequences_and_the_engine_agrees(fp8: bool) -> None:
    latent, topk = tiny_latent(fp8)
    row = capacity("tiny", latent, topk, 16_384, 2**30)
    assert row.sequences_on_device > 0
    assert row.ratio >= 4.0, row
    assert engine_accepts(latent, topk, row)
    one_more = replace(row, sequences_hisparse=row.sequences_hisparse + 1)
    assert not engine_accepts(latent, topk, one_more)


def test_the_glm5_class_rows_and_the_table_are_reported() -> None:
    latent, _ = glm5_latent()
    assert latent.stored_row_width == 656 and latent.stored_index_width == 132  # REFERENCE.md §A
    table = rows()
    assert [r.model for r in table] == ["tiny sparse-mla", "tiny sparse-mla", "GLM-5 class"]
    assert all(r.sequences_hisparse > r.sequences_on_device for r in table)
