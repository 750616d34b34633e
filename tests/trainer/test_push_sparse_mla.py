"""The C2 gate after a push into a sparse-mla fleet: a trainer pushes new weights into a
`loom up` fleet of the tiny sparse-mla checkpoint (one aggregated worker, fp64), and the
behaviour records it then returns equal Loom's own plain one-sequence forward of the pushed
weights within 1e-9, their weight_versions the pushed version (docs/rl.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.runtime.training_forward import sampled_logprobs, sparse_mla_logits
from tests.trainer.test_push_fleet import connect, next_version, save_checkpoint, weights_of

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_runtime.testing.processes import post

MAX_TOKENS = 8
PROMPT = [10 + (7 * i) % 3000 for i in range(100)]  # longer than index_topk (64)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    sparse_checkpoint: Path,
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("push-sparse")
    card = root / "card.yaml"
    text = card_text(f"file://{sparse_checkpoint}", name="push-sparse", health_timeout=60.0)
    card.write_text(text.replace("family: llama", "family: sparse-mla"))
    with run_fleet(card, root / "state", child_env) as f:
        yield f


def test_sparse_mla_records_after_a_push_equal_its_plain_forward_of_the_pushed_weights(
    fleet: FleetProcess, sparse_checkpoint: Path, tmp_path: Path
) -> None:
    gen = torch.Generator().manual_seed(5)
    pushed = {
        n: t + 0.01 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        for n, t in weights_of(sparse_checkpoint).items()
    }
    for name in [n for n in pushed if n.endswith("e_score_correction_bias")]:
        pushed[name] = pushed[name].to(torch.float32)  # the model keeps its router's bias in fp32
    version = next_version(fleet)
    connect(fleet).push(pushed, version, mode="barrier", bucket_bytes=16 << 20)
    fleet.wait_settled(120, version)
    reference = save_checkpoint(pushed, sparse_checkpoint, tmp_path / "pushed")
    for temperature in (1.0, 0.7):
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": 13,
                "temperature": temperature, "ignore_eos": True,
                "return_behaviour": True}  # fmt: skip
        status, answer, _ = post(fleet.endpoint + "/completions", body)
        assert status == 200, answer
        choice = answer["choices"][0]
        out = choice["token_ids"]
        assert choice["weight_versions"] == [{"version": version, "start": 0, "end": MAX_TOKENS}]
        logits = sparse_mla_logits(reference, PROMPT + out, len(PROMPT))
        want = sampled_logprobs(logits, len(PROMPT), out, temperature)
        got = choice["behaviour"]["logprobs"]
        assert len(got) == MAX_TOKENS
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-9
