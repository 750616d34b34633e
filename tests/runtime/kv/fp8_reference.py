"""The plain FP8 reference quantiser the runtime's kv/fp8.py must match bit for bit: e4m3
rounding written out by hand in numpy, one fp32 scale amax / 448 per group, row by row.

Test-only and deliberately slow and literal; never imports the code it checks.
"""

from __future__ import annotations

import numpy as np
import torch

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


def ref_round_trip(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., n] quantised and dequantised by the reference, row by row, as float32."""
    rows = x.detach().to(torch.float32).reshape(-1, x.shape[-1]).numpy()
    back = [ref_unpack(ref_pack(row, group), x.shape[-1], group) for row in rows]
    return torch.from_numpy(np.stack(back).reshape(x.shape))
