"""`loom model init-tiny --family dit`: a deterministic tiny diffusers-format Wan checkpoint.

Writes random (noise-producing) weights from a fixed seed for every component; never downloads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from loom_runtime.models.tiny_tokenizer import tokenizer_config as tiny_tokenizer_config
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer
from loom_runtime.models.wan.config import Umt5Config, WanDitConfig, WanVaeConfig
from loom_runtime.models.wan.dit import WanDiT
from loom_runtime.models.wan.text_encoder import Umt5Encoder
from loom_runtime.models.wan.vae import WanVaeDecoder
from loom_runtime.models.wan.vae_layout import encoder_shapes

logger = logging.getLogger(__name__)

DIFFUSERS_VERSION = "0.42.1"
DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
NORM_SUFFIXES = ("gamma", "norm_q.weight", "norm_k.weight", "layer_norm.weight", "norm2.weight")

README = """# Loom tiny Wan checkpoint (random weights)

Written by `loom model init-tiny --family dit` (seed {seed}): a diffusers-format `WanPipeline`
directory (model_index.json; transformer/ = WanTransformer3DModel, text_encoder/ =
UMT5EncoderModel, vae/ = AutoencoderKLWan, scheduler/ = FlowMatchEulerDiscreteScheduler,
tokenizer/) whose weights are **random numbers** from a fixed seed. It generates **noise**,
not pictures; it exists so tests and benchmarks exercise the whole Wan family (video and
single-frame image latents) on a CPU in seconds, with the same bytes on every machine.

The tokenizer is Loom's tiny byte-level BPE ({vocab} tokens), not Wan's UMT5 tokenizer.
"""

LATENTS_MEAN = [-0.5, 0.25, 0.125, -0.25]
LATENTS_STD = [1.5, 0.75, 1.25, 2.0]


def transformer_config() -> dict[str, Any]:
    """2 blocks, 2 heads of 16 (rotary split 8 frame / 4 row / 4 column channels), patch 1x2x2."""
    return {
        "_class_name": "WanTransformer3DModel",
        "_diffusers_version": DIFFUSERS_VERSION,
        "added_kv_proj_dim": None,
        "attention_head_dim": 16,
        "cross_attn_norm": True,
        "eps": 1e-06,
        "ffn_dim": 64,
        "freq_dim": 32,
        "image_dim": None,
        "in_channels": 4,
        "num_attention_heads": 2,
        "num_layers": 2,
        "out_channels": 4,
        "patch_size": [1, 2, 2],
        "pos_embed_seq_len": None,
        "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": 1024,
        "text_dim": 32,
    }


def text_encoder_config(vocab_size: int, pad_id: int) -> dict[str, Any]:
    return {
        "architectures": ["UMT5EncoderModel"],
        "model_type": "umt5",
        "vocab_size": vocab_size,
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 64,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "dropout_rate": 0.0,
        "layer_norm_epsilon": 1e-06,
        "initializer_factor": 1.0,
        "feed_forward_proj": "gated-gelu",
        "is_encoder_decoder": True,
        "use_cache": False,
        "pad_token_id": pad_id,
        "eos_token_id": pad_id,
        "decoder_start_token_id": pad_id,
    }


def vae_config() -> dict[str, Any]:
    """Wan 2.1 layout (4 levels, x8 space, x4 time) at base width 8 and z_dim 4."""
    return {
        "_class_name": "AutoencoderKLWan",
        "_diffusers_version": DIFFUSERS_VERSION,
        "attn_scales": [],
        "base_dim": 8,
        "decoder_base_dim": None,
        "dim_mult": [1, 2, 4, 4],
        "dropout": 0.0,
        "in_channels": 3,
        "is_residual": False,
        "latents_mean": LATENTS_MEAN,
        "latents_std": LATENTS_STD,
        "num_res_blocks": 1,
        "out_channels": 3,
        "patch_size": None,
        "scale_factor_spatial": 8,
        "scale_factor_temporal": 4,
        "temperal_downsample": [False, True, True],
        "z_dim": 4,
    }


def scheduler_config() -> dict[str, Any]:
    return {
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": DIFFUSERS_VERSION,
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "use_dynamic_shifting": False,
    }


def model_index() -> dict[str, Any]:
    return {
        "_class_name": "WanPipeline",
        "_diffusers_version": DIFFUSERS_VERSION,
        "boundary_ratio": None,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }


def random_tensors(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Fan-in scaled normals, norm scales around 1, small biases; sorted-name order, one generator.

    Every tensor is non-trivial, so a parity test sees each weight's effect.
    """
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        noise = torch.randn(shape, generator=generator)
        if name.endswith(NORM_SUFFIXES):
            out[name] = 1.0 + 0.1 * noise
        elif name.endswith("scale_shift_table"):
            out[name] = noise / shape[-1] ** 0.5
        elif len(shape) == 1:
            out[name] = 0.1 * noise
        else:
            out[name] = noise / (noise[0].numel() ** 0.5)
    return out


def init_tiny_wan(dir: Path, seed: int = 0) -> Path:
    """Write the tiny Wan checkpoint into `dir` (created if needed); same bytes on every run."""
    root = Path(dir)
    tiny = train_tiny_tokenizer()
    dit_raw = transformer_config()
    text_raw = text_encoder_config(tiny.vocab_size, tiny.end_of_text_id)
    vae_raw = vae_config()
    dit = WanDiT(WanDitConfig.from_dict(dit_raw))
    text = Umt5Encoder(Umt5Config.from_dict(text_raw))
    vae_cfg = WanVaeConfig.from_dict(vae_raw)
    vae_shapes = {n: tuple(t.shape) for n, t in WanVaeDecoder(vae_cfg).targets().items()}
    vae_shapes.update(encoder_shapes(vae_cfg))
    components: list[tuple[str, str, dict[str, Any], Mapping[str, tuple[int, ...]]]] = [
        ("transformer", DIFFUSERS_WEIGHTS, dit_raw, _shapes(dit.targets())),
        ("text_encoder", "model.safetensors", text_raw, _shapes(text.targets())),
        ("vae", DIFFUSERS_WEIGHTS, vae_raw, vae_shapes),
    ]
    for offset, (name, weights_file, raw, shapes) in enumerate(components):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / "config.json", raw)
        tensors = random_tensors(shapes, seed * 1000 + offset)
        save_file(tensors, str(folder / weights_file), {"format": "pt"})
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    _write_json(root / "scheduler" / "scheduler_config.json", scheduler_config())
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    tiny.tokenizer.save(str(root / "tokenizer" / "tokenizer.json"), pretty=True)
    _write_json(root / "tokenizer" / "tokenizer_config.json", tiny_tokenizer_config())
    _write_json(root / "model_index.json", model_index())
    (root / "README.md").write_text(README.format(seed=seed, vocab=tiny.vocab_size), "utf-8")
    logger.info("wrote tiny wan checkpoint", extra={"path": str(root), "seed": seed})
    return root


def _shapes(targets: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in targets.items()}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", "utf-8")
