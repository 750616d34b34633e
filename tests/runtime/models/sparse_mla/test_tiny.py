"""`loom model init-tiny --family sparse-mla`: identical bytes on every run, the family's config
format (both indexer layer types, top-k below a test context, MoE, MTP), the tiny tokenizer."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from safetensors import safe_open

from loom_runtime.models import tiny
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.tiny_files import CHECKPOINT_FILES as FILES


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    tiny.add_parser(parser.add_subparsers(dest="model_command"))
    args = parser.parse_args(argv)
    return int(args.run(args))


def digests(root: Path) -> dict[str, str]:
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in FILES}


def test_cli_writes_identical_bytes_on_every_run(sparse_dir: Path, tmp_path: Path, capsys) -> None:
    assert run_cli(["init-tiny", str(tmp_path / "a"), "--family", "sparse-mla"]) == 0
    assert "sparse-mla" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(FILES)
    assert digests(tmp_path / "a") == digests(sparse_dir)
    assert run_cli(["init-tiny", str(tmp_path / "b"), "--family", "sparse-mla", "--seed", "1"]) == 0
    a, b = digests(tmp_path / "a"), digests(tmp_path / "b")
    assert a["model.safetensors"] != b["model.safetensors"] and a["config.json"] == b["config.json"]


def test_the_checkpoint_covers_every_part_of_the_family(sparse_dir: Path) -> None:
    raw = json.loads((sparse_dir / "config.json").read_text())
    assert raw["model_type"] == "glm_moe_dsa"
    assert raw["architectures"] == ["GlmMoeDsaForCausalLM"]
    config = SparseMlaConfig.from_dir(sparse_dir)
    assert set(config.indexer_types) == {"full", "shared"}
    assert set(config.mlp_layer_types) == {"dense", "sparse"}
    assert config.index_topk < 300 and config.num_experts_per_tok < config.n_routed_experts
    assert config.n_group > 1 and config.num_nextn_predict_layers == 1
    with safe_open(str(sparse_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    mtp = f"model.layers.{config.num_hidden_layers}"
    assert {f"{mtp}.eh_proj.weight", f"{mtp}.self_attn.indexer.wk.weight"} <= names


def test_transformers_reads_the_config_the_same_way(sparse_dir: Path) -> None:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(sparse_dir)
    ours = SparseMlaConfig.from_dir(sparse_dir)
    assert type(hf).__name__ == "GlmMoeDsaConfig"
    assert tuple(hf.indexer_types) == ours.indexer_types
    assert tuple(hf.mlp_layer_types) == ours.mlp_layer_types
    assert hf.qk_head_dim == ours.qk_head_dim
