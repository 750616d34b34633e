"""Load a diffusers-format Wan directory (model_index.json + one folder per component) into
the DiT(s), the UMT5 text encoder, the VAE decoder and the tokenizer.

Reads files only and checks every tensor's name and shape first; never downloads or runs a forward.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.models.loader import checkpoint_dir, read_weights
from loom_runtime.models.wan.config import Umt5Config, WanConfig, WanDitConfig, WanVaeConfig
from loom_runtime.models.wan.dit import WanDiT
from loom_runtime.models.wan.text_encoder import EMBED_ALIAS, Umt5Encoder
from loom_runtime.models.wan.vae import WanVaeDecoder
from loom_runtime.models.wan.vae_layout import ENCODER_PREFIXES, encoder_shapes
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Tensors diffusers itself skips when loading a WanTransformer3DModel.
DIT_IGNORED = ("norm_added_q",)


@dataclass(frozen=True)
class ComponentTensors:
    """One component folder's tensors by name, and the file each came from."""

    folder: Path
    tensors: dict[str, torch.Tensor]
    files: dict[str, Path]


@dataclass(frozen=True)
class LoadedWan:
    """A Wan checkpoint ready to run: each component with its weights in place."""

    config: WanConfig
    transformer: WanDiT
    text_encoder: Umt5Encoder
    vae: WanVaeDecoder
    tokenizer: Tokenizer
    transformer_2: WanDiT | None = None


def load_wan(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedWan:
    """Build every component of model_index.json and fill it from its safetensors."""
    root = checkpoint_dir(path)
    config = WanConfig.from_dir(root)
    return LoadedWan(
        config=config,
        transformer=load_dit(root / "transformer", config.transformer, dtype, device),
        transformer_2=None
        if config.transformer_2 is None
        else load_dit(root / "transformer_2", config.transformer_2, dtype, device),
        text_encoder=load_text_encoder(root / "text_encoder", config.text_encoder, dtype, device),
        vae=load_vae(root / "vae", config.vae, dtype, device),
        tokenizer=Tokenizer.from_dir(root / "tokenizer"),
    )


def load_dit(
    folder: Path, config: WanDitConfig, dtype: torch.dtype, device: str | torch.device
) -> WanDiT:
    model = WanDiT(config, dtype, device)
    found = read_component(folder)
    wanted = {n: t for n, t in found.tensors.items() if not n.startswith(DIT_IGNORED)}
    check_fit(model.targets(), wanted, found)
    model.load_state(wanted)
    logger.info("loaded wan transformer", extra={"path": str(folder), "dtype": str(dtype)})
    return model


def load_text_encoder(
    folder: Path, config: Umt5Config, dtype: torch.dtype, device: str | torch.device
) -> Umt5Encoder:
    model = Umt5Encoder(config, dtype, device)
    found = read_component(folder)
    wanted = dict(found.tensors)
    alias = wanted.pop(EMBED_ALIAS, None)
    if alias is not None and "shared.weight" not in wanted:
        wanted["shared.weight"] = alias
        found.files["shared.weight"] = found.files[EMBED_ALIAS]
    check_fit(model.targets(), wanted, found)
    model.load_state(wanted)
    logger.info("loaded umt5 text encoder", extra={"path": str(folder), "dtype": str(dtype)})
    return model


def load_vae(
    folder: Path, config: WanVaeConfig, dtype: torch.dtype, device: str | torch.device
) -> WanVaeDecoder:
    """The decoder side is loaded; the encoder side is checked by name and shape, then dropped."""
    model = WanVaeDecoder(config, dtype, device)
    found = read_component(folder)
    encoder = {n: t for n, t in found.tensors.items() if n.startswith(ENCODER_PREFIXES)}
    decoder = {n: t for n, t in found.tensors.items() if n not in encoder}
    shapes = encoder_shapes(config)
    meta = {n: torch.empty(s, device="meta") for n, s in shapes.items()}
    check_fit(meta, encoder, found, require_all=False)  # Loom never runs the encoder
    check_fit(model.targets(), decoder, found)
    model.load_state(decoder)
    logger.info("loaded wan vae decoder", extra={"path": str(folder), "dtype": str(dtype)})
    return model


def read_component(folder: Path) -> ComponentTensors:
    """All tensors of one component folder: its *.safetensors.index.json shards, else its
    single *.safetensors file."""
    files = component_files(folder)
    tensors: dict[str, torch.Tensor] = {}
    sources: dict[str, Path] = {}
    for file in files:
        shard = read_weights(file)
        for name in shard:
            if name in sources:
                raise CheckpointError(f"{file}: tensor {name} also appears in {sources[name]}")
            sources[name] = file
        tensors.update(shard)
    return ComponentTensors(folder=folder, tensors=tensors, files=sources)


def component_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a directory: the component is missing")
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        names = ", ".join(p.name for p in indexes)
        raise CheckpointError(f"{folder}: more than one safetensors index ({names})")
    if indexes:
        return _shards(indexes[0])
    singles = sorted(folder.glob("*.safetensors"))
    if len(singles) != 1:
        found = ", ".join(p.name for p in singles) or "none"
        raise CheckpointError(
            f"{folder}: expected one .safetensors file or a .safetensors.index.json, found {found}"
        )
    return singles


def _shards(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{index}: not a safetensors index with a weight_map ({exc})"
        ) from exc
    absent = [name for name in names if not (index.parent / name).is_file()]
    if absent:
        raise CheckpointError(f"{index}: shard(s) missing from the folder: {', '.join(absent)}")
    return [index.parent / name for name in names]


def check_fit(
    targets: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    found: ComponentTensors,
    require_all: bool = True,
) -> None:
    """CheckpointError naming the file and tensor of every misfit: wrong shape, unknown, and
    (when `require_all`) missing."""
    problems = []
    for name in sorted(tensors):
        file = found.files[name].name
        if name not in targets:
            problems.append(f"{file}: unknown tensor {name}")
        elif tensors[name].shape != targets[name].shape:
            problems.append(
                f"{file}: {name} has shape {tuple(tensors[name].shape)}, "
                f"config.json implies {tuple(targets[name].shape)}"
            )
    missing = sorted(set(targets) - set(tensors)) if require_all else []
    problems.extend(f"missing tensor {name}" for name in missing)
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise CheckpointError(
            f"{found.folder}: weights do not fit its config.json: " + "; ".join(problems[:8]) + more
        )
