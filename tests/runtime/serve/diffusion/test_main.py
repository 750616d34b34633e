"""`loom runtime` on a diffusion card: a checkpoint with model_index.json is detected (also from a
component folder); the card's loop steps, distilled recipe steps and per-component weights
versions reach the engine settings; control flags are taken; P/D and KV-event flags are refused
with a message."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loom_runtime.serve import main as serve_main
from loom_runtime.serve.diffusion.main import DiffusionPlan, diffusion_root

CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata: {{name: wan-card}}
spec:
  family: dit
  components:
    - {{name: dit, kind: transformer, source: {{uri: "file://{root}/transformer"}},
       weightsVersion: d7, requiredFor: [gen]}}
    - {{name: umt5, kind: encoder, source: {{uri: "file://{root}/text_encoder"}},
       weightsVersion: e3, requiredFor: [gen]}}
  loops:
    - {{name: gen, kind: diffusion, components: [dit, umt5], steps: {steps}}}
  recipe: {{method: {method}, assumesLoop: gen, assumesPrecision: bf16{recipe_steps}}}
"""


def fake_checkpoint(tmp: Path) -> Path:
    root = tmp / "wan"
    for sub in ("transformer", "text_encoder"):
        (root / sub).mkdir(parents=True)
    (root / "model_index.json").write_text("{}")
    return root


def args_for(tmp: Path, steps: int = 3, distilled: bool = False, *flags: str) -> argparse.Namespace:
    root = fake_checkpoint(tmp)
    card = tmp / "card.yaml"
    card.write_text(
        CARD.format(
            root=root, steps=steps, method="distilled" if distilled else "base",
            recipe_steps=f", steps: {steps}" if distilled else "",
        )
    )  # fmt: skip
    parser = argparse.ArgumentParser()
    serve_main.add_parser(parser.add_subparsers())
    return parser.parse_args(["runtime", "--card", str(card), "--text-len", "64", *flags])


def plan(args: argparse.Namespace) -> DiffusionPlan:
    worker = serve_main.plan_worker(args, {})
    root = diffusion_root(worker.checkpoint)
    assert root is not None
    return serve_main._plan_diffusion(args, worker, root)


def test_a_component_folder_of_a_wan_checkpoint_is_detected(tmp_path: Path) -> None:
    root = fake_checkpoint(tmp_path)
    assert diffusion_root(root) == root == diffusion_root(root / "transformer")
    assert diffusion_root(tmp_path) is None


def test_the_card_sets_steps_and_each_components_version(tmp_path: Path) -> None:
    p = plan(args_for(tmp_path, 3))
    e = p.engine
    assert (e.model_name, e.default_steps, e.pinned_steps, e.text_len) == ("wan-card", 3, None, 64)
    assert (e.versions.transformer, e.versions.text_encoder, e.versions.vae) == ("d7", "e3", "d7")
    assert p.checkpoint == tmp_path / "wan"


def test_a_distilled_recipe_pins_its_steps(tmp_path: Path) -> None:
    assert plan(args_for(tmp_path, 4, True)).engine.pinned_steps == 4


def test_a_diffusion_worker_takes_the_control_flags(tmp_path: Path) -> None:
    args = args_for(tmp_path, 3, False, "--control-port", "9999", "--control-token", "t")
    p = plan(args)
    assert (p.serve.control_port, p.serve.control_token, p.version) == (9999, "t", "d7")


def test_kv_event_and_pd_flags_are_refused_for_a_diffusion_checkpoint(tmp_path: Path) -> None:
    for i, flags in enumerate((("--kv-events-port", "9998"), ("--role", "prefill"))):
        args = args_for(tmp_path / str(i), 3, False, *flags)
        with pytest.raises(serve_main.UsageError, match="diffusion checkpoint"):
            plan(args)


def test_the_step_budget_flag_reaches_the_engine(tmp_path: Path) -> None:
    assert plan(args_for(tmp_path / "a", 3)).engine.step_budget_s == 5.0
    budget = plan(args_for(tmp_path / "b", 3, False, "--diffusion-step-budget", "0.5"))
    assert budget.engine.step_budget_s == 0.5
    off = plan(args_for(tmp_path / "c", 3, False, "--diffusion-step-budget", "0"))
    assert off.engine.step_budget_s is None
