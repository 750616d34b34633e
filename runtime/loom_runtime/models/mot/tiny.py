"""`loom model init-tiny --family mot`: a deterministic tiny MoT checkpoint (`loom://tiny-mot`):
a llama text stack plus image heads, a real tokenizer, random weights from a fixed seed.

Writes random (nonsense- and noise-producing) weights; never downloads real weights.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loom_runtime.models.mot.config import MODEL_TYPE, MotConfig
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.tiny_files import random_weights, write_checkpoint
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer

logger = logging.getLogger(__name__)

INIT_STD = 0.02

README = """# Loom tiny MoT checkpoint (random weights)

Written by `loom model init-tiny --family mot` (seed {seed}): one llama-style transformer stack
(config.json's llama fields; its tensors carry Hugging Face llama names) that serves two loops:
causal text decoding over the paged KV cache, and flow-matching denoising of image latents
[{channels}, H, W] (patch {patch}) that attend to the request's text KV. The image heads are the
`image.*` tensors. Its ~{millions:.1f}M weights are **random numbers** from a fixed seed: it
writes **nonsense text** and denoises to **noise**. It exists so tests exercise both loops on
one set of weights on a CPU in seconds, with the same bytes on every machine.
"""


def tiny_mot_config_dict(
    vocab_size: int, bos_id: int, eos_ids: list[int], **overrides: Any
) -> dict[str, Any]:
    """config.json of the tiny MoT model (overrides replace top-level fields)."""
    raw: dict[str, Any] = {
        "architectures": ["LoomMotForCausalLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
        "image": {"latent_channels": 4, "patch_size": 2, "frequency_dim": 64},
    }
    raw.update(overrides)
    return raw


def write_mot_checkpoint(
    dir: Path, seed: int, std: float = INIT_STD, **overrides: Any
) -> tuple[Path, Mapping[str, Any]]:
    """Write a MoT checkpoint of the tiny config (with `overrides`) into `dir`; its config.json."""
    tiny = train_tiny_tokenizer()
    eos_ids = [tiny.im_end_id, tiny.end_of_text_id]
    raw = tiny_mot_config_dict(tiny.vocab_size, tiny.bos_id, eos_ids, **overrides)
    config = MotConfig.from_dict(raw)
    shapes = {
        name: tuple(t.shape) for name, t in MotForCausalLM(config, device="meta").targets().items()
    }
    readme = README.format(
        seed=seed,
        channels=config.latent_channels,
        patch=config.patch_size,
        millions=config.num_parameters / 1e6,
    )
    write_checkpoint(Path(dir), raw, random_weights(shapes, seed, std), tiny, eos_ids, readme)
    logger.info("wrote tiny MoT checkpoint", extra={"path": str(dir), "seed": seed})
    return Path(dir), raw


def init_tiny_mot(dir: Path, seed: int = 0) -> Path:
    """Write `loom://tiny-mot` into `dir` (created if needed); same bytes on every run."""
    return write_mot_checkpoint(dir, seed)[0]
