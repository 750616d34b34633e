"""Fixtures for the wan tests: the tiny checkpoint, our float64 components loaded from it, and the
diffusers / transformers references read from the very same directory (float64 parameters)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import DIFFUSERS_WEIGHTS, init_tiny_wan


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_wan(tmp_path_factory.mktemp("wan") / "tiny")


@pytest.fixture(scope="session")
def ours(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir, dtype=torch.float64)


@pytest.fixture(scope="session")
def quiet_hf() -> Iterator[None]:
    from diffusers.utils import logging as diffusers_logging

    before = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity(logging.ERROR)
    yield
    diffusers_logging.set_verbosity(before)


@pytest.fixture(scope="session")
def reference_dit(wan_dir: Path, quiet_hf: None) -> Any:
    """diffusers' WanTransformer3DModel from transformer/ (config.json + its safetensors).

    Built from the folder's config and filled with load_state_dict(strict=True) rather than
    from_pretrained: from_pretrained insists on `accelerate` for this class (it keeps some
    modules in float32), which Loom does not install. strict=True still proves the file
    holds exactly the tensors diffusers expects.
    """
    from diffusers import WanTransformer3DModel

    folder = wan_dir / "transformer"
    model = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(folder))
    model.load_state_dict(load_file(str(folder / DIFFUSERS_WEIGHTS)), strict=True)
    return model.to(torch.float64).eval()


@pytest.fixture(scope="session")
def ours_bf16(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir, dtype=torch.bfloat16)


@pytest.fixture(scope="session")
def reference_dit_bf16(wan_dir: Path, quiet_hf: None) -> Any:
    """The reference in bfloat16 as from_pretrained(torch_dtype=bfloat16) would make it: the
    parameters of the class's _keep_in_fp32_modules stay float32 (time MLP, tables, norms)."""
    from diffusers import WanTransformer3DModel

    folder = wan_dir / "transformer"
    model = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(folder))
    model.load_state_dict(load_file(str(folder / DIFFUSERS_WEIGHTS)), strict=True)
    keep = set(WanTransformer3DModel._keep_in_fp32_modules)
    with torch.no_grad():
        for name, param in model.named_parameters():
            wide = keep & set(name.split("."))
            param.data = param.data.to(torch.float32 if wide else torch.bfloat16)
    return model.eval()


@pytest.fixture(scope="session")
def reference_text_encoder(wan_dir: Path) -> Any:
    """transformers' UMT5EncoderModel.from_pretrained(text_encoder/), eager attention."""
    from transformers import UMT5EncoderModel

    model = UMT5EncoderModel.from_pretrained(wan_dir / "text_encoder", attn_implementation="eager")
    return model.to(torch.float64).eval()


@pytest.fixture(scope="session")
def reference_vae(wan_dir: Path, quiet_hf: None) -> Any:
    """diffusers' AutoencoderKLWan.from_pretrained(vae/)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan.from_pretrained(wan_dir / "vae").to(torch.float64).eval()


@pytest.fixture(scope="session")
def reference_text_encoder_bf16(wan_dir: Path) -> Any:
    from transformers import UMT5EncoderModel

    return UMT5EncoderModel.from_pretrained(
        wan_dir / "text_encoder", dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="session")
def reference_vae_bf16(wan_dir: Path, quiet_hf: None) -> Any:
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan.from_pretrained(wan_dir / "vae", torch_dtype=torch.bfloat16).eval()
