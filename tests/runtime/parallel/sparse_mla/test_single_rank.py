"""The parallel code path on a group of one (every collective the identity) is the plain
forward: same logits bit for bit, prefill and decode; and a layout the model cannot split is
refused before any forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.layout import LayoutError, ParallelLayout
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.sequence import ParallelSequence


def test_one_rank_parallel_sequence_equals_the_plain_forward(ours: LoadedSparseMla) -> None:
    model = ours.model
    prompt = torch.arange(150) % ours.config.vocab_size
    cache = model.new_cache(160)
    expected = model.forward(prompt, cache)
    seq = ParallelSequence(model, RankPlan.single(), 160)
    assert torch.equal(seq.prefill(prompt, all_logits=True), expected)
    for token in (5, 9, 11):
        step = torch.tensor([token])
        assert torch.equal(seq.decode(step), model.forward(step, cache))
    assert seq.length == cache.length == 153


def test_a_layout_the_model_cannot_split_is_refused(ours: LoadedSparseMla) -> None:
    layout = ParallelLayout(pcp=3, dcp=3, ep=3)  # 4 heads and 8 experts do not split by 3
    three = Comm(ranks=(0, 1, 2), index=0)
    plan = dataclasses.replace(
        RankPlan.single(), layout=layout, coords=layout.coords(0), dcp=three, ep=three
    )
    with pytest.raises(LayoutError, match=r"dcp \(3\) must divide num_attention_heads \(4\)"):
        ParallelSequence(ours.model, plan, 16)
