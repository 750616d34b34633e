"""ModelInstance: the components of a ModelCard as one worker holds them: each component loaded
once, and every loop that lists it (card `loops[].components`) handed that same live object.

Owns which component each loop runs and loading each once; never runs a loop or a forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import torch

from loom_runtime.card import Component, ModelCard
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.resident import resident_bytes
from loom_runtime.serve.sources import checkpoint_path

LoadComponent = Callable[[Component], LoadedModel]
"""A card component -> its loaded model (called once per component)."""


@runtime_checkable
class NamedWeights(Protocol):
    """A model whose weights can be listed by checkpoint name (every built-in text family)."""

    def targets(self) -> Mapping[str, torch.Tensor]: ...


@dataclass(frozen=True)
class ModelInstance:
    """Loaded components by name, and the components each loop runs, by loop name."""

    components: Mapping[str, LoadedModel]
    loops: Mapping[str, tuple[str, ...]]

    def for_loop(self, loop: str) -> dict[str, LoadedModel]:
        """The live components loop `loop` runs, by name (KeyError naming the card's loops)."""
        if loop not in self.loops:
            raise KeyError(f"no loop {loop!r} in this instance (loops: {', '.join(self.loops)})")
        return {name: self.components[name] for name in self.loops[loop]}

    def resident_parameter_bytes(self) -> int:
        """Bytes the weights of every component hold, each storage once."""
        return weights_bytes({name: c.model for name, c in self.components.items()})


def weights_bytes(models: Mapping[str, object]) -> int:
    """Bytes the weights of `models` (by a name for errors) hold together, each storage once:
    models that share weights count them once, separate copies count each."""
    tensors: list[torch.Tensor] = []
    for name, model in models.items():
        if not isinstance(model, NamedWeights):
            raise TypeError(f"{name!r}: its model does not list its weights")
        tensors.extend(model.targets().values())
    return resident_bytes(tensors)


def instantiate(card: ModelCard, load: LoadComponent) -> ModelInstance:
    """Load every component a loop lists, once, in loop order; each loop gets those objects."""
    loaded: dict[str, LoadedModel] = {}
    for loop in card.spec.loops:
        for name in loop.components:
            if name not in loaded:
                loaded[name] = load(card.component(name))
    loops = {loop.name: tuple(loop.components) for loop in card.spec.loops}
    return ModelInstance(MappingProxyType(loaded), MappingProxyType(loops))


def checkpoint_loader(
    card_path: str | Path | None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LoadComponent:
    """Load a component from its source (a path, file:, loom://, pvc://) like the worker does."""

    def load(component: Component) -> LoadedModel:
        return load_model(checkpoint_path(component.source.uri, card_path), dtype, device)

    return load
