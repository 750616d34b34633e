"""A `loom runtime` worker of a card with a think-then-draw program (examples/tiny-mot.yaml's
ModelCard), driven by the openai client: chat runs the text loop alone, an image request runs
the program and returns a PNG of the requested size and the thought as `revised_prompt` (the
same text a chat of that prompt and length writes, greedily); fields the program does not honour
and sizes over the step budget are 400s. And the pure parts: the request a body becomes, the
image latents become, the card's program as served."""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from PIL import Image

from loom_runtime.card import load_model_card, read_documents
from loom_runtime.errors import InvalidRequestError
from loom_runtime.serve.diffusion.protocol import ImageGenerationRequest, parse_media
from loom_runtime.serve.draw_api import DrawSettings, draw_request, latents_image
from loom_runtime.serve.program_worker import draw_settings
from loom_runtime.testing.processes import free_ports, spawn

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-mot.yaml"
SETTINGS = DrawSettings("think-then-draw", max_think_tokens=16, num_steps=4)


@pytest.fixture(scope="module")
def mot_card(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's ModelCard alone (what a worker is given)."""
    model = next(d for d in EXAMPLE.read_text().split("---") if "kind: ModelCard" in d)
    path = tmp_path_factory.mktemp("mot-card") / "card.yaml"
    path.write_text(model)
    return path


@pytest.fixture(scope="module")
def worker(mot_card: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("mot-worker")
    (http,) = free_ports(1)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(mot_card),
        "--role", "aggregated", "--port", str(http), "--max-model-len", "256",
        "--num-blocks", "64", "--max-num-batched-tokens", "300",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    with spawn("mot-worker", cmd, tmp / "worker.log", url, "/ready"):
        yield f"{url}/v1"


@pytest.fixture
def client(worker: str) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=worker, api_key="unused", max_retries=0)
    yield c
    c.close()


PROMPT = "Draw a red fox in the snow."


def test_an_image_request_runs_the_program_and_returns_its_thought(
    client: openai.OpenAI,
) -> None:
    image = client.images.generate(
        model="tiny-mot",
        prompt=PROMPT,
        size="32x32",
        extra_body={"seed": 7},  # type: ignore[arg-type]
    )
    assert image.data is not None and len(image.data) == 1
    png = base64.b64decode(image.data[0].b64_json or "")
    with Image.open(io.BytesIO(png)) as decoded:
        assert (decoded.format, decoded.size, decoded.mode) == ("PNG", (32, 32), "RGB")
        assert any(low < high for low, high in decoded.getextrema())  # drawn, not flat
    chat = client.chat.completions.create(
        model="tiny-mot", messages=[{"role": "user", "content": PROMPT}], max_tokens=16,
        temperature=0,
    )  # fmt: skip
    thought = chat.choices[0].message.content
    assert thought and image.data[0].revised_prompt == thought
    again = client.images.generate(
        model="tiny-mot",
        prompt=PROMPT,
        size="32x32",
        extra_body={"seed": 7},  # type: ignore[arg-type]
    )
    assert again.data is not None and again.data[0].b64_json == image.data[0].b64_json


def test_image_fields_the_program_does_not_honour_are_refused(client: openai.OpenAI) -> None:
    cases = [
        ({"size": "32x32", "n": 2}, "n is not supported"),
        ({"size": "32x32", "extra_body": {"guidance_scale": 5.0}}, "guidance_scale"),
        ({"size": "33x32"}, "multiple of the patch size"),
        ({"size": "64x64"}, "over the step budget of 300"),
        ({"size": "32x32", "model": "other"}, "not served here"),
        ({"size": "32x32", "quality": "hd"}, "quality is not supported: quality levels"),
        ({"size": "32x32", "extra_body": {"frobnicate": 1}}, "unsupported field 'frobnicate'"),
    ]
    for fields, message in cases:
        kwargs = {"model": "tiny-mot", "prompt": PROMPT, **fields}
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as info:
            client.images.generate(**kwargs)  # type: ignore[arg-type]
        assert message in str(info.value), fields


def test_a_body_becomes_one_program_request() -> None:
    body = ImageGenerationRequest.model_validate(
        {"prompt": "x", "size": "8x4", "num_inference_steps": 9}
    )
    req = draw_request(body, "img-1", 3, [5, 6], SETTINGS)
    assert req.draw is not None and (req.draw.width, req.draw.height) == (8, 4)
    assert (req.draw.num_steps, req.draw.seed, req.prompt_token_ids) == (9, 3, (5, 6))
    assert req.sampling.max_tokens == 16 and req.sampling.temperature == 0.0
    plain = draw_request(
        ImageGenerationRequest.model_validate({"prompt": "x"}), "i", 0, [1], SETTINGS
    )
    assert plain.draw is not None and plain.draw.num_steps == 4  # the card's draw loop steps
    for field, value in (("negative_prompt", "blur"), ("guidance_scale", 5.0), ("n", 2)):
        body = ImageGenerationRequest.model_validate({"prompt": "x", field: value})
        with pytest.raises(InvalidRequestError, match=f"{field} is not supported"):
            draw_request(body, "i", 0, [1], SETTINGS)
    for field, value in (("quality", "hd"), ("style", "vivid"), ("frobnicate", 1)):
        raw = json.dumps({"prompt": "x", field: value}).encode()
        with pytest.raises(InvalidRequestError) as refused:  # the field contract's, before
            parse_media(ImageGenerationRequest, raw)
        assert refused.value.param == field


def test_latents_become_rgb_pixels() -> None:
    latents = torch.tensor([[[-1.0, 1.0]], [[0.0, 2.0]], [[0.5, -3.0]], [[9.0, 9.0]]])
    pixels = latents_image(latents)
    assert pixels.shape == (1, 2, 3) and pixels.dtype.name == "uint8"
    assert pixels[0].tolist() == [[0, 128, 191], [255, 255, 0]]
    assert latents_image(latents[:1])[0, 0].tolist() == [0, 0, 0]  # one channel: grey


def test_the_cards_program_is_what_the_worker_serves(mot_card: Path) -> None:
    assert draw_settings(load_model_card(mot_card)) == SETTINGS
    docs = [data for _, data in read_documents(EXAMPLE)]
    assert [d["kind"] for d in docs if isinstance(d, dict)] == ["ModelCard", "DeploymentCard"]
