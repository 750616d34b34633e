"""What a diffusion fleet starts: workers without KV-event, block or sequence flags (they have no
KV cache) but with the control port and version, and a ROUTER.json that turns on the router's
image and video routes with the card's denoise steps — on `loom up` and in a pod alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loom_operator.api import load_documents
from loom_operator.api.autoscaling import Autoscaling
from loom_operator.api.roles import (
    HiSparse,
    KvOffload,
    MtpSection,
    Parallelism,
    Role,
)
from loom_operator.fleet.commands import (
    WorkerPorts,
    diffusion_steps,
    kv_offload_gib,
    program_steps,
    router_document,
    runtime_flags,
)
from loom_operator.k8s.render.config import cards_config_map
from loom_router.shell.config import file_config_from_dict
from loom_runtime.card import CardError
from loom_runtime.card.load import parse_card
from loom_runtime.engine.config import EngineConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PORTS = WorkerPorts(8000, 9000, 5557, 5558)


def cards(name: str):  # type: ignore[no-untyped-def]
    docs = load_documents(EXAMPLES / name)
    [deployment] = docs.deployment_cards
    model = docs.model_card(deployment.spec.model_card)
    assert model is not None
    return model, deployment


def test_a_diffusion_worker_gets_control_but_no_kv_flags() -> None:
    model, deployment = cards("tiny-video.yaml")
    assert diffusion_steps(model) == 8
    argv = runtime_flags(model, deployment, "aggregated", PORTS, "v3")
    assert argv == ["--role", "aggregated", "--port", "8000", "--control-port", "9000",
                    "--weights-version", "v3"]  # fmt: skip


def test_a_text_worker_keeps_its_kv_event_flags() -> None:
    model, deployment = cards("tiny-aggregated.yaml")
    assert diffusion_steps(model) is None
    argv = runtime_flags(model, deployment, "aggregated", PORTS, None)
    assert argv[argv.index("--kv-events-port") + 1] == "5557" and "--block-size" in argv


def test_the_router_document_of_a_diffusion_fleet_turns_on_media_routing() -> None:
    model, deployment = cards("tiny-video.yaml")
    doc = router_document(deployment, model.name, None, diffusion_steps(model))
    config = file_config_from_dict(doc)
    assert config.diffusion is not None and config.diffusion.default_steps == 8
    text_model, text_deployment = cards("tiny-aggregated.yaml")
    text_doc = router_document(text_deployment, text_model.name, None)
    assert file_config_from_dict(text_doc).diffusion is None


@pytest.mark.parametrize(
    ("autoscaling", "holds"),
    [
        (None, False),
        ({"aggregated": {"min": 1, "max": 3}}, False),
        ({"aggregated": {"min": 0, "max": 3}}, True),
    ],
)
def test_a_fleet_that_scales_to_zero_gets_a_router_that_holds_requests_while_it_starts(
    autoscaling: dict[str, Any] | None, holds: bool
) -> None:
    model, deployment = cards("tiny-aggregated.yaml")
    section = None if autoscaling is None else Autoscaling.model_validate(autoscaling)
    spec = deployment.spec.model_copy(update={"autoscaling": section})
    doc = router_document(deployment.model_copy(update={"spec": spec}), model.name, None)
    settings = file_config_from_dict(doc).settings
    assert settings.hold_when_empty is holds
    assert (settings.max_held, settings.hold_s) == (256, 60.0)  # the card's router.hold


def test_the_router_of_a_card_with_a_program_serves_text_and_its_images() -> None:
    model, deployment = cards("tiny-mot.yaml")
    assert diffusion_steps(model) is None and program_steps(model) == 4
    argv = runtime_flags(model, deployment, "aggregated", PORTS, None)
    assert "--kv-events-port" in argv  # a text fleet: KV events and prefix-aware routing
    doc = router_document(deployment, model.name, None, None, program_steps(model))
    config = file_config_from_dict(doc)
    assert config.diffusion is not None and config.diffusion.text
    assert config.diffusion.default_steps == 4
    assert program_steps(cards("tiny-aggregated.yaml")[0]) is None
    data = cards_config_map(model, deployment)["data"]
    assert json.loads(data["router.json"])["diffusion"] == {"default_steps": 4, "text": True}


def test_the_pods_router_json_is_the_same_document() -> None:
    model, deployment = cards("tiny-video.yaml")
    data = cards_config_map(model, deployment)["data"]
    assert json.loads(data["router.json"])["diffusion"] == {"default_steps": 8}


def with_role(deployment, name: str, **update: object):  # type: ignore[no-untyped-def]
    """The deployment card with role `name` updated (its other roles and settings unchanged)."""
    roles = deployment.spec.roles
    role = getattr(roles, name)
    assert role is not None
    spec = deployment.spec.model_copy(
        update={"roles": roles.model_copy(update={name: role.model_copy(update=update)})}
    )
    return deployment.model_copy(update={"spec": spec})


def test_a_role_with_kv_offload_passes_its_host_gib_to_the_worker() -> None:
    model, deployment = cards("tiny-aggregated.yaml")
    assert "--kv-offload-gib" not in runtime_flags(model, deployment, "aggregated", PORTS, None)
    offloading = with_role(deployment, "aggregated", kv_offload=KvOffload(hostGiB=2.5))
    argv = runtime_flags(model, offloading, "aggregated", PORTS, None)
    assert argv[argv.index("--kv-offload-gib") + 1] == "2.5"


def test_a_decode_role_with_hisparse_passes_its_host_pool_to_the_worker() -> None:
    model, deployment = cards("tiny-pd.yaml")
    assert "--hisparse-host-pool-gib" not in runtime_flags(model, deployment, "decode", PORTS, None)
    hi_sparse = HiSparse(hostPoolGiB=48, offloadGiB=16)
    argv = runtime_flags(
        model, with_role(deployment, "decode", hi_sparse=hi_sparse), "decode", PORTS, None
    )
    assert argv[argv.index("--hisparse-host-pool-gib") + 1] == "48"


def test_a_decode_roles_hisparse_offload_becomes_the_workers_cpu_offload_tier() -> None:
    model, deployment = cards("tiny-pd.yaml")
    beside = with_role(deployment, "decode", hi_sparse=HiSparse(hostPoolGiB=48, offloadGiB=16))
    argv = runtime_flags(model, beside, "decode", PORTS, None)
    assert argv[argv.index("--hisparse-host-pool-gib") + 1] == "48"
    assert argv[argv.index("--kv-offload-gib") + 1] == "16"
    none = with_role(deployment, "decode", hi_sparse=HiSparse(hostPoolGiB=48, offloadGiB=0))
    assert "--kv-offload-gib" not in runtime_flags(model, none, "decode", PORTS, None)
    # a role's own kvOffload is its tier when hiSparse has no offloadGiB
    own = with_role(
        deployment,
        "decode",
        hi_sparse=HiSparse(hostPoolGiB=48, offloadGiB=0),
        kv_offload=KvOffload(hostGiB=2.5),
    )
    argv = runtime_flags(model, own, "decode", PORTS, None)
    assert argv.count("--kv-offload-gib") == 1 and argv[argv.index("--kv-offload-gib") + 1] == "2.5"


def test_a_roles_parallelism_reaches_the_worker_as_rank_flags() -> None:
    model, deployment = cards("tiny-pd.yaml")
    assert "--pcp" not in runtime_flags(model, deployment, "prefill", PORTS, None)
    parallel = Parallelism(pcp=2, dcp=2, ep=2, cpKvInterleave=4)
    split = with_role(deployment, "prefill", parallelism=parallel)
    argv = runtime_flags(model, split, "prefill", PORTS, None)
    flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert {k: flags[k] for k in ("--pcp", "--dcp", "--ep", "--dcp-interleave")} == {
        "--pcp": "2", "--dcp": "2", "--ep": "2", "--dcp-interleave": "4"}  # fmt: skip
    assert "--dp" not in argv and "--tp" not in argv  # 1: left to the runtime's default


def test_a_role_with_mtp_passes_its_draft_tokens_to_the_worker() -> None:
    model, deployment = cards("tiny-aggregated.yaml")
    plain = runtime_flags(model, deployment, "aggregated", PORTS, None)
    assert "--mtp-draft-tokens" not in plain
    mtp = with_role(deployment, "aggregated", mtp=MtpSection(draftTokens=3))
    argv = runtime_flags(model, mtp, "aggregated", PORTS, None)
    assert argv[argv.index("--mtp-draft-tokens") + 1] == "3"
    assert [a for a in argv if a not in ("--mtp-draft-tokens", "3")] == plain


def test_a_role_without_prefix_caching_tells_only_its_workers() -> None:
    model, deployment = cards("tiny-pd.yaml")
    for role in ("prefill", "decode"):
        assert "--no-prefix-caching" not in runtime_flags(model, deployment, role, PORTS, None)
    engine = deployment.spec.roles.decode.engine.model_copy(update={"prefix_caching": False})
    off = with_role(deployment, "decode", engine=engine)
    decode = runtime_flags(model, off, "decode", PORTS, None)
    assert decode.count("--no-prefix-caching") == 1
    assert [a for a in decode if a != "--no-prefix-caching"] == runtime_flags(
        model, deployment, "decode", PORTS, None
    )
    assert "--no-prefix-caching" not in runtime_flags(model, off, "prefill", PORTS, None)


OFFLOADS = [
    ({}, 0.0),
    ({"kvOffload": {"hostGiB": 2.5}}, 2.5),
    ({"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 0}}, 0.0),
    ({"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 16}}, 16.0),
]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize(("offload", "gib"), OFFLOADS)
def test_the_card_refuses_offload_without_prefix_caching_where_the_worker_would(
    offload: dict[str, Any], gib: float, caching: bool
) -> None:
    data = {**offload, "engine": {"prefixCaching": caching}}
    try:  # what the worker's --kv-offload-gib and --no-prefix-caching become
        EngineConfig(prefix_caching=caching, kv_offload_gib=gib)
    except ValueError:
        with pytest.raises(CardError) as info:
            parse_card(Role, data)
        assert [e.code for e in info.value.errors] == ["offload_without_prefix_caching"]
    else:
        role = parse_card(Role, data)
        assert kv_offload_gib(role) == gib and role.engine.prefix_caching is caching
