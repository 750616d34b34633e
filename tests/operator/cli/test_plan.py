"""`loom plan` prints the reference capacity figures for the GLM-5-class example, as a table and
as JSON, and refuses bad input with a message instead of a traceback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loom_operator.cli import main, plan

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "glm-5-class.yaml"

GQA_CARDS = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata: {name: small-llama}
spec:
  family: llama
  components:
    - {name: decoder, kind: transformer, source: {uri: "loom://tiny"}, precision: {kv: bf16}}
  architecture:
    numLayers: 32
    hiddenSize: 4096
    numAttentionHeads: 32
    numKeyValueHeads: 8
    headDim: 128
    attention: {kind: gqa}
  loops: [{name: generate, kind: ar_decode, components: [decoder]}]
  recipe: {method: base, assumesLoop: generate, assumesPrecision: bf16}
---
apiVersion: loom.dev/v1alpha1
kind: DeploymentCard
metadata: {name: small-llama}
spec:
  modelCard: small-llama
  roles:
    aggregated: {parallelism: {tp: 4}}
"""


def run_plan(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="loom")
    plan.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", *argv])
    code: int = args.run(args)
    return code


def test_plan_prints_the_four_reference_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan(str(EXAMPLE)) == 0
    out = capsys.readouterr().out
    assert "54,728 B/token" in out
    assert "53.4 GiB" in out
    assert "6.7 GiB" in out  # prefill: PCP 8 × DCP 8
    tp8 = next(line for line in out.splitlines() if "TP8" in line and "PCP8" not in line)
    pcp8 = next(line for line in out.splitlines() if "PCP8" in line)
    assert " 26 " in tp8
    assert " 191 " in pcp8
    assert "= 206 FLOP/B" in out


def test_plan_json_carries_the_reference_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan(str(EXAMPLE), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 54_728
    assert data["context"] == 1_048_576
    assert round(data["kv_gib"], 1) == 53.4
    roles = {r["role"]["name"]: r for r in data["roles"]}
    assert roles["prefill"]["kv_bytes_per_rank"] == 131_072 * 54_728
    assert round(roles["prefill"]["kv_gib_per_rank"], 1) == 6.7
    assert round(data["comparison"]["tp"]["flops_per_byte"]) == 26
    assert round(data["comparison"]["pcp"]["flops_per_byte"]) == 191


def test_plan_role_context_and_budget_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--role", "prefill", "--context", "262144", "--kv-budget-gib", "2", "--json")
    assert run_plan(str(EXAMPLE), *args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["role"]["name"] for r in data["roles"]] == ["prefill"]
    (prefill,) = data["roles"]
    assert prefill["kv_bytes_per_rank"] == 262_144 // 8 * 54_728
    assert prefill["max_context"] == 8 * ((2 << 30) // 54_728)
    assert prefill["fits"] is True  # 1.67 GiB of 2


def test_plan_sizes_a_gqa_card_split_by_tp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "llama.yaml"
    card.write_text(GQA_CARDS)
    assert run_plan(str(card), "--context", "1000", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    (agg,) = data["roles"]
    assert agg["kv_bytes_per_token"] == 32 * 2 * 2 * 128 * 2  # 8 KV heads over TP 4
    assert agg["intensity"] is None and data["comparison"] is None
    assert run_plan(str(card)) == 0
    assert "131,072 B/token" in capsys.readouterr().out


def test_plan_rejects_an_unknown_role_and_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_plan(str(EXAMPLE), "--role", "aggregated") == 2
    err = capsys.readouterr().err
    assert "--role aggregated" in err and "prefill, decode" in err
    assert run_plan(str(tmp_path / "missing.yaml")) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_plan_needs_an_architecture_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "bare.yaml"
    start, end = GQA_CARDS.index("  architecture:"), GQA_CARDS.index("  loops:")
    card.write_text(GQA_CARDS[:start] + GQA_CARDS[end:])
    assert run_plan(str(card)) == 2
    assert "spec.architecture is required" in capsys.readouterr().err


def test_loom_main_dispatches_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 54_728
