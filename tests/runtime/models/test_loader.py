"""Checkpoint directories load whole or sharded, and broken ones fail with a CheckpointError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.models.loader import load_model, read_weights, weight_files


def test_sharded_checkpoint_loads_the_same_model_as_one_file(hf_checkpoint, paged) -> None:
    hf_model, sharded = hf_checkpoint("qwen2", max_shard_size="150KB")
    assert len(weight_files(sharded)) > 2
    assert (sharded / "model.safetensors.index.json").is_file()
    single = sharded.parent / "single"
    shutil.copytree(sharded, single)
    for file in weight_files(single):
        file.unlink()
    (single / "model.safetensors.index.json").unlink()
    from safetensors.torch import save_file

    save_file(read_weights(sharded), str(single / "model.safetensors"))

    weights = read_weights(sharded)
    assert set(weights) == {name for name, _ in hf_model.named_parameters()}
    a = paged(load_model(sharded).model).step([("s", [3, 1, 4, 1, 5])])["s"]
    b = paged(load_model(single).model).step([("s", [3, 1, 4, 1, 5])])["s"]
    assert torch.equal(a, b)


def test_missing_shard_is_named(hf_checkpoint) -> None:
    _, path = hf_checkpoint("llama", max_shard_size="150KB")
    victim = weight_files(path)[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        load_model(path)


def test_loaded_model_carries_config_and_tokenizer(hf_checkpoint) -> None:
    _, path = hf_checkpoint("qwen3", head_dim=32)
    loaded = load_model(path, dtype=torch.float64)
    assert loaded.config.model_type == "qwen3" and loaded.config.qk_norm
    assert loaded.model.dtype == torch.float64
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("round trip")) == "round trip"


@pytest.mark.parametrize("broken", ["no-config", "no-weights", "no-tokenizer", "bad-weights"])
def test_broken_checkpoints_raise_checkpoint_error(broken, hf_checkpoint) -> None:
    _, path = hf_checkpoint("llama")
    if broken == "no-config":
        (path / "config.json").unlink()
    elif broken == "no-weights":
        (path / "model.safetensors").unlink()
    elif broken == "no-tokenizer":
        (path / "tokenizer.json").unlink()
    else:
        (path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError):
        load_model(path)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(path / "nowhere")


def test_weights_that_do_not_fit_the_config_are_refused(hf_checkpoint) -> None:
    _, path = hf_checkpoint("llama")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 128
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"mlp\.gate_proj\.weight"):
        load_model(path)


def test_tokenizer_larger_than_vocab_is_refused(hf_checkpoint) -> None:
    _, path = hf_checkpoint("llama", vocab_size=4224)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = 1000
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tokenizer has"):
        load_model(path)


def test_shapes_only_loading_reads_no_weights(hf_checkpoint, tmp_path) -> None:
    """A parallel engine's own process: config, tokenizer and the model's shapes on the meta
    device, with no tensor file read (here: none is left to read)."""
    _, path = hf_checkpoint("llama")
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    for file in weight_files(bare):
        file.unlink()
    loaded = load_model(bare, dtype=torch.float64, weights=False)
    assert loaded.model.device.type == "meta" and loaded.model.dtype == torch.float64
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("no weights")) == "no weights"
    with pytest.raises(CheckpointError):
        load_model(bare)
