"""Fixtures for the diffusion tests: one torch thread per test (the tiny Wan's matmuls gain
nothing from more, and two stall each other on a small machine)."""

from __future__ import annotations

from tests.runtime.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)
