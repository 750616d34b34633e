"""A worker's ModelInstance: a component that two loops of the card list is loaded once and both
loops run that one live object (its weights resident once); separate components stay separate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.card import Component, ModelCard
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.loader import LoadedModel, read_weights
from loom_runtime.models.mot.denoise_batch import DenoiseBatch, DenoiseRequest
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import init_tiny_mot
from loom_runtime.serve.model_instance import LoadComponent, checkpoint_loader, instantiate


@pytest.fixture(scope="module")
def mot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_mot(tmp_path_factory.mktemp("instance") / "tiny-mot")


def mot_card(uri: str, generate: list[str], draw: list[str], names: list[str]) -> ModelCard:
    component: dict[str, Any] = {
        "kind": "transformer",
        "source": {"uri": uri},
        "precision": {"weights": "fp32", "kv": "fp32"},
    }
    return ModelCard.model_validate(
        {
            "apiVersion": "loom.dev/v1alpha1",
            "kind": "ModelCard",
            "metadata": {"name": "tiny-mot"},
            "spec": {
                "family": "mot",
                "components": [{"name": n, **component} for n in names],
                "loops": [
                    {"name": "generate", "kind": "ar_decode", "components": generate},
                    {"name": "draw", "kind": "diffusion", "components": draw, "steps": 4},
                ],
                "recipe": {"method": "base", "assumesLoop": "generate", "assumesPrecision": "fp32"},
            },
        }
    )


def counting(load: LoadComponent, calls: list[str]) -> LoadComponent:
    def counted(component: Component) -> LoadedModel:
        calls.append(component.name)
        return load(component)

    return counted


def one_copy_bytes(path: Path) -> int:
    return sum(t.numel() * 4 for t in read_weights(path).values())  # float32


def velocity(model: MotForCausalLM) -> torch.Tensor:
    kv = PagedKVCache(model.config.kv_spec(4, 2, model.dtype))
    latents = torch.randn(4, 4, 4, generator=torch.Generator().manual_seed(0))
    return model.denoise(DenoiseBatch((DenoiseRequest(latents, 0.5, 0, []),)), kv)[0]


def test_two_loops_on_one_component_run_one_live_instance(mot_dir: Path) -> None:
    card = mot_card(f"file://{mot_dir}", ["mot"], ["mot"], ["mot"])
    assert card.shared_components() == {"mot": ("generate", "draw")}
    calls: list[str] = []
    instance = instantiate(card, counting(checkpoint_loader(None), calls))
    assert calls == ["mot"]
    text, image = instance.for_loop("generate")["mot"], instance.for_loop("draw")["mot"]
    assert text is image
    assert instance.resident_parameter_bytes() == one_copy_bytes(mot_dir)
    # a weight load through the text loop's handle is what the image loop runs next
    model = image.model
    assert isinstance(model, MotForCausalLM)
    before = velocity(model)
    name = "model.layers.0.self_attn.v_proj.weight"
    text.model.load_state({name: read_weights(mot_dir)[name] * 2}, strict=False)
    assert (velocity(model) - before).abs().max().item() > 1e-4


def test_separate_components_are_separate_copies_even_of_one_checkpoint(mot_dir: Path) -> None:
    card = mot_card(f"file://{mot_dir}", ["writer"], ["painter"], ["writer", "painter"])
    assert card.shared_components() == {}
    calls: list[str] = []
    instance = instantiate(card, counting(checkpoint_loader(None), calls))
    assert calls == ["writer", "painter"]
    assert instance.for_loop("generate")["writer"] is not instance.for_loop("draw")["painter"]
    assert instance.resident_parameter_bytes() == 2 * one_copy_bytes(mot_dir)


def test_an_unknown_loop_is_refused_with_the_loops_there_are(mot_dir: Path) -> None:
    instance = instantiate(
        mot_card(f"file://{mot_dir}", ["mot"], ["mot"], ["mot"]), checkpoint_loader(None)
    )
    with pytest.raises(KeyError, match="loops: generate, draw"):
        instance.for_loop("edit")
