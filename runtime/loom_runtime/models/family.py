"""The runtime half of a model family (its torch-free half is card/families.py's `Family`): how
its config is parsed, its model built and prepared, and its tiny checkpoint written.

Owns that contract and finding a family's half; never loads files itself (models/loader.py does).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loom_runtime.card.families import Family
from loom_runtime.models.causal_lm import CausalLM, DecoderConfig

ReadConfig = Callable[[Mapping[str, Any], Mapping[str, Any] | None, str], DecoderConfig]
"""(config.json, generation_config.json or None, where config.json is) -> the family's config;
CheckpointError says what is wrong."""
BuildModel = Callable[[Any, torch.dtype, "str | torch.device"], CausalLM]
"""(its config, dtype, device) -> an empty (zero-weight) model; `load_state` fills it."""


@dataclass(frozen=True)
class FamilyRuntime:
    """What the engine and the loader call for one family; a family the text engine does not
    serve (a diffusion family) leaves `read_config` and `build` unset."""

    read_config: ReadConfig | None = None
    build: BuildModel | None = None
    prepare: Callable[[CausalLM], None] | None = None
    """Run once a model is loaded, before its first request (e.g. load its CPU kernel)."""
    write_tiny: Callable[[Path, int], Path] | None = None
    """(directory, seed) -> writes its `loom://` tiny checkpoint there (card `Family.tiny`)."""
    tiny_marker: str = "config.json"
    """The file whose presence marks a complete tiny checkpoint."""


def runtime_of(family: Family) -> FamilyRuntime:
    """The family's runtime half: imported from its "module:attribute", or the object given."""
    half = family.runtime
    if isinstance(half, str):
        module, _, attribute = half.partition(":")
        half = getattr(importlib.import_module(module), attribute)
    if not isinstance(half, FamilyRuntime):
        raise TypeError(f"model family {family.name!r}: runtime is not a FamilyRuntime")
    return half
