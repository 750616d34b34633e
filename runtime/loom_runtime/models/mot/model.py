"""MotForCausalLM: one llama transformer stack run by two loops: causal text decoding over the
paged KV (`forward`, the CausalLM the engine serves) and flow-matching denoising of image latents
that attend to the request's text KV (`denoise`), with small image heads around the same stack.

Owns the weights and both forwards; never schedules, allocates KV blocks or reads files.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from loom_runtime.kv.cache import KVStore, PagedKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from loom_runtime.models.mot.config import MotConfig
from loom_runtime.models.mot.denoise_batch import DenoiseBatch
from loom_runtime.models.mot.image_heads import ImageHeads, unpatchify
from loom_runtime.models.mot.joint_attention import joint_attention
from loom_runtime.models.rope import rope_tables
from loom_runtime.models.weights import copy_weights

IMAGE_PREFIX = "image."
"""Checkpoint names of the image heads; every other name is the llama text model's."""


class MotForCausalLM:
    """The text model (`text`, a LlamaForCausalLM: embeddings, the shared stack, LM head) and the
    image heads (`image`). Both loops run the very same `LlamaDecoderLayer` objects."""

    def __init__(
        self,
        config: MotConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        self.text = LlamaForCausalLM(config.text, dtype=dtype, device=device)
        self.image = ImageHeads(config, dtype, device)

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode for both loops: the text model's (its matmuls and attention)
        and the image heads' matmuls (models/linear.py)."""
        self.text.set_batch_invariant(on)
        self.image.linear = self.text.linear

    @property
    def layers(self) -> list[LlamaDecoderLayer]:
        """The shared transformer stack (the text model's layers, not a copy)."""
        return self.text.layers

    @property
    def dtype(self) -> torch.dtype:
        return self.text.dtype

    @property
    def device(self) -> torch.device:
        return self.text.device

    def forward(self, batch: ForwardBatch, kv: KVStore) -> torch.Tensor:
        """The AR loop's step: exactly the llama family's forward (see CausalLM)."""
        return self.text.forward(batch, kv)

    @torch.inference_mode()
    def denoise(self, batch: DenoiseBatch, kv: PagedKVCache) -> list[torch.Tensor]:
        """The predicted flow-matching velocity [C, H, W] of each request's latents.

        Latent tokens sit at positions context_len, context_len + 1, ... (raster order, after
        the text); the shared blocks run over them without a causal mask, attending to the
        request's cached text KV, which they read and never write."""
        config, text = self.config, self.text
        batch.check(config, kv.spec.block_size)
        rows = batch.layout(config.patch_size, self.dtype, self.device)
        x = self.image.embed(rows.patches, rows.times)
        rope = rope_tables(rows.positions, text.inv_freq, text.rope_scale, self.dtype)
        for layer in self.layers:
            q, k, v = layer.attention_inputs(x, rope)
            attn = [
                joint_attention(
                    q[a:b], k[a:b], v[a:b], kv, layer.layer, context, text.attention_scale
                )
                for (a, b), context in zip(rows.spans, rows.texts, strict=True)
            ]
            x = layer.after_attention(x, torch.cat(attn))
        out = self.image.velocity(x)
        return [
            unpatchify(out[a:b], config.latent_channels, *r.latents.shape[1:])
            for (a, b), r in zip(rows.spans, batch.requests, strict=True)
        ]

    def targets(self) -> dict[str, torch.Tensor]:
        """Every checkpoint tensor name this model reads -> the tensor (view) it fills."""
        out = self.text.targets()
        out.update({IMAGE_PREFIX + name: t for name, t in self.image.targets().items()})
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy checkpoint tensors in place; validates all names and shapes first (atomic)."""
        wanted = {n: t for n, t in tensors.items() if not self.text.ignores(n)}
        copy_weights(self.targets(), wanted, self.config.model_type, strict)
