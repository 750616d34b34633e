"""`loom://tiny-mot`: byte-identical on every run, loadable as the mot family, registered for the
CLI and model sources; a bad MoT config.json is refused with every problem at once."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
from safetensors import safe_open

from loom_runtime.card import families
from loom_runtime.errors import CheckpointError
from loom_runtime.models import tiny
from loom_runtime.models.loader import load_model
from loom_runtime.models.mot.config import MotConfig
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import init_tiny_mot, tiny_mot_config_dict
from loom_runtime.models.tiny_files import CHECKPOINT_FILES


def digests(root: Path) -> dict[str, str]:
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in CHECKPOINT_FILES}


def test_two_runs_write_identical_bytes_and_a_seed_changes_only_the_weights(tmp_path) -> None:
    one, two = init_tiny_mot(tmp_path / "one"), init_tiny_mot(tmp_path / "two")
    seeded = init_tiny_mot(tmp_path / "seeded", seed=4)
    assert digests(one) == digests(two)
    changed = {n for n, d in digests(seeded).items() if d != digests(one)[n]}
    assert changed == {"model.safetensors", "README.md"}


def test_the_tiny_checkpoint_loads_as_the_mot_family(tmp_path) -> None:
    root = init_tiny_mot(tmp_path / "tiny")
    with safe_open(str(root / "model.safetensors"), framework="pt") as f:
        count = sum(f.get_tensor(n).numel() for n in f.keys())  # noqa: SIM118 (not a dict)
        image = [n for n in f.keys() if n.startswith("image.")]  # noqa: SIM118
    loaded = load_model(root)
    assert isinstance(loaded.model, MotForCausalLM)
    assert loaded.config.num_parameters == count
    assert len(image) == 9
    assert loaded.tokenizer.vocab_size <= loaded.config.vocab_size
    assert float(loaded.model.image.out_norm.min()) == 1.0  # norm weights are ones
    assert loaded.model.image.patch_weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert "noise" in (root / "README.md").read_text()


def test_loom_tiny_mot_is_generated_on_first_use(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    assert families.family_of_model_type("loom_mot").name == "mot"
    path = tiny.resolve_source("loom://tiny-mot")
    assert path == tmp_path / "cache" / "models" / "tiny-mot"
    assert digests(path) == digests(init_tiny_mot(tmp_path / "again"))


def test_cli_writes_the_mot_checkpoint(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    tiny.add_parser(parser.add_subparsers(dest="model_command"))
    args = parser.parse_args(["init-tiny", str(tmp_path / "cli"), "--family", "mot"])
    assert args.run(args) == 0
    assert "tiny mot checkpoint tiny-mot" in capsys.readouterr().out
    assert (tmp_path / "cli" / "model.safetensors").is_file()


def test_a_bad_config_lists_every_problem() -> None:
    raw = tiny_mot_config_dict(100, 1, [2], hidden_act="gelu")
    raw["image"] = {"latent_channels": 0, "patch_size": 2, "frequency_dim": 33}
    with pytest.raises(CheckpointError) as caught:
        MotConfig.from_dict(raw)
    message = str(caught.value)
    for part in (
        "latent_channels must be a positive integer",
        "frequency_dim must be even",
        "gelu",
    ):
        assert part in message
    with pytest.raises(CheckpointError, match="image must be an object"):
        MotConfig.from_dict({**raw, "image": None})
    assert MotConfig.from_dict(tiny_mot_config_dict(100, 1, [2])).text.model_type == "llama"
