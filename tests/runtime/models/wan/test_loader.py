"""load_wan reads every component of a diffusers-format directory, sharded or not, and a
checkpoint that does not fit fails with a CheckpointError naming the file and the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loom_runtime.errors import CheckpointError
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import DIFFUSERS_WEIGHTS


@pytest.fixture
def copy_of(wan_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "wan"
    shutil.copytree(wan_dir, target)
    return target


def edit_tensors(file: Path, edit) -> None:
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), {"format": "pt"})


def test_every_component_is_loaded_with_the_checkpoint_values(
    ours: LoadedWan, wan_dir: Path
) -> None:
    files = {
        "transformer": (ours.transformer, DIFFUSERS_WEIGHTS),
        "text_encoder": (ours.text_encoder, "model.safetensors"),
        "vae": (ours.vae, DIFFUSERS_WEIGHTS),
    }
    for folder, (model, name) in files.items():
        stored = load_file(str(wan_dir / folder / name))
        for tensor_name, target in model.targets().items():
            assert torch.equal(target, stored[tensor_name].to(target.dtype)), tensor_name
    assert ours.tokenizer.vocab_size <= ours.config.text_encoder.vocab_size
    assert ours.transformer_2 is None and ours.config.scheduler.flow_shift == 3.0


def test_a_sharded_component_loads_the_same(copy_of: Path, ours: LoadedWan) -> None:
    folder = copy_of / "transformer"
    tensors = load_file(str(folder / DIFFUSERS_WEIGHTS))
    names = sorted(tensors)
    halves = {
        "part-1.safetensors": names[: len(names) // 2],
        "part-2.safetensors": names[len(names) // 2 :],
    }
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(folder / file), {"format": "pt"})
    (folder / DIFFUSERS_WEIGHTS).unlink()
    weight_map = {n: file for file, part in halves.items() for n in part}
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / f"{DIFFUSERS_WEIGHTS}.index.json").write_text(json.dumps(index))
    loaded = load_wan(copy_of, dtype=torch.float64)
    for name, tensor in loaded.transformer.targets().items():
        assert torch.equal(tensor, ours.transformer.targets()[name])


def test_a_missing_component_names_it(copy_of: Path) -> None:
    shutil.rmtree(copy_of / "vae")
    with pytest.raises(CheckpointError, match=r"'vae'.*not a directory"):
        load_wan(copy_of)


def test_a_wrong_shape_names_the_file_and_the_tensor(copy_of: Path) -> None:
    name = "blocks.1.attn2.to_k.weight"
    edit_tensors(
        copy_of / "transformer" / DIFFUSERS_WEIGHTS, lambda t: t.update({name: torch.zeros(3, 3)})
    )
    with pytest.raises(CheckpointError) as info:
        load_wan(copy_of)
    message = str(info.value)
    assert f"{DIFFUSERS_WEIGHTS}: {name} has shape (3, 3)" in message
    assert "(32, 32)" in message and "transformer" in message


def test_a_missing_tensor_is_named(copy_of: Path) -> None:
    name = "encoder.block.0.layer.1.DenseReluDense.wo.weight"
    edit_tensors(copy_of / "text_encoder" / "model.safetensors", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=f"text_encoder.*missing tensor {name}"):
        load_wan(copy_of)


def test_an_unknown_tensor_is_named_even_on_the_encoder_side(copy_of: Path) -> None:
    name = "encoder.down_blocks.99.conv1.weight"
    edit_tensors(copy_of / "vae" / DIFFUSERS_WEIGHTS, lambda t: t.update({name: torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=f"{DIFFUSERS_WEIGHTS}: unknown tensor {name}"):
        load_wan(copy_of)


def test_a_wrong_encoder_shape_is_caught_though_the_encoder_never_runs(copy_of: Path) -> None:
    name = "encoder.conv_in.weight"
    edit_tensors(copy_of / "vae" / DIFFUSERS_WEIGHTS, lambda t: t.update({name: torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=f"{name} has shape"):
        load_wan(copy_of)


def test_no_weights_file_names_the_folder(copy_of: Path) -> None:
    (copy_of / "vae" / DIFFUSERS_WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match=r"vae: expected one \.safetensors file"):
        load_wan(copy_of)


def test_the_tied_embedding_may_come_under_its_encoder_name(copy_of: Path, ours: LoadedWan) -> None:
    file = copy_of / "text_encoder" / "model.safetensors"
    edit_tensors(file, lambda t: t.update({"encoder.embed_tokens.weight": t.pop("shared.weight")}))
    loaded = load_wan(copy_of, dtype=torch.float64)
    assert torch.equal(loaded.text_encoder.embed, ours.text_encoder.embed)


def test_a_second_expert_is_loaded_from_transformer_2(copy_of: Path) -> None:
    """Wan 2.2 A14B: model_index names transformer_2 and the boundary_ratio where it takes over."""
    shutil.copytree(copy_of / "transformer", copy_of / "transformer_2")
    file = copy_of / "transformer_2" / DIFFUSERS_WEIGHTS
    edit_tensors(file, lambda t: t.update({"proj_out.bias": t["proj_out.bias"] + 1.0}))
    index = json.loads((copy_of / "model_index.json").read_text())
    index.update(transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=0.875)
    (copy_of / "model_index.json").write_text(json.dumps(index))
    loaded = load_wan(copy_of)
    assert loaded.config.boundary_ratio == 0.875 and loaded.transformer_2 is not None
    delta = loaded.transformer_2.proj_out.bias - loaded.transformer.proj_out.bias
    assert loaded.transformer.proj_out.bias is not None and torch.allclose(delta, torch.ones(16))
    index["boundary_ratio"] = None
    (copy_of / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="boundary_ratio come together"):
        load_wan(copy_of)
