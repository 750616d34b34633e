"""A DeploymentCard against its ModelCard: what the model cannot do is an error."""

from __future__ import annotations

from typing import Any

from loom_operator.api import DeploymentCard
from loom_operator.api.compatibility import compatibility_problems
from loom_runtime.card import ModelCard, families
from loom_runtime.card.families import Family
from loom_runtime.card.load import parse_card


def _check(model_data: dict[str, Any], deploy_data: dict[str, Any]) -> list[tuple[str, str]]:
    model = parse_card(ModelCard, model_data)
    deploy = parse_card(DeploymentCard, deploy_data)
    return [
        (".".join(map(str, path)), code) for path, code, _ in compatibility_problems(deploy, model)
    ]


def _arch(mtp: bool) -> dict[str, Any]:
    arch: dict[str, Any] = {
        "numLayers": 2,
        "hiddenSize": 64,
        "numAttentionHeads": 4,
        "numKeyValueHeads": 2,
        "headDim": 16,
        "attention": {"kind": "gqa"},
    }
    if mtp:
        arch["mtp"] = {"numLayers": 1, "draftTokens": 3}
    return arch


def test_plain_pd_deployment_is_compatible(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    assert _check(model_data, deploy_data) == []


def test_hisparse_needs_a_sparse_mla_model(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    deploy_data["spec"]["roles"]["decode"]["hiSparse"] = {"hostPoolGiB": 1, "offloadGiB": 0}
    assert _check(model_data, deploy_data) == [
        ("spec.roles.decode.hiSparse", "hisparse_needs_sparse_mla")
    ]


def test_the_native_runtime_runs_hisparse_on_dp_ep_ranks_only(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    model_data["spec"]["family"] = "sparse-mla"
    decode = deploy_data["spec"]["roles"]["decode"]
    decode["hiSparse"] = {"hostPoolGiB": 1, "offloadGiB": 0}
    decode["parallelism"] = {"dp": 2, "ep": 2}
    assert _check(model_data, deploy_data) == []  # the reference decode's shape
    decode["parallelism"] = {"pcp": 2, "dcp": 2}
    refused = [("spec.roles.decode.hiSparse", "hisparse_on_split_ranks")]
    assert _check(model_data, deploy_data) == refused
    deploy_data["spec"]["backend"] = "vllm"  # its HiSparseConnector has rules of its own
    assert _check(model_data, deploy_data) == []


def test_mtp_needs_mtp_layers_or_a_draft_component(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    deploy_data["spec"]["roles"]["decode"]["mtp"] = {"draftTokens": 3}
    assert _check(model_data, deploy_data) == []  # no architecture: config.json decides
    model_data["spec"]["architecture"] = _arch(mtp=False)
    assert _check(model_data, deploy_data) == [("spec.roles.decode.mtp", "mtp_without_layers")]
    model_data["spec"]["architecture"] = _arch(mtp=True)
    assert _check(model_data, deploy_data) == []
    model_data["spec"]["architecture"] = _arch(mtp=False)
    model_data["spec"]["components"].append(
        {"name": "draft", "kind": "draft", "source": {"uri": "hf://org/draft"}}
    )
    assert _check(model_data, deploy_data) == []


def test_vllm_backend_serves_ar_decode_loops_only(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    deploy_data["spec"]["backend"] = "vllm"
    assert _check(model_data, deploy_data) == []
    model_data["spec"]["loops"].append(
        {"name": "embed", "kind": "encode", "components": ["decoder"]}
    )
    assert _check(model_data, deploy_data) == [("spec.backend", "backend_loop_kind")]


def test_a_card_with_a_program_is_served_aggregated_only(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    spec = model_data["spec"]
    spec["family"] = "mot"
    spec["loops"].append(
        {"name": "draw", "kind": "diffusion", "components": ["decoder"], "steps": 4}
    )
    spec["programs"] = [
        {"name": "think-then-draw", "kind": "think_then_draw", "think": "generate", "draw": "draw"}
    ]
    model = parse_card(ModelCard, model_data)
    problems = compatibility_problems(parse_card(DeploymentCard, deploy_data), model)
    assert [(".".join(map(str, p)), code) for p, code, _ in problems] == [
        ("spec.roles.decode", "program_needs_aggregated")
    ]
    assert "serve it with an aggregated role" in problems[0][2]
    deploy_data["spec"]["roles"] = {"aggregated": {"replicas": 1}}
    assert _check(model_data, deploy_data) == []


def test_native_batch_invariant_mode_runs_for_its_families_in_one_process(
    model_data: dict[str, Any], deploy_data: dict[str, Any]
) -> None:
    decode = deploy_data["spec"]["roles"]["decode"]
    decode["engine"] = {"batchInvariant": True}
    assert _check(model_data, deploy_data) == []  # llama, one rank
    at = "spec.roles.decode.engine.batchInvariant"
    decode["parallelism"] = {"tp": 2}
    assert _check(model_data, deploy_data) == []  # llama's TP ranks
    model_data["spec"]["family"] = "sparse-mla"
    decode["parallelism"] = {"dp": 2, "ep": 2}
    assert _check(model_data, deploy_data) == [(at, "batch_invariant_on_ranks")]
    model_data["spec"]["family"] = "llama"
    decode["parallelism"] = {}
    decode["mtp"] = {"draftTokens": 2}
    assert _check(model_data, deploy_data) == [(at, "batch_invariant_with")]
    del decode["mtp"]
    plugin = Family(name="plain-plugin", model_types=("plain_plugin",), loops=("ar_decode",),
                    runtime=object())  # fmt: skip
    with families.registered(plugin):
        model_data["spec"]["family"] = "plain-plugin"
        model = parse_card(ModelCard, model_data)
        (problem,) = compatibility_problems(parse_card(DeploymentCard, deploy_data), model)
        assert problem[1] == "batch_invariant_family"
        assert "for the llama, sparse-mla, mot families, not plain-plugin" in problem[2]
        deploy_data["spec"]["backend"] = "vllm"  # vLLM's own mode (VLLM_BATCH_INVARIANT)
        decode["parallelism"] = {"dp": 2, "ep": 2}
        assert _check(model_data, deploy_data) == []
