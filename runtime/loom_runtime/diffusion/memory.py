"""Peak-memory estimates of diffusion requests and the ledger that reserves them before admission.

Pure arithmetic over shapes and a counter of reserved bytes; never allocates, never schedules.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from loom_runtime.diffusion.loop import DiffusionShape
from loom_runtime.diffusion.types import DiffusionRequest

FLOAT32 = 4
# Query rows whose attention scores a fused attention kernel holds at once, per head (flash and
# memory-efficient kernels tile far finer; the math kernel of float64 holds them all, which only
# tiny test models run).
ATTENTION_TILE = 1024


@dataclass(frozen=True)
class MemoryModel:
    """What one request's tensors cost, from a checkpoint's widths. The estimate is an upper
    bound of the working set, not a measurement: the denoise phase (latents, the CFG-batched
    DiT input/output, its tokens' activations and a tile of attention scores, the text
    features) or the decode phase (the widest VAE feature map over one latent frame's output
    frames, its causal cache and the decoded pixels), whichever is larger, plus what lives
    through both (latents, pixels)."""

    dtype_bytes: int  # the compute dtype's element size
    text_dim: int  # the encoder's d_model
    dit_dim: int  # the DiT's inner width
    dit_heads: int
    vae_channels: int  # the widest VAE decoder feature map

    def peak_bytes(
        self, shape: DiffusionShape, req: DiffusionRequest, latent: tuple[int, ...]
    ) -> int:
        b = self.dtype_bytes
        rows = 2 if req.guided else 1
        latent_bytes = prod(latent) * FLOAT32
        _, _, frames, h, w = latent
        pt, ph, pw = shape.patch
        tokens = (frames // pt) * (h // ph) * (w // pw)
        text = rows * shape.text_len * self.text_dim * b
        activations = rows * tokens * self.dit_dim * b * 8  # q, k, v, attention out, FFN
        scores = (
            rows * self.dit_heads * min(tokens, ATTENTION_TILE) * max(tokens, shape.text_len) * b
        )
        denoise = text + 4 * rows * latent_bytes + activations + scores
        pixels = 3 * req.num_frames * req.height * req.width * b
        chunk_frames = shape.temporal_scale
        feature = self.vae_channels * chunk_frames * req.height * req.width * b
        decode = 3 * feature + shape.vae_cache_slots * 2 * self.vae_channels * h * w * b * 4
        return latent_bytes + 2 * pixels + max(denoise, decode)


class MemoryLedger:
    """Bytes reserved for admitted requests against a budget. Not thread-safe: its owner (the
    diffusion engine) calls it under its own lock."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 1:
            raise ValueError(f"the diffusion memory budget must be >= 1 byte, got {budget_bytes}")
        self.budget = budget_bytes
        self._held: dict[str, int] = {}

    @property
    def reserved(self) -> int:
        return sum(self._held.values())

    def can_ever_fit(self, nbytes: int) -> bool:
        return nbytes <= self.budget

    def try_reserve(self, request_id: str, nbytes: int) -> bool:
        """Reserve `nbytes` for the request if they fit now; False (nothing held) if not."""
        if request_id in self._held:
            raise ValueError(f"request {request_id!r} already holds a reservation")
        if self.reserved + nbytes > self.budget:
            return False
        self._held[request_id] = nbytes
        return True

    def release(self, request_id: str) -> int:
        """Free the request's reservation (0 when it held none)."""
        return self._held.pop(request_id, 0)

    def held(self, request_id: str) -> int:
        return self._held.get(request_id, 0)
