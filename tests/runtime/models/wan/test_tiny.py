"""`loom model init-tiny --family dit`: identical bytes on every run (and per seed), a complete
diffusers-format directory, the repo's tiny tokenizer."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from loom_runtime.models import tiny
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    tiny.add_parser(parser.add_subparsers(dest="model_command"))
    args = parser.parse_args(argv)
    return int(args.run(args))


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


EXPECTED_FILES = {
    "model_index.json",
    "README.md",
    "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors",
    "text_encoder/config.json",
    "text_encoder/model.safetensors",
    "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors",
    "scheduler/scheduler_config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
}


def test_cli_writes_identical_bytes_on_every_run(wan_dir: Path, tmp_path: Path, capsys) -> None:
    assert run_cli(["init-tiny", str(tmp_path / "a"), "--family", "dit"]) == 0
    assert "wan" in capsys.readouterr().out
    a = digests(tmp_path / "a")
    assert set(a) == EXPECTED_FILES
    assert a == digests(wan_dir)
    assert run_cli(["init-tiny", str(tmp_path / "b"), "--family", "dit", "--seed", "1"]) == 0
    b = digests(tmp_path / "b")
    weights = "transformer/diffusion_pytorch_model.safetensors"
    assert a[weights] != b[weights] and a["transformer/config.json"] == b["transformer/config.json"]


def test_the_tokenizer_is_the_repo_tiny_tokenizer(wan_dir: Path, tmp_path: Path) -> None:
    train_tiny_tokenizer().tokenizer.save(str(tmp_path / "tokenizer.json"), pretty=True)
    ours = (wan_dir / "tokenizer" / "tokenizer.json").read_bytes()
    assert ours == (tmp_path / "tokenizer.json").read_bytes()
