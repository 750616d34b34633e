"""A plain float64 MoT written for the tests: one request, no paging, no batching, explicit
loops over patches and heads. It reads the checkpoint's tensors by name and shares no code with
loom_runtime.models (the parity tests compare the two)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

Tensors = Mapping[str, torch.Tensor]


class ReferenceMot:
    def __init__(self, tensors: Tensors, config: Mapping[str, Any]) -> None:
        self.w = {name: t.to(torch.float64) for name, t in tensors.items()}
        self.c = config
        self.heads = config["num_attention_heads"]
        self.kv_heads = config["num_key_value_heads"]
        self.head_dim = config["head_dim"]
        self.eps = config["rms_norm_eps"]
        self.patch = config["image"]["patch_size"]

    def norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        return self.w[weight] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps)

    def linear(self, x: torch.Tensor, name: str, bias: bool = False) -> torch.Tensor:
        out = x @ self.w[f"{name}.weight"].T
        return out + self.w[f"{name}.bias"] if bias else out

    def rope(self, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
        d = self.head_dim
        inv = 1.0 / self.c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
        cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None, :]
        sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None, :]
        rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1)
        return x * cos + rotated * sin

    def qkv(self, i: int, x: torch.Tensor, positions: list[int]) -> tuple[torch.Tensor, ...]:
        p = f"model.layers.{i}."
        h = self.norm(x, p + "input_layernorm.weight")
        q = self.linear(h, p + "self_attn.q_proj").view(-1, self.heads, self.head_dim)
        k = self.linear(h, p + "self_attn.k_proj").view(-1, self.kv_heads, self.head_dim)
        v = self.linear(h, p + "self_attn.v_proj").view(-1, self.kv_heads, self.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
    ) -> torch.Tensor:
        """q [n, H, D] over k, v [L, KVH, D]; visible [n, L] bool."""
        group = self.heads // self.kv_heads
        out = torch.empty_like(q)
        for head in range(self.heads):
            kh, vh = k[:, head // group], v[:, head // group]
            scores = q[:, head] @ kh.T / math.sqrt(self.head_dim)
            scores = scores.masked_fill(~visible, float("-inf"))
            out[:, head] = torch.softmax(scores, dim=-1) @ vh
        return out

    def finish(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{i}."
        x = x + self.linear(attn.flatten(1), p + "self_attn.o_proj")
        h = self.norm(x, p + "post_attention_layernorm.weight")
        gate, up = self.linear(h, p + "mlp.gate_proj"), self.linear(h, p + "mlp.up_proj")
        return x + self.linear(gate * torch.sigmoid(gate) * up, p + "mlp.down_proj")

    def text(self, tokens: list[int]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
        """Causal text forward: (logits [n, vocab], each layer's (k, v) of the text)."""
        x = self.w["model.embed_tokens.weight"][tokens]
        n = len(tokens)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        cache = []
        for i in range(self.c["num_hidden_layers"]):
            q, k, v = self.qkv(i, x, list(range(n)))
            cache.append((k, v))
            x = self.finish(i, x, self.attend(q, k, v, causal))
        return self.linear(self.norm(x, "model.norm.weight"), "lm_head"), cache

    def patches(self, latents: torch.Tensor) -> torch.Tensor:
        p = self.patch
        _, height, width = latents.shape
        rows = [
            latents[:, y : y + p, x : x + p].reshape(-1)
            for y in range(0, height, p)
            for x in range(0, width, p)
        ]
        return torch.stack(rows).to(torch.float64)

    def image(self, patches: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
        p = self.patch
        channels, _, width = shape
        out = torch.empty(shape, dtype=torch.float64)
        per_row = width // p
        for j, row in enumerate(patches):
            y, x = (j // per_row) * p, (j % per_row) * p
            out[:, y : y + p, x : x + p] = row.view(channels, p, p)
        return out

    def time_embedding(self, t: float) -> torch.Tensor:
        half = self.c["image"]["frequency_dim"] // 2
        freqs = [math.exp(-math.log(10000.0) * j / half) for j in range(half)]
        args = torch.tensor([t * 1000.0 * f for f in freqs], dtype=torch.float64)
        features = torch.cat((args.cos(), args.sin()))
        hidden = self.linear(features, "image.time_embed.linear_1", bias=True)
        return self.linear(hidden * torch.sigmoid(hidden), "image.time_embed.linear_2", bias=True)

    def velocity(
        self,
        tokens: list[int],
        latents: torch.Tensor,
        t: float,
        text_of: ReferenceMot | None = None,
    ) -> torch.Tensor:
        """One denoise step's predicted velocity [C, H, W] for latents conditioned on `tokens`
        (their text K/V recomputed here, from the tokens, by `text_of`'s weights: by default
        this model's, another's for text KV kept from other weights)."""
        _, text_kv = (text_of or self).text(tokens) if tokens else (None, None)
        x = self.linear(self.patches(latents), "image.patch_embed", bias=True)
        x = x + self.time_embedding(t)
        n, context = x.shape[0], len(tokens)
        positions = list(range(context, context + n))
        everything = torch.ones(n, context + n, dtype=torch.bool)
        for i in range(self.c["num_hidden_layers"]):
            q, k, v = self.qkv(i, x, positions)
            if text_kv is not None:
                k, v = torch.cat((text_kv[i][0], k)), torch.cat((text_kv[i][1], v))
            x = self.finish(i, x, self.attend(q, k, v, everything))
        out = self.linear(self.norm(x, "image.norm.weight"), "image.proj_out", bias=True)
        return self.image(out, tuple(latents.shape))
