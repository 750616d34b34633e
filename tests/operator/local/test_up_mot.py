"""`loom up examples/tiny-mot.yaml` end to end (router + one MoT worker as real processes),
driven by the openai client through the router: chat runs the text loop alone, an image runs the
think-then-draw program and comes back as a PNG with the thought as `revised_prompt`, equal to
the greedy chat of the same prompt and length; the card's engine is batch-invariant, so chats
and images sent together are the same bits as each sent alone."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from PIL import Image

from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_runtime.testing.processes import post

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-mot.yaml"
PROMPT = "Draw a lighthouse at dusk."


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("up-mot")
    card = root / "tiny-mot.yaml"
    card.write_text(EXAMPLE.read_text())
    with run_fleet(card, root / "state", child_env) as f:
        yield f


@pytest.fixture
def client(fleet: FleetProcess) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0)
    yield c
    c.close()


def test_chat_and_think_then_draw_through_the_router(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model="tiny-mot", messages=[{"role": "user", "content": PROMPT}], max_tokens=16,
        temperature=0,
    )  # fmt: skip
    thought = chat.choices[0].message.content
    assert thought and chat.usage is not None and chat.usage.completion_tokens == 16
    image = client.images.generate(
        model="tiny-mot",
        prompt=PROMPT,
        size="32x32",
        extra_body={"seed": 3},  # type: ignore[arg-type]
    )
    assert image.data is not None and len(image.data) == 1
    with Image.open(io.BytesIO(base64.b64decode(image.data[0].b64_json or ""))) as png:
        assert (png.format, png.size) == ("PNG", (32, 32))
    assert image.data[0].revised_prompt == thought


def test_a_field_the_program_does_not_honour_is_refused_through_the_router(
    client: openai.OpenAI, fleet: FleetProcess
) -> None:
    status, _, _ = post(f"{fleet.endpoint}/videos", {"model": "tiny-mot", "prompt": PROMPT})
    assert status == 404  # a fleet of a card with a program serves images, not videos
    with pytest.raises(openai.BadRequestError, match="negative_prompt"):
        client.images.generate(
            model="tiny-mot", prompt=PROMPT, size="32x32",
            extra_body={"negative_prompt": "fog"},  # type: ignore[arg-type]
        )  # fmt: skip


def answers(client: openai.OpenAI, together: bool) -> list[object]:
    """Four sampled chats with their tokens' log-probs and two images, sent at once or one at a
    time: what each gives back, in order."""

    def chat(i: int) -> object:
        out = client.chat.completions.create(
            model="tiny-mot", messages=[{"role": "user", "content": f"{PROMPT} Take {i}."}],
            max_tokens=24, temperature=0.9, seed=i, logprobs=True,
        )  # fmt: skip
        assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content
        return [(t.token, t.logprob) for t in out.choices[0].logprobs.content]

    def image(seed: int) -> object:
        out = client.images.generate(
            model="tiny-mot", prompt=f"{PROMPT} Seed {seed}.", size="32x32",
            extra_body={"seed": seed},  # type: ignore[arg-type]
        )  # fmt: skip
        assert out.data is not None
        return (out.data[0].revised_prompt, out.data[0].b64_json)

    jobs = [lambda i=i: chat(i) for i in range(4)] + [lambda s=s: image(s) for s in (5, 6)]
    if not together:
        return [job() for job in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: job(), jobs))


def test_chats_and_images_sent_together_are_the_same_bits_as_each_alone(
    client: openai.OpenAI, fleet: FleetProcess
) -> None:
    together = answers(client, together=True)
    assert answers(client, together=False) == together  # log-probs compared as floats
