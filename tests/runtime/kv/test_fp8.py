"""FP8 KV rows: packing is bit-equal to a plain numpy reference quantiser (e4m3 rounding written
out by hand, one fp32 scale amax / 448 per group), unpacking is exact, and the rows have the byte
sizes of REFERENCE.md §A (656-byte sparse-MLA row, 132-byte indexer row) and of the planner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.runtime.kv.fp8_reference import ref_e4m3_bits, ref_e4m3_value, ref_pack, ref_unpack

from loom_operator.fleet.kv_layout import quantized_row_bytes
from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla


def sample(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values over many binades (subnormals, ties and the clamp are all hit); row 0 is zero."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-20, 12, shape, generator=gen))
    x[0] = 0.0  # an all-zero row: scale 0, values 0
    return x


@pytest.mark.parametrize(("n", "group"), [(512, 128), (128, 128), (64, 128), (40, 16), (33, 8)])
def test_pack_is_bit_equal_to_the_reference_quantiser(n: int, group: int) -> None:
    fmt = Fp8Format(group)
    x = sample((9, n), seed=n + group)
    got = pack(x, fmt)
    assert got.dtype == torch.uint8 and got.shape == (9, fmt.row_bytes(n))
    for row, want in zip(x.numpy(), got.numpy(), strict=True):
        assert np.array_equal(ref_pack(row, group), want)


@pytest.mark.parametrize(("n", "group"), [(512, 128), (40, 16), (33, 8)])
def test_unpack_is_exact_against_the_reference(n: int, group: int) -> None:
    fmt = Fp8Format(group)
    rows = pack(sample((7, n), seed=3), fmt)
    got = unpack(rows, n, fmt)
    want = np.stack([ref_unpack(r, n, group) for r in rows.numpy()])
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want)
    assert torch.equal(pack(got, fmt), rows)  # dequantised rows quantise back to the same bytes


def test_every_e4m3_byte_decodes_like_torch() -> None:
    finite = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
    mine = ref_e4m3_value(finite)
    theirs = torch.from_numpy(finite).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(mine, theirs)
    assert np.array_equal(ref_e4m3_bits(mine), finite)


def test_quantisation_error_is_within_half_an_e4m3_step_of_each_group() -> None:
    fmt = Fp8Format(128)
    x = torch.randn(64, 512)
    back = unpack(pack(x, fmt), 512, fmt)
    amax = x.view(64, 4, 128).abs().amax(-1, keepdim=True)
    err = (back - x).view(64, 4, 128).abs()
    # e4m3's step in its top binade [256, 448] is 32: half of it, in units of the scale
    assert (err <= amax / 448 * 16 * (1 + 1e-6)).all()
    assert (err > 0).any()  # it is lossy: the bound is not vacuous


def test_sparse_mla_row_is_656_bytes_latent_scales_then_bf16_rope() -> None:
    fmt = Fp8Format(128)
    latent, rope = sample((5, 512), seed=1), torch.randn(5, 64)
    rows = pack_mla(latent, rope, fmt)
    assert rows.shape == (5, 656) == (5, fmt.mla_row_bytes(512, 64))
    assert torch.equal(rows[:, :528], pack(latent, fmt))
    assert torch.equal(rows[:, 528:].contiguous().view(torch.bfloat16), rope.bfloat16())
    lat, rot = unpack_mla(rows, 512, 64, fmt)
    assert torch.equal(lat, unpack(rows[:, :528], 512, fmt))
    assert rot.dtype == torch.bfloat16 and torch.equal(rot, rope.bfloat16())


@pytest.mark.parametrize(("elements", "group"), [(512, 128), (128, 128), (64, 128), (32, 16)])
def test_row_bytes_equal_the_planners(elements: int, group: int) -> None:
    fmt = Fp8Format(group)
    assert fmt.row_bytes(elements) == quantized_row_bytes(elements, "fp8", group)
    assert Fp8Format(128).row_bytes(128) == 132  # the indexer row of REFERENCE.md §A


def test_unpack_refuses_rows_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match=r"uint8 \[\.\.\., 132\]"):
        unpack(torch.zeros(2, 131, dtype=torch.uint8), 128, Fp8Format(128))
    with pytest.raises(ValueError, match="group_size"):
        Fp8Format(0)


@pytest.mark.parametrize("group", [1, 7, 16, 128])
def test_a_packed_row_width_gives_back_its_element_count(group: int) -> None:
    fmt = Fp8Format(group)
    for elements in range(1, 300):
        assert fmt.elements_in_row(fmt.row_bytes(elements)) == elements
    with pytest.raises(ValueError, match="no fp8 row"):
        Fp8Format(128).elements_in_row(134)  # 128 + 4 and 129 + 8 bracket it: no row is 134


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packing_rows_read_back_gives_the_same_bytes(dtype: torch.dtype) -> None:
    """Rounding is idempotent: rows a rank rounded through fp8 (parallel/sparse_mla/store.py)
    re-pack, in the engine's pool, to the bytes their first packing gave (scales included),
    for MLA rows (latent + BF16 RoPE) and indexer rows alike."""
    fmt = Fp8Format(16)
    gen = torch.Generator().manual_seed(3)
    scale = torch.rand(4000, 1, generator=gen, dtype=dtype) * 20
    latent = torch.randn(4000, 32, generator=gen, dtype=dtype) * scale
    rope = torch.randn(4000, 8, generator=gen, dtype=dtype)
    first = pack_mla(latent, rope, fmt)
    lat, rop = unpack_mla(first, 32, 8, fmt)
    assert torch.equal(pack_mla(lat.to(dtype), rop.to(dtype), fmt), first)
    for rows in (latent, sample((4000, 32), 5).to(dtype)):  # the latter over many binades
        keys = pack(rows, fmt)
        assert torch.equal(pack(unpack(keys, 32, fmt).to(dtype), fmt), keys)
