"""`loom model init-tiny`: byte-identical, in the size range, loadable by us and by transformers."""

from __future__ import annotations

import argparse
import hashlib
import logging
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from loom_runtime.errors import CheckpointError
from loom_runtime.models import tiny
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny_files import CHECKPOINT_FILES as FILES


def digests(root: Path) -> dict[str, str]:
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in FILES}


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    tiny.add_parser(parser.add_subparsers(dest="model_command"))
    args = parser.parse_args(argv)
    return int(args.run(args))


def test_two_runs_write_identical_bytes(tiny_dir: Path, tmp_path: Path) -> None:
    again = tiny.init_tiny(tmp_path / "again")
    assert sorted(p.name for p in again.iterdir()) == sorted(FILES)
    assert digests(again) == digests(tiny_dir)


def test_cli_seed_changes_only_the_weights(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    assert run_cli(["init-tiny", str(tmp_path / "seeded"), "--seed", "7"]) == 0
    assert "nonsense" in capsys.readouterr().out
    a, b = digests(tiny_dir), digests(tmp_path / "seeded")
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer.json"] == b["tokenizer.json"] and a["config.json"] == b["config.json"]


def test_size_and_readme(tiny_dir: Path) -> None:
    with safe_open(str(tiny_dir / "model.safetensors"), framework="pt") as f:
        count = sum(f.get_tensor(name).numel() for name in f.keys())  # noqa: SIM118 (safe_open is no dict)
    assert 10_000_000 <= count <= 30_000_000
    loaded = load_model(tiny_dir)
    assert loaded.config.num_parameters == count
    assert loaded.config.vocab_size == loaded.tokenizer.vocab_size
    readme = (tiny_dir / "README.md").read_text()
    assert "nonsense" in readme and "file://" in readme


def test_transformers_reads_the_tiny_checkpoint_with_equal_logits(tiny_dir, paged) -> None:
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(str(tiny_dir)).eval()
    loaded = load_model(tiny_dir)
    ids = loaded.tokenizer.encode("The river and the mill")
    ours = paged(loaded.model, block_size=16).step([("s", ids)])["s"]
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-4


def test_resolve_source_generates_tiny_once(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="loom_runtime.models.tiny"):
        path = tiny.resolve_source("loom://tiny")
    assert path == tmp_path / "cache" / "models" / "tiny"
    assert (path / "config.json").is_file()
    assert any("generating" in r.message for r in caplog.records)
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]  # no staging dir left behind
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    caplog.clear()
    assert tiny.resolve_source("loom://tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not caplog.records


@pytest.mark.parametrize(
    ("name", "marks"),
    [("tiny-wan", ("model_index.json", "transformer")), ("tiny-sparse-mla", ("config.json",))],
)
def test_resolve_source_generates_the_other_builtin_checkpoints(
    tmp_path, monkeypatch, name: str, marks: tuple[str, ...]
) -> None:
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    path = tiny.resolve_source(f"loom://{name}")
    assert path == tmp_path / "cache" / "models" / name
    assert all((path / mark).exists() for mark in marks)
    assert [p.name for p in path.parent.iterdir()] == [name]
    assert tiny.resolve_source(f"loom://{name}") == path


def test_a_pvc_source_resolves_inside_its_mounted_claim(tmp_path: Path) -> None:
    (tmp_path / "store" / "tiny" / "v2").mkdir(parents=True)
    path = tiny.resolve_source("pvc://store/tiny/v2", pvc_root=tmp_path)
    assert path == tmp_path / "store" / "tiny" / "v2"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("pvc://other/v1", "claim 'other' is not mounted at"),  # a LoadWeights to another claim
        ("pvc://store/v3", "no checkpoint directory"),
        ("pvc://store/../x", "stays inside its claim"),
    ],
)
def test_a_pvc_source_outside_the_mounted_claim_is_refused_with_where(
    tmp_path: Path, uri: str, words: str
) -> None:
    (tmp_path / "store" / "v1").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=words):
        tiny.resolve_source(uri, pvc_root=tmp_path)


def test_resolve_source_paths_and_refusals() -> None:
    assert tiny.resolve_source("file:///models/qwen") == Path("/models/qwen")
    assert tiny.resolve_source("file:rel/qwen") == Path("rel/qwen")
    assert tiny.resolve_source("/models/qwen") == Path("/models/qwen")
    assert tiny.resolve_source("relative/dir") == Path("relative/dir")
    for uri in ("hf://Qwen/Qwen3-0.6B", "s3://bucket/model", "loom://huge"):
        with pytest.raises(CheckpointError, match="file://"):
            tiny.resolve_source(uri)
