"""Engine settings declared once: a setting added in one declaration reaches the runtime's
parser, the pods' command and EngineConfig; the table's own rules hold."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loom_operator.api import load_documents
from loom_operator.fleet.commands import worker_card
from loom_operator.k8s.render import render
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.cli import build_parser
from loom_runtime.engine.config import EngineConfig
from loom_runtime.serve.main import plan_worker
from loom_runtime.wire import engine_settings
from loom_runtime.wire.engine_settings import SETTINGS, EngineSetting, VllmFlag, setting

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-aggregated.yaml"
HEAD = 6  # loom runtime --card CARD --host HOST

# The setting the test takes out of the table and declares again: the card's
# engine.maxNumBatchedTokens (512 in the example).
BATCHED = EngineSetting(
    "max_num_batched_tokens", int, 2048, "token budget of one step (default 2048)",
    "--max-num-batched-tokens", card=("engine.maxNumBatchedTokens",),
    vllm=VllmFlag("--max-num-batched-tokens"),
)  # fmt: skip
WITHOUT = tuple(s for s in SETTINGS if s.name != BATCHED.name)


def pod_command() -> list[str]:
    """The aggregated worker pod's command, as the operator renders it for Kubernetes."""
    cards = load_documents(EXAMPLE)
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    manifests = render(model, deployment, "uid", RenderSettings(loom=("loom",)))
    (pods,) = [m for m in manifests if m["kind"] == "StatefulSet"]
    (container,) = pods["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


def worker_args(command: list[str], tmp_path: Path) -> argparse.Namespace:
    """The pod's command parsed by the runtime's own parser, its card a local file."""
    cards = load_documents(EXAMPLE)
    (model,) = cards.model_cards
    card = tmp_path / "card.yaml"
    card.write_text(worker_card(model, "file:ckpt", "v1"))
    return build_parser().parse_args(["runtime", "--card", str(card), *command[HEAD:]])


def test_a_setting_declared_once_reaches_the_parser_the_pod_and_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_settings, "SETTINGS", WITHOUT)  # as if never declared
    before = pod_command()
    assert "--max-num-batched-tokens" not in before
    with pytest.raises(SystemExit):  # the runtime does not know the flag
        build_parser().parse_args(["runtime", "--card", "c", "--max-num-batched-tokens", "8"])
    monkeypatch.setattr(engine_settings, "SETTINGS", (*WITHOUT, BATCHED))  # the only change

    args = build_parser().parse_args(["runtime", "--card", "c", "--max-num-batched-tokens", "8"])
    assert args.max_num_batched_tokens == 8  # the runtime's parser
    command = pod_command()
    at = command.index("--max-num-batched-tokens")  # the pod's command, from the card
    assert command[at + 1] == "512"
    engine = plan_worker(worker_args(command, tmp_path), {"LOOM_CONTROL_TOKEN": "t"}).engine
    assert engine.max_num_batched_tokens == 512  # EngineConfig, through plan_worker
    assert [a for a in command if a not in ("--max-num-batched-tokens", "512")] == before


def test_every_declared_default_is_the_engines_own() -> None:
    defaults = EngineConfig()
    for declared in SETTINGS:
        value = defaults
        for name in declared.name.split("."):
            value = getattr(value, name)
        if declared.name == "dtype":
            assert str(value) == f"torch.{declared.default}"
        else:
            assert value == declared.default, declared.name


def test_names_and_flags_are_declared_once() -> None:
    names = [s.name for s in SETTINGS]
    flags = [s.flag for s in SETTINGS if s.flag is not None]
    vllm = [s.vllm.name for s in SETTINGS if s.vllm is not None]
    assert len(set(names)) == len(names)
    assert len(set(flags)) == len(flags)
    assert len(set(vllm)) == len(vllm)
    assert setting("block_size").flag == "--block-size"
    with pytest.raises(KeyError, match="no engine setting declares 'nope'"):
        setting("nope")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"flag": "block"}, "must start with --"),
        ({"kind": bool, "default": True}, "flips its default"),
        ({"choices": ("a", "b"), "kind": str, "default": "c"}, "not a choice"),
    ],
)
def test_a_declaration_the_derivations_cannot_use_is_refused(
    kwargs: dict[str, object], says: str
) -> None:
    base: dict[str, object] = {
        "name": "x", "kind": int, "default": 1, "doc": "x", "flag": "--x"}  # fmt: skip
    with pytest.raises(ValueError, match=says):
        EngineSetting(**{**base, **kwargs})  # type: ignore[arg-type]
