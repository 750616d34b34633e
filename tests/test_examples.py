"""Every file in examples/ loads through the card models; the reference numbers are intact."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_operator.api import load_documents
from loom_runtime.card import load_model_card

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_example_loads_through_the_models(path: Path) -> None:
    cards = load_documents(path)
    assert cards.model_cards or cards.deployment_cards
    for deploy in cards.deployment_cards:
        assert cards.model_card(deploy.spec.model_card) is not None


def test_glm_5_class_example_is_the_reference_deployment() -> None:
    cards = load_documents(EXAMPLES / "glm-5-class.yaml")
    [model] = cards.model_cards
    [deploy] = cards.deployment_cards
    arch = model.spec.architecture
    assert model.spec.family == "sparse-mla" and arch is not None
    assert (arch.num_layers, arch.num_attention_heads) == (78, 64)
    assert (arch.attention.kind, arch.attention.kv_lora_rank, arch.attention.qk_rope_head_dim) == (
        "mla",
        512,
        64,
    )
    assert arch.indexer is not None and (arch.indexer.num_layers, arch.indexer.head_dim) == (
        21,
        128,
    )
    assert arch.indexer.top_k == 2048
    assert arch.mtp is not None and (arch.mtp.num_layers, arch.mtp.draft_tokens) == (1, 3)
    precision = model.component("decoder").precision
    assert (precision.weights, precision.kv) == ("fp8", "fp8")
    prefill, decode = deploy.spec.roles.prefill, deploy.spec.roles.decode
    assert prefill is not None and decode is not None
    p = prefill.parallelism
    assert (p.dp, p.tp, p.pcp, p.dcp, p.ep, p.ranks) == (1, 1, 8, 8, 8, 8)
    assert prefill.kv_offload is not None and prefill.kv_offload.host_gib == 512
    assert (decode.parallelism.dp, decode.parallelism.ep, decode.parallelism.ranks) == (8, 8, 8)
    assert decode.hi_sparse is not None
    assert (decode.hi_sparse.host_pool_gib, decode.hi_sparse.offload_gib) == (48, 16)
    assert decode.mtp is not None and decode.mtp.draft_tokens == 3


def test_tiny_examples_serve_the_generated_tiny_checkpoint() -> None:
    pd = load_documents(EXAMPLES / "tiny-pd.yaml")
    agg = load_documents(EXAMPLES / "tiny-aggregated.yaml")
    assert pd.model_cards == agg.model_cards  # one model, two ways to serve it
    model = load_model_card(EXAMPLES / "tiny-pd.yaml")
    assert model.component("decoder").source.uri == "loom://tiny"
    assert [loop.kind for loop in model.spec.loops] == ["ar_decode"]
    roles = pd.deployment_cards[0].spec.roles
    assert list(roles.present()) == ["prefill", "decode"]
    assert roles.prefill is not None and roles.prefill.replicas == 1
    assert roles.decode is not None and roles.decode.replicas == 1
    assert roles.decode.engine.block_size == 16 and roles.decode.engine.max_model_len == 4096
    agg_roles = agg.deployment_cards[0].spec.roles
    assert list(agg_roles.present()) == ["aggregated"]
    assert agg_roles.aggregated is not None and agg_roles.aggregated.replicas == 1
