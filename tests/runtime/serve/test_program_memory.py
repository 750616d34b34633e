"""The memory a MoT worker saves: one worker serving chats and think-then-draw programs holds its
shared weights once (the text loop and the denoise lane run the very same storages), while the
same two loops built as two separate engines, each loading the checkpoint, hold them twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loom_runtime.card import load_model_card
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import DrawSpec, EngineRequest, SamplingParams
from loom_runtime.models.loader import load_model, read_weights
from loom_runtime.models.mot.tiny import init_tiny_mot
from loom_runtime.serve.model_instance import weights_bytes
from loom_runtime.serve.program_worker import engine_from_instance

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-mot.yaml"
CONFIG = EngineConfig(num_blocks=32, max_model_len=128)


@pytest.fixture(scope="module")
def card_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's ModelCard over a tiny MoT checkpoint written here."""
    root = tmp_path_factory.mktemp("program-memory")
    ckpt = init_tiny_mot(root / "tiny-mot")
    path = root / "card.yaml"
    path.write_text(EXAMPLE.read_text().replace("loom://tiny-mot", f"file://{ckpt}"))
    return path


def checkpoint(card_path: Path) -> Path:
    uri = load_model_card(card_path).component("mot").source.uri
    return Path(uri.removeprefix("file://"))


def one_copy_bytes(card_path: Path) -> int:
    return sum(t.numel() * 4 for t in read_weights(checkpoint(card_path)).values())  # float32


def storages(model: object) -> set[int]:
    targets = model.targets()  # type: ignore[attr-defined]
    return {t.untyped_storage().data_ptr() for t in targets.values()}


def serve_chat_and_image(chat: Engine, painter: Engine) -> None:
    """A chat on `chat`, then a think-then-draw on `painter`: both loops have run."""
    assert len(chat.generate([1, 2, 3], SamplingParams(max_tokens=4)).output_token_ids) == 4
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    req = EngineRequest("img", (4, 5, 6), sampling, draw=DrawSpec(4, 4, 2, seed=1))
    got = OutputCollector(req)
    painter.add_request(req, got)
    while not got.done.is_set():
        assert painter.step()
    assert got.outputs[-1].latents is not None


def test_one_mot_worker_holds_its_weights_once_two_engines_hold_them_twice(
    card_path: Path,
) -> None:
    card = load_model_card(card_path)
    worker = engine_from_instance(card, card_path, CONFIG)
    ckpt = checkpoint(card_path)
    writer = Engine(load_model(ckpt, dtype=torch.float32), CONFIG)
    painter = Engine(load_model(ckpt, dtype=torch.float32), CONFIG)
    try:
        serve_chat_and_image(worker, worker)
        serve_chat_and_image(writer, painter)
        one = worker.loop_models()
        assert sorted(one) == ["denoise", "text"]
        two = {"text": writer.loop_models()["text"], "denoise": painter.loop_models()["denoise"]}
        assert storages(one["text"]) == storages(one["denoise"])  # the very same storages
        assert not storages(two["text"]) & storages(two["denoise"])  # nothing in common
        copy = one_copy_bytes(card_path)
        assert weights_bytes(one) == copy
        assert weights_bytes(two) == 2 * copy
    finally:
        for engine in (worker, writer, painter):
            engine.shutdown()


def test_a_model_that_does_not_list_its_weights_is_named() -> None:
    with pytest.raises(TypeError, match="'denoise': its model does not list its weights"):
        weights_bytes({"denoise": object()})
