"""`backend: vllm`: the golden `vllm serve` commands of the GLM-5-class reference deployment,
the sidecar beside them, and the cards vLLM 0.33.0 cannot serve refused with the flag missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import load_documents, parse_documents
from loom_operator.k8s.render import render
from loom_operator.k8s.render.vllm import model_argument, unsupported, vllm_args, vllm_env
from loom_operator.k8s.settings import RenderSettings

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CARDS = load_documents(EXAMPLES / "glm-5-class.yaml")
(MODEL,), (DEPLOYMENT,) = CARDS.model_cards, CARDS.deployment_cards
EVENTS = ('{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","publisher":"zmq",'
          '"replay_endpoint":"tcp://*:5558","topic":"kv-events"}')  # fmt: skip
COMMON = ["vllm", "serve", "zai-org/GLM-5", "--served-model-name", "glm-5",
          "--host", "$(POD_IP)", "--port", "8000", "--block-size", "64"]  # fmt: skip
PARSERS = [
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "glm47",
    "--reasoning-parser",
    "glm45",
]

PREFILL = [
    *COMMON, "--max-num-seqs", "16", "--max-num-batched-tokens", "65536",
    "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor",
    "--max-model-len", "1048576",
    "--prefill-context-parallel-size", "8",
    "--decode-context-parallel-size", "8", "--dcp-comm-backend", "ag_rs",
    "--enable-expert-parallel", "--kv-cache-dtype", "fp8", *PARSERS,
    "--attention-config", '{"sparse_mla_force_mqa":true}',
    "--kv-offloading-size", "512", "--kv-offloading-backend", "native",
    "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "--kv-events-config", EVENTS,
]  # fmt: skip
HISPARSE = {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
    "connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        {"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"host_pool_gib": 48.0}},
    ]}}  # fmt: skip
DECODE = [
    *COMMON, "--max-num-seqs", "32", "--max-num-batched-tokens", "2048",
    "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor",
    "--max-model-len", "1048576",
    "--data-parallel-size", "8", "--enable-expert-parallel", "--kv-cache-dtype", "fp8", *PARSERS,
    "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
    "--kv-transfer-config", json.dumps(HISPARSE, separators=(",", ":"), sort_keys=True),
    "--kv-offloading-size", "16", "--kv-offloading-backend", "native",
    "--kv-events-config", EVENTS,
]  # fmt: skip


def test_the_reference_prefill_engine_command() -> None:
    assert vllm_args(MODEL, DEPLOYMENT, "prefill") == PREFILL


def test_the_reference_decode_engine_command() -> None:
    assert vllm_args(MODEL, DEPLOYMENT, "decode") == DECODE


def without_prefix_caching(role: str, drop: str | None = None) -> DeploymentCard:
    """The reference deployment with `role`'s engine not caching prefixes (and its `drop`
    field, an offload tier that needs prefix caching, removed)."""
    doc = DEPLOYMENT.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = doc["spec"]["roles"][role]
    spec["engine"]["prefixCaching"] = False
    if drop is not None:
        spec.pop(drop)
    (card,) = parse_documents([(0, doc)], "test").deployment_cards
    return card


def test_a_role_without_prefix_caching_runs_vllm_with_no_enable_prefix_caching() -> None:
    off = vllm_args(MODEL, without_prefix_caching("prefill", drop="kvOffload"), "prefill")
    caching = ["--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor"]
    offload = ["--kv-offloading-size", "512", "--kv-offloading-backend", "native"]
    at, end = PREFILL.index(caching[0]), PREFILL.index(offload[0])
    assert off == [*PREFILL[:at], "--no-enable-prefix-caching", *PREFILL[at + 3 : end],
                   *PREFILL[end + 4 :]]  # fmt: skip
    assert vllm_args(MODEL, without_prefix_caching("prefill", "kvOffload"), "decode") == DECODE


def pod_spec(role: str) -> dict[str, Any]:
    manifests = render(MODEL, DEPLOYMENT, "uid", RenderSettings())
    (sts,) = [
        m
        for m in manifests
        if m["kind"] == "StatefulSet" and m["metadata"]["name"] == f"glm-5-{role}"
    ]
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def batch_invariant(role: str) -> DeploymentCard:
    """The reference deployment with `role`'s engine in batch-invariant mode."""
    doc = DEPLOYMENT.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["roles"][role]["engine"]["batchInvariant"] = True
    (card,) = parse_documents([(0, doc)], "test").deployment_cards
    return card


def test_a_batch_invariant_role_runs_vllm_with_its_batch_invariant_variable() -> None:
    deployment = batch_invariant("decode")
    assert vllm_env(MODEL, deployment, "decode")[2:] == [
        {"name": "VLLM_BATCH_INVARIANT", "value": "1"}
    ]
    assert vllm_env(MODEL, deployment, "prefill")[2:] == []  # the other role as it was
    assert vllm_env(MODEL, DEPLOYMENT, "decode")[2:] == []
    assert vllm_args(MODEL, deployment, "decode") == DECODE  # a variable, no flag
    manifests = render(MODEL, deployment, "uid", RenderSettings())
    (sts,) = [m for m in manifests if m["kind"] == "StatefulSet" and m["metadata"]["name"] ==
              "glm-5-decode"]  # fmt: skip
    server = sts["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "VLLM_BATCH_INVARIANT", "value": "1"} in server["env"]


def test_vllm_pods_run_the_engine_and_loom_s_control_sidecar() -> None:
    spec = pod_spec("decode")
    vllm, control = spec["containers"]
    assert vllm["command"] == DECODE
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["PYTHONHASHSEED"] == "0"  # the router's hashSeed: vLLM's NONE_HASH seed
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # /pause, /resume, /collective_rpc …
    assert {p["name"] for p in vllm["ports"]} == {"http", "kv-events", "kv-replay"}
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert control["command"][:4] == ["loom", "vllm-sidecar", "--card", "/etc/loom/model-card.yaml"]
    flags = dict(zip(control["command"][4::2], control["command"][5::2], strict=True))
    assert flags == {"--vllm-url": "http://127.0.0.1:8000", "--host": "$(POD_IP)",
                     "--port": "50051", "--role": "decode", "--block-size": "64",
                     "--drain-timeout": "300"}  # fmt: skip
    assert [p["name"] for p in control["ports"]] == ["control"]
    token = next(e for e in control["env"] if e["name"] == "LOOM_CONTROL_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "glm-5-control", "key": "token"}


def test_model_sources_vllm_loads() -> None:
    assert model_argument("hf://zai-org/GLM-5") == "zai-org/GLM-5"
    assert model_argument("file:///models/glm") == "/models/glm"
    assert model_argument("pvc://store/glm-5/v2") == "/var/lib/loom/models/store/glm-5/v2"


def test_what_vllm_cannot_do_is_refused_with_the_field_and_the_flag() -> None:
    docs = [
        d.model_dump(mode="json", by_alias=True, exclude_none=True) for d in (MODEL, DEPLOYMENT)
    ]
    docs[1]["spec"]["roles"]["decode"]["parallelism"] = {"dp": 1, "tp": 8, "dcp": 8, "ep": 8}
    docs[0]["spec"]["components"][0]["source"]["uri"] = "loom://tiny"
    cards = parse_documents(list(enumerate(docs)), "test")
    problems = dict(unsupported(cards.model_cards[0], cards.deployment_cards[0]))
    assert "--decode-context-parallel-size" in problems["spec.roles.decode.hiSparse"]
    assert "hf://, file:// or pvc://" in problems["spec.components[0].source.uri"]
    assert unsupported(MODEL, DEPLOYMENT) == []


def test_a_pvc_source_is_mounted_in_the_vllm_server_and_its_sidecar() -> None:
    docs = [
        d.model_dump(mode="json", by_alias=True, exclude_none=True) for d in (MODEL, DEPLOYMENT)
    ]
    docs[0]["spec"]["components"][0]["source"]["uri"] = "pvc://store/glm-5/v1"
    cards = parse_documents(list(enumerate(docs)), "test")
    model, deployment = cards.model_cards[0], cards.deployment_cards[0]
    assert unsupported(model, deployment) == []
    sts = next(
        o
        for o in render(model, deployment, "uid", RenderSettings())
        if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-decode")
    )
    pod = sts["spec"]["template"]["spec"]
    claim = {"claimName": "store", "readOnly": True}
    assert {"name": "model-0", "persistentVolumeClaim": claim} in pod["volumes"]
    mount = {"name": "model-0", "mountPath": "/var/lib/loom/models/store", "readOnly": True}
    for container in pod["containers"]:  # vLLM loads it; the sidecar reloads the next version
        assert mount in container["volumeMounts"], container["name"]
    server = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert server["command"][2] == "/var/lib/loom/models/store/glm-5/v1"
