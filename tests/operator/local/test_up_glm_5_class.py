"""`loom up examples/tiny-glm-5-class.yaml` end to end: every feature of the reference
deployment on the tiny sparse-mla model (a PCP2 × DCP2 × EP2 prefill with a host offload tier,
a DP2 × EP2 decode with HiSparse tiers on each rank, FP8 KV and MTP 3 on both roles): greedy
completions through the
router, prefilled on the ranks and decoded after a KV pull, equal one plain aggregated worker
of the same card (one rank, no speculation, no HiSparse); every feature reports it ran."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.local.sparse_helpers import (
    ROOT,
    example_fleet,
    metrics,
    post,
    rank_labels,
    sample,
)

from loom_operator.testing.fleet import FleetProcess, reference_worker

STEPS = 8
FP8_TRUNK = 4 * (32 + 4 + 8 * 2) + 2 * (16 + 4)  # bytes per token (the card: groups of 128)
FP8_MTP = (32 + 4 + 8 * 2) + (16 + 4)  # the MTP layer: one latent row, one indexer row
PROMPTS = ["every feature of the reference " * 10, "a longer agentic turn that comes back " * 16]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("up-glm-5")
    with example_fleet("tiny-glm-5-class", root, sparse_checkpoint, child_env) as f:
        yield f


@pytest.fixture(scope="module")
def plain(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path, child_env: dict[str, str]
) -> Iterator[str]:
    """One aggregated worker of the same ModelCard (fp8 KV, one rank, nothing else on)."""
    root = tmp_path_factory.mktemp("glm-5-plain")
    text = (ROOT / "examples" / "tiny-glm-5-class.yaml").read_text()
    card = root / "card.yaml"
    card.write_text(text.replace("loom://tiny-sparse-mla", f"file://{sparse_checkpoint}"))
    with reference_worker(card, "float32", root / "plain.log", child_env) as url:
        yield url


def complete(base: str, prompt: str) -> list[int]:
    body = {"model": "tiny-glm-5", "prompt": prompt, "max_tokens": STEPS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    [choice] = post(f"{base}/completions", body)["choices"]
    return list(choice["token_ids"])


def test_greedy_completions_equal_one_plain_aggregated_worker(
    fleet: FleetProcess, plain: str
) -> None:
    for i, prompt in enumerate([*PROMPTS, PROMPTS[1]]):  # the last: a prefix the prefill has
        assert complete(fleet.endpoint, prompt) == complete(f"{plain}/v1", prompt), f"turn {i}"
    with urllib.request.urlopen(f"{plain}/metrics", timeout=30) as reply:
        # fp8 rows, 4 layers (latent 32 + 4 B of scales, BF16 RoPE 8) + 2 indexer layers
        assert sample(reply.read().decode(), "loom:kv_bytes_per_token") == FP8_TRUNK


def test_every_feature_of_the_reference_deployment_ran(fleet: FleetProcess) -> None:
    status = fleet.status()
    assert status is not None
    [prefill] = [w for w in status.workers if w.role == "prefill"]
    decodes = [metrics(w) for w in status.workers if w.role == "decode"]
    text = metrics(prefill)
    assert rank_labels(text) == {"0", "1"}  # PCP2 x DCP2 x EP2 on two ranks
    assert [rank_labels(m) for m in decodes] == [{"0", "1"}]  # DP2 x EP2 on two ranks
    for m in (text, *decodes):  # fp8 rows, and the MTP layer's as one more layer
        assert sample(m, "loom:kv_bytes_per_token") == FP8_TRUNK + FP8_MTP
    assert sample(text, "loom:kv_offload_capacity_bytes") > 0  # the prefill's host tier
    assert sample(text, "vllm:prefix_cache_hits_total") > 0  # the agentic turn came back
    assert sum(sample(m, "loom:kv_pulled_bytes_total") for m in decodes) > 0  # P/D
    assert all(sample(m, "loom:hisparse_host_pool_bytes") > 0 for m in decodes)
    # the ranks' tiers: decodes read selected rows through hot buffers, missing some
    assert all(sample(m, "loom:hisparse_hot_misses_total") > 0 for m in decodes)
    # hiSparse.offloadGiB: the decodes' CPU KV offload tier beside the host pool
    assert all(sample(m, "loom:kv_offload_capacity_bytes") > 0 for m in decodes)
    assert sum(sample(m, "vllm:spec_decode_num_drafts_total") for m in decodes) > 0  # MTP
