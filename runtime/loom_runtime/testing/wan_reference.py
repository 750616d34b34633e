"""diffusers' `WanPipeline` over a diffusers-format Wan directory (Loom's tiny one included), and
its prompt encoding from token ids: the reference of the C1 tests and the diffusion benchmark.

Owns building the reference pipeline (diffusers and transformers are test dependencies, imported
here only); never used by the runtime itself.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import torch

from loom_runtime.models.wan.tiny import DIFFUSERS_WEIGHTS

TOKENIZER = "tokenizer.json"


def wan_pipeline(wan_dir: Path, dtype: torch.dtype) -> Any:
    """A WanPipeline of the checkpoint's own folders in `dtype`, eager attention, no progress
    bar. diffusers' own loading warnings (of a checkpoint it did not write) are silenced."""
    # diffusers and transformers are untyped here: test dependencies, imported on use.
    diffusers: Any = importlib.import_module("diffusers")
    transformers: Any = importlib.import_module("transformers")
    from safetensors.torch import load_file

    before = diffusers.utils.logging.get_verbosity()
    diffusers.utils.logging.set_verbosity(logging.ERROR)
    try:
        folder = wan_dir / "transformer"
        dit = diffusers.WanTransformer3DModel.from_config(
            diffusers.WanTransformer3DModel.load_config(folder)
        )
        dit.load_state_dict(load_file(str(folder / DIFFUSERS_WEIGHTS)), strict=True)
        encoder = transformers.UMT5EncoderModel.from_pretrained(
            wan_dir / "text_encoder", attn_implementation="eager"
        )
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(wan_dir / "tokenizer" / TOKENIZER)
        )
        pipe = diffusers.WanPipeline(
            tokenizer=tokenizer,
            text_encoder=encoder.to(dtype).eval(),
            transformer=dit.to(dtype).eval(),
            vae=diffusers.AutoencoderKLWan.from_pretrained(wan_dir / "vae").to(dtype).eval(),
            scheduler=diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(
                wan_dir / "scheduler"
            ),
        )
    finally:
        diffusers.utils.logging.set_verbosity(before)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_embeds(pipe: Any, ids: tuple[int, ...], text_len: int) -> torch.Tensor:
    """What WanPipeline's own prompt encoding does, from token ids: encode with the mask, keep
    the prompt's rows, zero the rest. [1, text_len, d_model]."""
    row = torch.zeros(1, text_len, dtype=torch.long)
    mask = torch.zeros(1, text_len, dtype=torch.long)
    row[0, : len(ids)], mask[0, : len(ids)] = torch.tensor(ids), 1
    with torch.no_grad():
        hidden = pipe.text_encoder(row, mask).last_hidden_state
    out = torch.zeros_like(hidden)
    out[:, : len(ids)] = hidden[:, : len(ids)]
    return out
