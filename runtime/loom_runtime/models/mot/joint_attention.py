"""The denoise path's attention: a request's latent tokens attend, non-causally, to its text KV
read from the paged cache and to each other's keys and values.

Reads the cache; never writes it (latent K/V live for one step only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom_runtime.kv.cache import PagedKVCache


def joint_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    text: tuple[torch.Tensor, int],
    scale: float,
) -> torch.Tensor:
    """One request's latent q [n, heads, D] over [its `text` (blocks, length) KV of `layer` in
    the cache ; its latent k, v [n, kv_heads, D]] with no mask -> [n, heads, D]."""
    blocks, length = text
    if length:
        keys, values = kv.gather(layer, blocks)
        k = torch.cat((keys[:length].to(q.dtype), k))
        v = torch.cat((values[:length].to(q.dtype), v))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
