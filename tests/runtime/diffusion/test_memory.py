"""Peak-memory estimates grow with frames, size and guidance; the ledger reserves only what fits,
releases to zero, and refuses double reservations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_runtime.diffusion.loop import DiffusionShape
from loom_runtime.diffusion.memory import MemoryLedger, MemoryModel
from loom_runtime.diffusion.types import DiffusionRequest

SHAPE = DiffusionShape(4, 8, 4, (1, 2, 2), 16, 3.0, 10)
MODEL = MemoryModel(dtype_bytes=4, text_dim=32, dit_dim=32, dit_heads=2, vae_channels=32)


def peak(frames: int = 1, size: int = 32, guidance: float = 1.0, model: MemoryModel = MODEL) -> int:
    req = DiffusionRequest("r", (1,), size, size, frames, guidance_scale=guidance)
    latent = (1, 4, (frames - 1) // 4 + 1, size // 8, size // 8)
    return model.peak_bytes(SHAPE, req, latent)


@given(st.integers(0, 20), st.integers(1, 8))
def test_more_frames_or_pixels_never_need_less(k: int, cells: int) -> None:
    size = 16 * cells
    assert peak(1 + 4 * (k + 1), size) > peak(1 + 4 * k, size)
    assert peak(1 + 4 * k, size + 16) > peak(1 + 4 * k, size)


def test_guidance_never_needs_less_and_more_where_denoise_dominates() -> None:
    assert peak(5, 32, guidance=4.0) >= peak(5, 32)
    wide_dit = MemoryModel(dtype_bytes=4, text_dim=32, dit_dim=4096, dit_heads=8, vae_channels=1)
    assert peak(5, 32, 4.0, wide_dit) > peak(5, 32, 1.0, wide_dit)


def test_the_ledger_reserves_what_fits_and_releases_to_zero() -> None:
    ledger = MemoryLedger(100)
    assert ledger.try_reserve("a", 60)
    assert not ledger.try_reserve("b", 50) and ledger.held("b") == 0
    assert ledger.try_reserve("c", 40) and ledger.reserved == 100
    assert ledger.release("a") == 60 and ledger.release("a") == 0
    assert ledger.try_reserve("b", 50)
    ledger.release("b"), ledger.release("c")
    assert ledger.reserved == 0
    assert not ledger.can_ever_fit(101) and ledger.can_ever_fit(100)


def test_a_request_cannot_reserve_twice() -> None:
    ledger = MemoryLedger(100)
    ledger.try_reserve("a", 1)
    with pytest.raises(ValueError, match="already"):
        ledger.try_reserve("a", 1)
