"""`backend: vllm`: a role's pods run `vllm serve` with the flags the cards imply, next to Loom's
control sidecar (`loom vllm-sidecar`: Status/Pause/Resume/LoadWeights over vLLM's own endpoints).

Pure. The flags are vLLM 0.33.0's (VLLM_VERSION; tests parse them with that version's own CLI
parser): the engine settings the table declares a vLLM flag or variable for (loom_runtime.wire.
engine_settings: block size, batch limits, prefix caching, dtype, parallelism; batch-invariant
mode as VLLM_BATCH_INVARIANT), KV cache dtype, host KV offload, MTP speculative decoding, the
NixlConnector for P/D, KV events for the router's precise prefix scorer, and block size and hash
algorithm matching the router (the hash seed is PYTHONHASHSEED: vLLM has no flag for it), or no
prefix caching where a role's engine turns it off. A card asking for what that version cannot
do is refused by `unsupported` with the flag that is missing.
"""

from __future__ import annotations

import json
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import RoleName
from loom_operator.fleet.commands import role_settings
from loom_operator.fleet.desired import served_component
from loom_operator.fleet.engine_flags import vllm_default, vllm_engine_env, vllm_engine_flags
from loom_runtime.card import families
from loom_runtime.card.model_card import ModelCard
from loom_runtime.card.source import Source
from loom_runtime.wire.pods import (
    CONTROL_PORT,
    HTTP_PORT,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    WORKER_PORTS,
)

VLLM_VERSION = "0.33.0"
KV_EVENTS_TOPIC = "kv-events"


def model_argument(uri: str) -> str:
    """What `vllm serve` loads: a Hugging Face id (hf://org/name), a local path (file://), or
    where the pod mounts a pvc:// source's claim (PVC_ROOT/claim/path)."""
    mounted = Source(uri=uri).mounted_path()
    if mounted is not None:
        return str(mounted)
    for scheme in ("hf://", "file://"):
        if uri.startswith(scheme):
            return uri.removeprefix(scheme)
    return uri


def unsupported(model: ModelCard, deployment: DeploymentCard) -> list[tuple[str, str]]:
    """(field path, message) for each thing the cards ask that vLLM VLLM_VERSION cannot do."""
    out = []
    for name, role in deployment.spec.roles.present().items():
        if role.hi_sparse is not None and role.parallelism.dcp > 1:
            out.append((
                f"spec.roles.{name}.hiSparse",
                f"vLLM {VLLM_VERSION}'s HiSparseConnector does not support decode context "
                "parallelism (--decode-context-parallel-size > 1): drop one of them",
            ))  # fmt: skip
    uri = served_component(model).source.uri
    if not uri.startswith(("hf://", "file://", "pvc://")):
        out.append(("spec.components[0].source.uri",
                    f"vLLM loads hf://, file:// or pvc:// checkpoints, not {uri!r}"))  # fmt: skip
    return out


def vllm_args(model: ModelCard, deployment: DeploymentCard, role: RoleName) -> list[str]:
    """`vllm serve …` for one role's pods (the host is the pod IP)."""
    spec = deployment.spec
    r = role_settings(deployment, role)
    p, served = r.parallelism, served_component(model)
    engine = vllm_engine_flags(r, served)  # the declared settings: block size ... parallelism
    if r.engine.prefix_caching:
        engine["prefix_caching"] += ["--prefix-caching-hash-algo", spec.prefix_caching.hash_algo]
    if "parallel.dcp" in engine:  # the cards leave the DCP merge to the runtime's default
        engine["parallel.dcp"] += vllm_default("dcp_backend")
    argv = [
        "vllm", "serve", model_argument(served.source.uri),
        "--served-model-name", model.name,
        "--host", "$(POD_IP)", "--port", str(WORKER_PORTS[HTTP_PORT]),
        *(flag for flags in engine.values() for flag in flags),
    ]  # fmt: skip
    if served.precision.kv == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    parsers = model.chat_parsers()  # the card's, else its family's: Loom's workers read alike
    if parsers.tool_call_parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parsers.tool_call_parser]
    if parsers.reasoning_parser is not None:
        argv += ["--reasoning-parser", parsers.reasoning_parser]
    context_parallel = families.family(model.spec.family).vllm_context_parallel
    if context_parallel and (p.pcp > 1 or p.dcp > 1):
        argv += ["--attention-config", _json(dict(context_parallel))]
    if r.kv_offload is not None:
        size = r.kv_offload.host_gib
        argv += ["--kv-offloading-size", f"{size:g}", "--kv-offloading-backend", "native"]
    if r.mtp is not None:
        spec_config = {"method": "mtp", "num_speculative_tokens": r.mtp.draft_tokens}
        argv += ["--speculative-config", _json(spec_config)]
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if r.hi_sparse is not None:
        hisparse = {
            "kv_connector": "HiSparseConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"host_pool_gib": r.hi_sparse.host_pool_gib},
        }
        connectors = [nixl, hisparse] if role != "aggregated" else [hisparse]
        multi = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"connectors": connectors}}  # fmt: skip
        argv += ["--kv-transfer-config", _json(multi)]
        if r.hi_sparse.offload_gib > 0:
            argv += ["--kv-offloading-size", f"{r.hi_sparse.offload_gib:g}",
                     "--kv-offloading-backend", "native"]  # fmt: skip
    elif role != "aggregated":
        argv += ["--kv-transfer-config", _json(nixl)]
    events = {
        "enable_kv_cache_events": True, "publisher": "zmq",
        "endpoint": f"tcp://*:{WORKER_PORTS[KV_EVENTS_PORT]}",
        "replay_endpoint": f"tcp://*:{WORKER_PORTS[KV_REPLAY_PORT]}",
        "topic": KV_EVENTS_TOPIC,
    }  # fmt: skip
    return [*argv, "--kv-events-config", _json(events)]


def vllm_env(model: ModelCard, deployment: DeploymentCard, role: RoleName) -> list[dict[str, Any]]:
    """The prefix-hash seed the router assumes, vLLM's pause/resume/weight endpoints on, and
    the role's engine settings vLLM reads from its environment (batch-invariant mode)."""
    seed = deployment.spec.prefix_caching.hash_seed
    settings = vllm_engine_env(role_settings(deployment, role), served_component(model))
    return [{"name": "PYTHONHASHSEED", "value": str(seed)},
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            *({"name": name, "value": value} for name, value in settings)]  # fmt: skip


def sidecar_command(
    card_path: str, deployment: DeploymentCard, role: RoleName, loom: tuple[str, ...]
) -> list[str]:
    """`loom vllm-sidecar`: Loom's control service in front of the vLLM next to it; it reports
    the weights version of the ConfigMap card until a LoadWeights changes it."""
    engine = role_settings(deployment, role).engine
    return [
        *loom, "vllm-sidecar", "--card", card_path,
        "--vllm-url", f"http://127.0.0.1:{WORKER_PORTS[HTTP_PORT]}",
        "--host", "$(POD_IP)", "--port", str(WORKER_PORTS[CONTROL_PORT]),
        "--role", role, "--block-size", str(engine.block_size),
        "--drain-timeout", str(deployment.spec.weight_sync.drain_timeout_seconds),
    ]  # fmt: skip


def _json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
