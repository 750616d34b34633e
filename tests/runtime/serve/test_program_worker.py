"""A worker of a card with a program: its engine is built from the card's ModelInstance (the
shared component loaded once; the text loop and the denoise lane run that one object), and a
P/D role for it is refused before anything loads, saying what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loom_runtime.card import Component, load_model_card
from loom_runtime.cli import build_parser
from loom_runtime.engine.config import EngineConfig
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.mot.tiny import init_tiny_mot
from loom_runtime.serve.main import UsageError, plan_worker
from loom_runtime.serve.model_instance import checkpoint_loader
from loom_runtime.serve.program_worker import engine_from_instance

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-mot.yaml"


@pytest.fixture(scope="module")
def card_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's ModelCard over a tiny MoT checkpoint written here."""
    root = tmp_path_factory.mktemp("program-worker")
    ckpt = init_tiny_mot(root / "tiny-mot")
    path = root / "card.yaml"
    path.write_text(EXAMPLE.read_text().replace("loom://tiny-mot", f"file://{ckpt}"))
    return path


def test_the_engine_runs_the_instances_one_shared_component(card_path: Path) -> None:
    card = load_model_card(card_path)
    calls: list[str] = []
    base = checkpoint_loader(card_path)

    def load(component: Component) -> LoadedModel:
        calls.append(component.name)
        return base(component)

    engine = engine_from_instance(
        card, card_path, EngineConfig(num_blocks=16, max_model_len=128), load=load
    )
    try:
        assert calls == ["mot"]  # two loops list it: loaded once
        lane = engine._lane
        assert lane is not None and lane.executor.model is engine._model  # one live object
        reply = engine.generate([1, 2, 3], request_id="chat")
        assert len(reply.output_token_ids) == 16 and engine.model_config.vocab_size > 0
    finally:
        engine.shutdown()
    assert engine.config.dtype == torch.float32


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pd_role_for_a_card_with_a_program_is_refused(card_path: Path, role: str) -> None:
    args = build_parser().parse_args(["runtime", "--card", str(card_path), "--role", role])
    with pytest.raises(UsageError, match=r"program .think-then-draw.*--role aggregated"):
        plan_worker(args, {})
    plan = plan_worker(build_parser().parse_args(["runtime", "--card", str(card_path)]), {})
    assert plan.serve.draw is not None and plan.serve.draw.program == "think-then-draw"
