"""WanConfig reads model_index.json and every component config of the tiny checkpoint, and says
clearly what is missing, unknown or unsupported, file by file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loom_runtime.errors import CheckpointError
from loom_runtime.models.wan.config import (
    FlowSchedulerConfig,
    Umt5Config,
    WanConfig,
    WanDitConfig,
    WanVaeConfig,
)
from loom_runtime.models.wan.tiny import transformer_config, vae_config


def test_the_tiny_checkpoint_parses(wan_dir: Path) -> None:
    config = WanConfig.from_dir(wan_dir)
    assert config.pipeline_class == "WanPipeline"
    assert config.transformer.patch_size == (1, 2, 2)
    assert config.transformer.rope_axes == (8, 4, 4)
    assert config.vae.temporal_upsample == (True, True, False)
    assert config.scheduler == FlowSchedulerConfig("FlowMatchEulerDiscreteScheduler", 1000, 3.0)
    assert config.text_encoder.d_model == config.transformer.text_dim


def test_diffusers_reads_the_same_dit_and_vae_config(wan_dir: Path) -> None:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    dit = WanTransformer3DModel.load_config(wan_dir / "transformer")
    assert tuple(dit["patch_size"]) == WanConfig.from_dir(wan_dir).transformer.patch_size
    vae = AutoencoderKLWan.load_config(wan_dir / "vae")
    assert vae["z_dim"] == WanConfig.from_dir(wan_dir).vae.z_dim


def test_missing_fields_are_all_listed() -> None:
    raw = transformer_config()
    for name in ("num_layers", "ffn_dim"):
        del raw[name]
    with pytest.raises(CheckpointError, match="num_layers is missing"):
        WanDitConfig.from_dict(raw, "x/config.json")
    with pytest.raises(CheckpointError) as info:
        WanDitConfig.from_dict(raw, "x/config.json")
    assert "x/config.json" in str(info.value) and "ffn_dim" in str(info.value)


@pytest.mark.parametrize(
    ("parse", "raw", "expected"),
    [
        (WanDitConfig.from_dict, {**transformer_config(), "image_dim": 1280}, "I2V"),
        (
            WanDitConfig.from_dict,
            {**transformer_config(), "window_size": [-1, -1]},
            "unknown field",
        ),
        (WanDitConfig.from_dict, {**transformer_config(), "num_layers": 0}, "num_layers must be"),
        (WanVaeConfig.from_dict, {**vae_config(), "patch_size": 2}, "scale_factor_spatial must"),
        (WanVaeConfig.from_dict, {**vae_config(), "latents_mean": [0.0]}, "latents_mean needs"),
        (WanVaeConfig.from_dict, {**vae_config(), "dim_mult": [1, 2]}, "temperal_downsample needs"),
        (Umt5Config.from_dict, {"model_type": "t5", "vocab_size": 8}, "umt5"),
        (
            FlowSchedulerConfig.from_dict,
            {"_class_name": "UniPCMultistepScheduler", "flow_shift": 5.0},
            "flow sigmas",
        ),
        (FlowSchedulerConfig.from_dict, {"_class_name": "DDIMScheduler"}, "DDIMScheduler"),
    ],
)
def test_unsupported_configs_are_refused_with_the_reason(
    parse: Any, raw: dict[str, Any], expected: str
) -> None:
    with pytest.raises(CheckpointError, match=expected):
        parse(raw, "component/config.json")


def test_unipc_on_flow_sigmas_is_read_with_its_shift() -> None:
    raw = {
        "_class_name": "UniPCMultistepScheduler",
        "flow_shift": 5.0,
        "use_flow_sigmas": True,
        "prediction_type": "flow_prediction",
    }
    assert FlowSchedulerConfig.from_dict(raw).flow_shift == 5.0


def test_components_that_do_not_fit_each_other_are_refused(wan_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "wan"
    shutil.copytree(wan_dir, root, ignore=shutil.ignore_patterns("*.safetensors"))
    raw = json.loads((root / "transformer" / "config.json").read_text())
    raw["text_dim"] = 48
    (root / "transformer" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="text_dim"):
        WanConfig.from_dir(root)


def test_a_missing_config_file_is_named(wan_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "wan"
    shutil.copytree(wan_dir, root, ignore=shutil.ignore_patterns("*.safetensors"))
    (root / "scheduler" / "scheduler_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"scheduler_config\.json is missing"):
        WanConfig.from_dir(root)
