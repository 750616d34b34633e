"""Umt5Encoder == transformers' UMT5EncoderModel on the tiny checkpoint (C0), with and without
padding, and the relative-position buckets equal transformers' own bucketing.

Tolerance (float64): transformers takes T5's mean square in float32 even for float64 weights,
so the two agree at float32 level; we allow 1e-5 relative to the output's scale (measured:
7.2e-7 absolute at scale 3.6). In bfloat16 the two are bit-identical on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.wan.loader import LoadedWan
from loom_runtime.models.wan.text_encoder import relative_buckets

TOLERANCE = 1e-5


def prompt_ids(ours: LoadedWan, text: str) -> list[int]:
    return ours.tokenizer.encode(text)


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    scale = expected.abs().max().item()
    error = (got - expected).abs().max().item()
    assert error <= TOLERANCE * scale, (
        f"max |ours - transformers| = {error:.3g} (scale {scale:.3g})"
    )


def test_features_equal_transformers(ours: LoadedWan, reference_text_encoder: Any) -> None:
    ids = torch.tensor([prompt_ids(ours, "a red fox runs through fresh snow at dawn")])
    got = ours.text_encoder.forward(ids)
    with torch.no_grad():
        expected = reference_text_encoder(input_ids=ids).last_hidden_state
    assert_close(got, expected)


def test_padded_batch_equals_transformers(ours: LoadedWan, reference_text_encoder: Any) -> None:
    """Two prompts of different lengths padded to one length: masked keys are ignored."""
    long = prompt_ids(ours, "a lighthouse on a cliff, storm clouds, waves breaking below it")
    short = prompt_ids(ours, "a cat")
    pad = ours.config.text_encoder.vocab_size - 1
    length = len(long) + 3  # padding on both rows
    ids = torch.tensor([row + [pad] * (length - len(row)) for row in (long, short)])
    mask = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in (long, short)])
    got = ours.text_encoder.forward(ids, mask)
    with torch.no_grad():
        expected = reference_text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(got, expected)
    alone = ours.text_encoder.forward(torch.tensor([short]))
    assert torch.allclose(got[1, : len(short)], alone[0], atol=1e-10)  # padding hides


def test_buckets_equal_transformers_far_beyond_max_distance(reference_text_encoder: Any) -> None:
    attention = reference_text_encoder.encoder.block[0].layer[0].SelfAttention
    positions = torch.arange(300)
    relative = positions[None, :] - positions[:, None]
    expected = attention._relative_position_bucket(relative)
    got = relative_buckets(300, 300, 32, 128, torch.device("cpu"))
    assert torch.equal(got, expected)
    # every bucket but "after, at distance 0" (which cannot happen) is used
    assert len(set(got.flatten().tolist())) == 31


def test_bfloat16_is_bit_identical_to_transformers_bfloat16(
    ours_bf16: LoadedWan, reference_text_encoder_bf16: Any
) -> None:
    ids = torch.tensor([prompt_ids(ours_bf16, "two koi circling in a green pond, top view")])
    got = ours_bf16.text_encoder.forward(ids)
    with torch.no_grad():
        expected = reference_text_encoder_bf16(input_ids=ids).last_hidden_state
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)
