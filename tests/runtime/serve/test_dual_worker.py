"""`loom runtime --card LLM --diffusion-card WAN`: one process serves a chat model and an image /
video model on one step thread. Both APIs answer at the same time with what each model alone
gives (greedy tokens, seeded pixels), /v1/models lists both, and /metrics is one valid
exposition with both engines' series and each engine's compute time on the shared thread."""

from __future__ import annotations

import base64
import io
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import DiffusionEngineConfig
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.models.wan.loader import load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.serve.diffusion.media import to_uint8
from loom_runtime.testing.processes import CARD, WAN_CARD, Proc, free_ports, get_json, post, spawn

LLM, DIT, TEXT_LEN, STEPS = "tiny-chat", "tiny-draw", 16, 2
PROMPT = list(range(5, 40))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("dual")
    return init_tiny(tmp / "llm"), init_tiny_wan(tmp / "wan")


@pytest.fixture(scope="module")
def worker(
    checkpoints: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("dual-worker")
    llm_card, wan_card = tmp / "llm.yaml", tmp / "wan.yaml"
    llm_card.write_text(CARD.format(name=LLM, path=checkpoints[0]))
    wan_card.write_text(WAN_CARD.format(name=DIT, path=checkpoints[1], steps=STEPS))
    [port] = free_ports(1)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(llm_card),
        "--diffusion-card", str(wan_card), "--port", str(port), "--dtype", "float64",
        "--text-len", str(TEXT_LEN),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with spawn("dual-worker", cmd, tmp / "worker.log", url, "/ready") as proc:
        yield proc


def alone(checkpoints: tuple[Path, Path]) -> tuple[list[int], np.ndarray]:
    """The same two requests, each on its own engine in this process."""
    llm = Engine(load_model(checkpoints[0], dtype=torch.float64),
                 EngineConfig(dtype=torch.float64, model_name=LLM))  # fmt: skip
    greedy = SamplingParams(max_tokens=12, temperature=0)
    tokens = list(llm.generate(PROMPT, greedy).output_token_ids)
    config = DiffusionEngineConfig(model_name=DIT, dtype=torch.float64, text_len=TEXT_LEN,
                                   default_steps=STEPS)  # fmt: skip
    dit = DiffusionEngine(load_wan(checkpoints[1], dtype=torch.float64), config)
    ids = tuple(dit.tokenizer.encode("a lighthouse"))[:TEXT_LEN]
    outs: list[DiffusionOutput] = []
    dit.add_request(DiffusionRequest("i", ids, 32, 32, 1, seed=5), outs.append)
    while not outs:
        dit.step()
    return tokens, to_uint8(outs[0].frames)[0]


def test_both_apis_answer_at_once_as_each_model_alone(
    worker: Proc, checkpoints: tuple[Path, Path]
) -> None:
    replies: dict[str, Any] = {}

    def chat() -> None:
        replies["text"] = post(f"{worker.base_url}/v1/completions", {
            "model": LLM, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True,
        })  # fmt: skip

    def image() -> None:
        replies["image"] = post(f"{worker.base_url}/v1/images/generations", {
            "model": DIT, "prompt": "a lighthouse", "size": "32x32", "seed": 5,
        })  # fmt: skip

    threads = [threading.Thread(target=chat), threading.Thread(target=image)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    (text_status, text, _), (image_status, img, _) = replies["text"], replies["image"]
    assert text_status == 200 and image_status == 200, (text, img)
    tokens, pixels = alone(checkpoints)
    assert text["choices"][0]["token_ids"] == tokens
    png = Image.open(io.BytesIO(base64.b64decode(img["data"][0]["b64_json"])))
    assert np.array_equal(np.asarray(png), pixels)


def test_models_lists_both(worker: Proc) -> None:
    status, doc = get_json(f"{worker.base_url}/v1/models")
    assert status == 200 and [m["id"] for m in doc["data"]] == [LLM, DIT]


def test_metrics_are_one_exposition_with_both_engines_and_their_compute_time(
    worker: Proc,
) -> None:
    text = _text(worker)
    families = {f.name: f for f in text_string_to_metric_families(text)}  # parses: no duplicates
    running = {s.labels["model_name"] for s in families["vllm:num_requests_running"].samples}
    assert running == {LLM, DIT}
    steps = {s.labels["engine"]: s.value for s in families["loom:engine_steps"].samples}
    assert steps[LLM] > 0 and steps[DIT] > 0
    assert len(families["process_cpu_seconds"].samples) == 1  # reported once, not per engine


def _text(worker: Proc) -> str:
    with urllib.request.urlopen(worker.base_url + "/metrics", timeout=30) as resp:
        return str(resp.read().decode())
