"""A role's engine settings as flags: every declared card field exists, and what a card sets
arrives in the worker's EngineConfig through the flags the operator writes and the runtime
parses; vLLM gets the same values under its own flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loom_operator.api import load_documents
from loom_operator.api.roles import Role
from loom_operator.fleet.commands import WorkerPorts, runtime_flags, worker_card
from loom_operator.fleet.desired import served_component
from loom_operator.fleet.engine_flags import (
    card_field,
    card_value,
    vllm_default,
    vllm_engine_env,
    vllm_engine_flags,
)
from loom_runtime.card.load import parse_card
from loom_runtime.cli import build_parser
from loom_runtime.serve.main import plan_worker
from loom_runtime.wire.engine_settings import SETTINGS

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PORTS = WorkerPorts(8000, 9000, 5557, 5558)
EVERY_SECTION = {
    "engine": {"maxModelLen": 512, "dtype": "fp64"},
    "parallelism": {"dp": 2, "ep": 2},
    "kvOffload": {"hostGiB": 1.5},
    "hiSparse": {"hostPoolGiB": 0.5, "offloadGiB": 0},
    "mtp": {"draftTokens": 2},
}
# Roles that between them set every card-fed setting off its default (and that a worker runs).
ROLES = [
    {"engine": {"blockSize": 32, "maxNumSeqs": 8, "maxModelLen": 512, "dtype": "fp64"},
     "parallelism": {"dp": 2, "ep": 2}, "hiSparse": {"hostPoolGiB": 0.5, "offloadGiB": 0.25},
     "mtp": {"draftTokens": 2}},
    {"engine": {"prefixCaching": False, "dtype": "bf16"},
     "parallelism": {"pcp": 2, "dcp": 2, "cpKvInterleave": 2}},
    {"parallelism": {"tp": 2}, "kvOffload": {"hostGiB": 1.5}},
    {"engine": {"kvCacheGiB": 0.25, "maxNumBatchedTokens": 256, "batchInvariant": True}},
    {},
]  # fmt: skip


def tiny() -> Any:
    cards = load_documents(EXAMPLES / "tiny-aggregated.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    return model, deployment


def with_aggregated(deployment: Any, role: Role) -> Any:
    roles = deployment.spec.roles.model_copy(update={"aggregated": role})
    return deployment.model_copy(
        update={"spec": deployment.spec.model_copy(update={"roles": roles})}
    )


def test_every_declared_card_field_is_a_field_of_the_cards() -> None:
    model, _ = tiny()
    role = parse_card(Role, EVERY_SECTION)
    for declared in SETTINGS:
        for path in declared.card + (
            (declared.vllm.card,) if declared.vllm and declared.vllm.card else ()
        ):
            card_field(role, served_component(model), path)  # KeyError on a typo
    with pytest.raises(KeyError, match="EngineSection has no field 'blockSise'"):
        card_field(role, None, "engine.blockSise")
    with pytest.raises(KeyError, match="reads the served component"):
        card_field(role, None, "component.precision.weights")
    assert card_field(Role(), None, "hiSparse.hostPoolGiB") is None  # an unset section


@pytest.mark.parametrize("data", ROLES)
def test_what_a_card_sets_arrives_in_the_workers_engine_config(
    data: dict[str, Any], tmp_path: Path
) -> None:
    model, deployment = tiny()
    role = parse_card(Role, data)
    argv = runtime_flags(model, with_aggregated(deployment, role), "aggregated", PORTS, None)
    card = tmp_path / "card.yaml"
    card.write_text(worker_card(model, "file:ckpt", "v1"))
    args = build_parser().parse_args(["runtime", "--card", str(card), *argv])
    engine = plan_worker(args, {"LOOM_CONTROL_TOKEN": "t"}).engine
    for declared in SETTINGS:
        if declared.flag is None:
            continue
        given = card_value(declared, role, served_component(model))
        expected = declared.default if given is None else given
        actual: Any = engine
        for name in declared.name.split("."):
            actual = getattr(actual, name)
        if declared.name == "dtype":
            expected = getattr(torch, str(expected))
        assert actual == expected, declared.name


def test_vllm_reads_the_same_card_fields_under_its_own_flags() -> None:
    model, _ = (
        tiny()
    )  # fp32 weights: the native worker's --dtype, not vLLM's (it reads the checkpoint)
    component = served_component(model)
    plain = vllm_engine_flags(parse_card(Role, {}), component)
    assert plain == {
        "block_size": ["--block-size", "16"],
        "max_num_seqs": ["--max-num-seqs", "64"],
        "max_num_batched_tokens": ["--max-num-batched-tokens", "2048"],
        "prefix_caching": ["--enable-prefix-caching"],
    }
    split = {"engine": {"prefixCaching": False, "dtype": "bf16"},
             "parallelism": {"dp": 2, "ep": 2}}  # fmt: skip
    flags = vllm_engine_flags(parse_card(Role, split), component)
    assert flags["prefix_caching"] == ["--no-enable-prefix-caching"]
    assert flags["dtype"] == ["--dtype", "bfloat16"]
    assert flags["parallel.dp"] == ["--data-parallel-size", "2"]
    assert flags["parallel.ep"] == ["--enable-expert-parallel"]
    assert "parallel.tp" not in flags  # 1: vLLM's default
    sized = vllm_engine_flags(parse_card(Role, {"engine": {"kvCacheGiB": 1.5}}), component)
    assert sized["kv_cache_gib"] == ["--kv-cache-memory-bytes", str(3 * 2**29)]  # 1.5 GiB
    assert vllm_default("dcp_backend") == ["--dcp-comm-backend", "ag_rs"]  # beside DCP
    with pytest.raises(KeyError, match="no vLLM flag"):
        vllm_default("collective_timeout_s")
    assert "batch_invariant" not in vllm_engine_flags(
        parse_card(Role, {"engine": {"batchInvariant": True}}), component
    )  # vLLM reads it from its environment


def test_vllm_reads_batch_invariant_mode_from_its_environment() -> None:
    model, _ = tiny()
    component = served_component(model)
    assert vllm_engine_env(parse_card(Role, {}), component) == []
    invariant = parse_card(Role, {"engine": {"batchInvariant": True}})
    assert vllm_engine_env(invariant, component) == [("VLLM_BATCH_INVARIANT", "1")]
