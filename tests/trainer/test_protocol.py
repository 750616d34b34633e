"""The weight-push wire format: buckets stay within their bound and keep every tensor, bytes
survive packing, and a manifest that does not fit the model is described name by name."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loom_trainer.protocol import (
    Bucket,
    TensorSpec,
    check_specs,
    decode_manifest,
    encode_manifest,
    pack,
    pieces,
    plan_buckets,
    spec_of,
    unpack,
)


@given(
    st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=30),
    st.integers(min_value=1, max_value=2000),
)
def test_buckets_keep_order_and_stay_within_the_bound(sizes: list[int], bound: int) -> None:
    specs = [TensorSpec(f"t{i}", (n,), "float32") for i, n in enumerate(sizes)]
    buckets = plan_buckets(specs, bound)
    assert [s for b in buckets for s in b.specs] == specs
    largest = max((s.nbytes for s in specs), default=0)
    assert all(b.nbytes <= max(bound, largest) for b in buckets)
    assert all(off % 16 == 0 for b in buckets for off in b.offsets)
    assert [b.index for b in buckets] == list(range(len(buckets)))


@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=12),
    st.integers(min_value=1, max_value=64),
)
def test_pieces_cover_every_tensor_byte_once_within_their_bound(
    sizes: list[int], piece_bytes: int
) -> None:
    bucket = Bucket(0, tuple(TensorSpec(f"t{i}", (n,), "int8") for i, n in enumerate(sizes)))
    parts = pieces(bucket, piece_bytes)
    assert all(0 < p.nbytes <= piece_bytes for p in parts)
    for spec, offset in zip(bucket.specs, bucket.offsets, strict=True):
        mine = [p for p in parts if p.name == spec.name]
        assert [p.start for p in mine] == list(range(0, spec.nbytes, piece_bytes))
        assert sum(p.nbytes for p in mine) == spec.nbytes
        assert all(p.offset == offset + p.start for p in mine)
    assert [p.offset for p in parts] == sorted(p.offset for p in parts)


def test_packed_bytes_unpack_to_equal_tensors_of_every_dtype() -> None:
    tensors = {
        "a": torch.randn(3, 4, dtype=torch.float64),
        "b": torch.randn(5).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),  # not contiguous
        "d": torch.tensor(2.5),  # a scalar
    }
    bucket = Bucket(0, tuple(spec_of(n, t) for n, t in tensors.items()))
    buf = torch.empty(bucket.nbytes, dtype=torch.uint8)
    pack(bucket, tensors, buf)
    out = unpack(bucket, buf)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t)
    assert decode_manifest(encode_manifest([bucket])) == ((bucket,), {"kind": "gloo"})
    nixl = {"kind": "nixl", "agent": "bWV0YQ==", "addr": 4096, "mem": "DRAM", "device": 0}
    assert decode_manifest(encode_manifest([bucket], nixl)) == ((bucket,), nixl)
    older = json.dumps([[[s.name, list(s.shape), s.dtype] for s in bucket.specs]]).encode()
    with pytest.raises(ValueError, match="not this worker's format"):
        decode_manifest(older)  # a manifest of a loom_trainer before the data path


def test_check_names_every_unknown_missing_and_wrong_tensor() -> None:
    expected = {
        "w": TensorSpec("w", (4, 4), "float32"),
        "b": TensorSpec("b", (4,), "float32"),
        "n": TensorSpec("n", (4,), "float32"),
    }
    pushed = [
        TensorSpec("w", (4, 5), "float32"),
        TensorSpec("b", (4,), "float64"),
        TensorSpec("extra", (1,), "float32"),
    ]
    problems = check_specs(pushed, expected)
    assert problems == [
        "unknown: extra",
        "missing: n",
        "shape: w (4, 5) != (4, 4)",
        "dtype: b float64 != float32",
    ]
    assert check_specs(list(expected.values()), expected) == []
