"""Typed views of a diffusers-format Wan checkpoint: model_index.json and each component's config.

Parses and validates once, collecting every problem per file; never touches weights or tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from loom_runtime.errors import CheckpointError
from loom_runtime.models.wan.config_fields import Fields, read_json

T = TypeVar("T")

MODEL_INDEX = "model_index.json"
DIT_CLASS = "WanTransformer3DModel"
VAE_CLASS = "AutoencoderKLWan"
TEXT_ENCODER_CLASS = "UMT5EncoderModel"
SCHEDULER_CLASSES = ("FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler")
REQUIRED_COMPONENTS = ("transformer", "text_encoder", "vae", "scheduler", "tokenizer")

_DIT_FIELDS = (
    "patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
    "text_dim", "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps",
    "image_dim", "added_kv_proj_dim", "rope_max_seq_len", "pos_embed_seq_len",
)  # fmt: skip
_VAE_FIELDS = (
    "base_dim", "decoder_base_dim", "z_dim", "dim_mult", "num_res_blocks", "attn_scales",
    "temperal_downsample", "dropout", "latents_mean", "latents_std", "is_residual",
    "in_channels", "out_channels", "patch_size", "scale_factor_temporal", "scale_factor_spatial",
)  # fmt: skip


@dataclass(frozen=True)
class WanDitConfig:
    """diffusers `WanTransformer3DModel` (text-to-video; no image conditioning)."""

    patch_size: tuple[int, int, int]  # (t, h, w) latent cells per token
    num_attention_heads: int
    attention_head_dim: int
    in_channels: int  # latent channels (the VAE's z_dim)
    out_channels: int
    text_dim: int  # the text encoder's d_model
    freq_dim: int  # sinusoidal timestep channels
    ffn_dim: int
    num_layers: int
    cross_attn_norm: bool = True  # an affine LayerNorm before cross-attention
    eps: float = 1e-6
    rope_max_seq_len: int = 1024  # rotary positions per axis

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def rope_axes(self) -> tuple[int, int, int]:
        """Head channels rotated by the (t, h, w) positions."""
        hw = 2 * (self.attention_head_dim // 6)
        return self.attention_head_dim - 2 * hw, hw, hw

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], where: str = "transformer/config.json"
    ) -> WanDitConfig:
        f = Fields(raw, where)
        f.reject_unknown(_DIT_FIELDS)
        f.expect("_class_name", [DIT_CLASS], DIT_CLASS, f"only {DIT_CLASS}")
        f.expect("image_dim", [None], None, "image conditioning (I2V) is not implemented")
        f.expect("added_kv_proj_dim", [None], None, "image conditioning (I2V) is not implemented")
        f.expect("pos_embed_seq_len", [None], None, "image conditioning (I2V) is not implemented")
        f.expect("qk_norm", ["rms_norm_across_heads"], "rms_norm_across_heads", "Wan's q/k norm")
        patch = f.ints("patch_size")
        f.check(len(patch) == 3 or not patch, f"patch_size must be [t, h, w], got {list(patch)}")
        config = cls(
            patch_size=(patch[0], patch[1], patch[2]) if len(patch) == 3 else (1, 1, 1),
            num_attention_heads=f.positive_int("num_attention_heads"),
            attention_head_dim=f.positive_int("attention_head_dim"),
            in_channels=f.positive_int("in_channels"),
            out_channels=f.positive_int("out_channels"),
            text_dim=f.positive_int("text_dim"),
            freq_dim=f.positive_int("freq_dim"),
            ffn_dim=f.positive_int("ffn_dim"),
            num_layers=f.positive_int("num_layers"),
            cross_attn_norm=f.flag("cross_attn_norm", True),
            eps=f.number("eps", 1e-6),
            rope_max_seq_len=f.positive_int("rope_max_seq_len", 1024),
        )
        f.check(config.attention_head_dim % 2 == 0, "attention_head_dim must be even (RoPE)")
        f.check(config.freq_dim % 2 == 0, "freq_dim must be even (sin and cos halves)")
        f.raise_if_any()
        return config


@dataclass(frozen=True)
class Umt5Config:
    """transformers `UMT5EncoderModel`: T5 encoder layers, each with its own position bias."""

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], where: str = "text_encoder/config.json"
    ) -> Umt5Config:
        f = Fields(raw, where)  # transformers configs carry many generic keys: no unknown check
        f.expect("model_type", ["umt5"], None, "the text encoder must be a umt5 encoder")
        f.expect("feed_forward_proj", ["gated-gelu"], "gated-gelu", "Wan's UMT5 is gated-gelu")
        f.expect("is_decoder", [False], False, "an encoder is needed")
        config = cls(
            vocab_size=f.positive_int("vocab_size"),
            d_model=f.positive_int("d_model"),
            d_kv=f.positive_int("d_kv"),
            d_ff=f.positive_int("d_ff"),
            num_layers=f.positive_int("num_layers"),
            num_heads=f.positive_int("num_heads"),
            relative_attention_num_buckets=f.positive_int("relative_attention_num_buckets", 32),
            relative_attention_max_distance=f.positive_int("relative_attention_max_distance", 128),
            layer_norm_epsilon=f.number("layer_norm_epsilon", 1e-6),
        )
        buckets = config.relative_attention_num_buckets
        f.check(buckets % 4 == 0, "relative_attention_num_buckets must be a multiple of 4")
        f.check(
            config.relative_attention_max_distance > buckets // 4,
            "relative_attention_max_distance must exceed relative_attention_num_buckets / 4",
        )
        f.raise_if_any()
        return config


@dataclass(frozen=True)
class WanVaeConfig:
    """diffusers `AutoencoderKLWan`: the Wan 2.1 layout, or Wan 2.2's (residual up blocks and
    2x2 pixel patches). The decoder is what Loom runs."""

    base_dim: int
    z_dim: int
    dim_mult: tuple[int, ...]
    num_res_blocks: int
    temperal_downsample: tuple[bool, ...]  # per encoder level (diffusers' spelling)
    latents_mean: tuple[float, ...]
    latents_std: tuple[float, ...]
    decoder_base_dim: int
    attn_scales: tuple[float, ...] = ()
    in_channels: int = 3
    out_channels: int = 3
    scale_factor_temporal: int = 4
    scale_factor_spatial: int = 8
    is_residual: bool = False  # Wan 2.2: up blocks add a duplicating shortcut, keep widths
    patch_size: int = 1  # Wan 2.2: decoded channels are p x p pixel patches

    @property
    def temporal_upsample(self) -> tuple[bool, ...]:
        """Per decoder level: whether that level doubles the frames."""
        return self.temperal_downsample[::-1]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "vae/config.json") -> WanVaeConfig:
        f = Fields(raw, where)
        f.reject_unknown(_VAE_FIELDS)
        f.expect("_class_name", [VAE_CLASS], VAE_CLASS, f"only {VAE_CLASS}")
        f.number("dropout", 0.0)
        patch = raw.get("patch_size")
        base = f.positive_int("base_dim")
        decoder_base = raw.get("decoder_base_dim")
        config = cls(
            base_dim=base,
            z_dim=f.positive_int("z_dim"),
            dim_mult=f.ints("dim_mult"),
            num_res_blocks=f.positive_int("num_res_blocks"),
            temperal_downsample=f.flags("temperal_downsample"),
            latents_mean=f.numbers("latents_mean"),
            latents_std=f.numbers("latents_std"),
            decoder_base_dim=base if decoder_base is None else f.positive_int("decoder_base_dim"),
            attn_scales=f.numbers("attn_scales", []),
            in_channels=f.positive_int("in_channels", 3),
            out_channels=f.positive_int("out_channels", 3),
            scale_factor_temporal=f.positive_int("scale_factor_temporal", 4),
            scale_factor_spatial=f.positive_int("scale_factor_spatial", 8),
            is_residual=f.flag("is_residual", False),
            patch_size=1 if patch is None else f.positive_int("patch_size"),
        )
        levels = len(config.dim_mult)
        f.check(levels >= 1, "dim_mult must name at least one level")
        f.check(
            len(config.temperal_downsample) == max(levels - 1, 0),
            f"temperal_downsample needs {levels - 1} entries (one per downsampling level)",
        )
        for name in ("latents_mean", "latents_std"):
            f.check(len(getattr(config, name)) == config.z_dim, f"{name} needs z_dim entries")
        f.check(
            config.scale_factor_spatial == 2 ** max(levels - 1, 0) * config.patch_size,
            "scale_factor_spatial must be 2 ** (len(dim_mult) - 1) * patch_size",
        )
        for name in ("in_channels", "out_channels"):
            f.check(
                getattr(config, name) % config.patch_size**2 == 0,
                f"{name} must hold whole patch_size x patch_size pixel patches",
            )
        f.check(
            config.scale_factor_temporal == 2 ** sum(config.temperal_downsample),
            "scale_factor_temporal must be 2 ** (number of temporal downsamples)",
        )
        f.raise_if_any()
        return config


@dataclass(frozen=True)
class FlowSchedulerConfig:
    """The flow-matching scheduler a Wan checkpoint ships (Euler or UniPC on flow sigmas)."""

    class_name: str
    num_train_timesteps: int
    flow_shift: float  # sigma' = shift * sigma / (1 + (shift - 1) * sigma)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], where: str = "scheduler/scheduler_config.json"
    ) -> FlowSchedulerConfig:
        f = Fields(raw, where)
        name = f.text("_class_name")
        f.check(name in SCHEDULER_CLASSES, f"_class_name {name!r} is not in {SCHEDULER_CLASSES}")
        for option in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"):
            f.expect(option, [False], False, "only plain flow sigmas are implemented")
        f.expect("use_dynamic_shifting", [False], False, "a fixed flow shift is implemented")
        if name == "UniPCMultistepScheduler":
            f.expect("use_flow_sigmas", [True], False, "Wan's UniPC runs on flow sigmas")
            f.expect("prediction_type", ["flow_prediction"], "epsilon", "Wan predicts flow")
            shift = f.number("flow_shift", 1.0)
        else:
            shift = f.number("shift", 1.0)
        f.check(shift > 0, f"the flow shift must be positive, got {shift}")
        config = cls(name, f.positive_int("num_train_timesteps", 1000), shift)
        f.raise_if_any()
        return config


@dataclass(frozen=True)
class WanConfig:
    """Everything a Wan checkpoint directory declares: its pipeline and each component's config."""

    root: Path
    pipeline_class: str
    transformer: WanDitConfig
    text_encoder: Umt5Config
    vae: WanVaeConfig
    scheduler: FlowSchedulerConfig
    transformer_2: WanDitConfig | None = None  # Wan 2.2 A14B: the low-noise expert
    boundary_ratio: float | None = None  # where transformer_2 takes over (fraction of T)

    @classmethod
    def from_dir(cls, path: str | Path) -> WanConfig:
        """Read model_index.json and each component config; CheckpointError at a bad file."""
        root = Path(path)
        index = read_json(root / MODEL_INDEX)
        f = Fields(index, str(root / MODEL_INDEX))
        for name in REQUIRED_COMPONENTS:
            entry = index.get(name)
            f.check(
                isinstance(entry, list) and len(entry) == 2,
                f"component {name!r} must be listed as [library, class]",
            )
        second = index.get("transformer_2")
        ratio = index.get("boundary_ratio")
        f.check(
            ratio is None or (isinstance(ratio, int | float) and 0 < ratio < 1),
            "boundary_ratio must be a number between 0 and 1",
        )
        f.check(
            (second is None or second == [None, None]) == (ratio is None),
            "transformer_2 and boundary_ratio come together (Wan 2.2 two-expert denoising)",
        )
        f.expect("expand_timesteps", [False], False, "per-token timesteps (Wan 2.2 TI2V)")
        f.raise_if_any()
        for name in REQUIRED_COMPONENTS:
            if not (root / name).is_dir():
                raise CheckpointError(
                    f"{root}: component {name!r} is listed in {MODEL_INDEX} but {root / name} "
                    "is not a directory"
                )
        config = cls(
            root=root,
            pipeline_class=str(index.get("_class_name", "")),
            transformer=_component(root / "transformer", "config.json", WanDitConfig.from_dict),
            text_encoder=_component(root / "text_encoder", "config.json", Umt5Config.from_dict),
            vae=_component(root / "vae", "config.json", WanVaeConfig.from_dict),
            scheduler=_component(
                root / "scheduler", "scheduler_config.json", FlowSchedulerConfig.from_dict
            ),
            transformer_2=None
            if second is None or second == [None, None]
            else _component(root / "transformer_2", "config.json", WanDitConfig.from_dict),
            boundary_ratio=None if ratio is None else float(ratio),
        )
        config.check_compatible()
        return config

    def check_compatible(self) -> None:
        """Components must fit each other: latent channels and text width."""
        problems = []
        dits = [self.transformer] + ([self.transformer_2] if self.transformer_2 else [])
        for dit in dits:
            if dit.in_channels != self.vae.z_dim or dit.out_channels != self.vae.z_dim:
                problems.append(
                    f"the transformer's in/out_channels ({dit.in_channels}/{dit.out_channels}) "
                    f"must equal the VAE's z_dim ({self.vae.z_dim})"
                )
            if dit.text_dim != self.text_encoder.d_model:
                problems.append(
                    f"the transformer's text_dim ({dit.text_dim}) must equal the text encoder's "
                    f"d_model ({self.text_encoder.d_model})"
                )
        if problems:
            raise CheckpointError(f"{self.root}: components do not fit: " + "; ".join(problems))


def _component(folder: Path, file: str, parse: Callable[[dict[str, Any], str], T]) -> T:
    path = folder / file
    return parse(read_json(path), str(path))
