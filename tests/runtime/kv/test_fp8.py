"""FP8 KV rows: packing is bit-equal to a plain numpy reference quantiser (e4m3 rounding written
out by hand, one fp32 scale amax / 448 per group), unpacking is exact, and the rows have the byte
sizes of REFERENCE.md §A (656-byte sparse-MLA row, 132-byte indexer row) and of the planner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loom_operator.fleet.kv_layout import quantized_row_bytes
from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla

MIN_NORMAL_EXP = -6  # e4m3: exponent bias 7, so the smallest normal is 2**-6
MANTISSA_BITS = 3


def ref_e4m3_bits(v: np.ndarray) -> np.ndarray:
    """The e4m3fn byte of each float32 in v (|v| <= 448), rounded to nearest, ties to even."""
    mag = np.abs(v.astype(np.float64))
    _, exp = np.frexp(mag)  # mag = frac * 2**exp with frac in [0.5, 1)
    e = np.maximum(exp - 1, MIN_NORMAL_EXP)  # subnormals share the smallest normal's step
    step = np.ldexp(1.0, e - MANTISSA_BITS)
    q = np.rint(mag / step).astype(np.int64)  # rint rounds half to even
    normal = (exp - 1) >= MIN_NORMAL_EXP
    # a normal's byte: (biased exponent << 3) + mantissa; q = 8 + mantissa carries into the
    # exponent by itself. A subnormal's byte is q (q = 8 is the smallest normal, 0x08).
    bits = np.where(normal, ((e + 7 - 1) << MANTISSA_BITS) + q, q)
    bits = np.where(mag == 0, 0, bits)
    return (bits | (np.signbit(v).astype(np.int64) << 7)).astype(np.uint8)


def ref_e4m3_value(bits: np.ndarray) -> np.ndarray:
    """The float32 value of each e4m3fn byte (never NaN here: the quantiser clamps to 448)."""
    b = bits.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    return (sign * value).astype(np.float32)


def ref_pack(x: np.ndarray, group: int) -> np.ndarray:
    """One row x (float32 [n]) -> e4m3 bytes, then each group's fp32 scale bytes."""
    values, scales = [], []
    for start in range(0, x.shape[0], group):
        chunk = x[start : start + group]
        scale = np.float32(np.abs(chunk).max()) / np.float32(448.0)
        divisor = scale if scale > 0 else np.float32(1.0)
        scaled = np.clip(chunk / divisor, np.float32(-448.0), np.float32(448.0))
        values.append(ref_e4m3_bits(scaled.astype(np.float32)))
        scales.append(np.float32(scale))
    return np.concatenate([*values, np.array(scales, dtype=np.float32).view(np.uint8)])


def ref_unpack(row: np.ndarray, n: int, group: int) -> np.ndarray:
    values = ref_e4m3_value(row[:n])
    scales = row[n:].copy().view(np.float32)
    return (values * np.repeat(scales, group)[:n]).astype(np.float32)


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
