"""What every substrate starts: a worker's `loom runtime` flags and ModelCard, the router's
ROUTER.json. Pure: the same cards and ports give the same command on `loom up` and in a pod.

Owns a worker's command (its engine flags come from fleet/engine_flags.py) and the router's
document; never starts anything and never chooses addresses (the substrate passes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import Role, RoleName
from loom_operator.fleet.desired import served_component
from loom_operator.fleet.engine_flags import card_value, runtime_engine_flags
from loom_runtime.card.model_card import ModelCard
from loom_runtime.card.serving import Router
from loom_runtime.wire.engine_settings import setting

CONTROL_TOKEN_ENV = "LOOM_CONTROL_TOKEN"
ADMIN_TOKEN_ENV = "LOOM_ROUTER_ADMIN_TOKEN"
API_KEYS_ENV = "LOOM_ROUTER_API_KEYS"
"""The router's accepted API keys, comma-separated (loom_router.shell.config reads it)."""


@dataclass(frozen=True)
class WorkerPorts:
    http: int
    control: int
    kv_events: int
    kv_replay: int
    kv_side: int | None = None
    """Prefill only: the KV side channel decode workers pull from."""


def role_settings(deployment: DeploymentCard, role: RoleName) -> Role:
    role_card = deployment.spec.roles.present().get(role)
    if role_card is None:  # a worker of a role the card dropped (retiring): its defaults
        return Role()
    return role_card


DEFAULT_DIFFUSION_STEPS = 50  # the runtime's default when neither loop nor recipe names steps


def diffusion_steps(model: ModelCard) -> int | None:
    """The denoise steps of a model whose served loop is a diffusion loop (None: a text model,
    served with KV events and prefix-aware routing)."""
    loop = model.loop(model.spec.recipe.assumes_loop)
    if loop.kind != "diffusion":
        return None
    return loop.steps or model.spec.recipe.steps or DEFAULT_DIFFUSION_STEPS


def program_steps(model: ModelCard) -> int | None:
    """The denoise steps of a text model's think-then-draw program (its draw loop's), whose
    fleet serves text and images (None: no program)."""
    if not model.spec.programs:
        return None
    return model.loop(model.spec.programs[0].draw).steps or DEFAULT_DIFFUSION_STEPS


def worker_card(model: ModelCard, source: str, version: str) -> str:
    """The ModelCard YAML a worker starts from: the served component first (the runtime serves
    `components[0]`), loading `source` as `version`."""
    doc: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc.pop("status", None)
    served = served_component(model).name
    comps = doc["spec"]["components"]
    comps.sort(key=lambda c: c["name"] != served)
    comps[0]["source"] = {"uri": source}
    comps[0]["weightsVersion"] = version
    return yaml.safe_dump(doc, sort_keys=False)


def runtime_flags(
    model: ModelCard,
    deployment: DeploymentCard,
    role: RoleName,
    ports: WorkerPorts,
    version: str | None,
    kv_connector: str | None = None,
) -> list[str]:
    """The flags after `loom runtime --card CARD --host HOST` (the token goes in the env).
    `version` None: the worker reports the card's weightsVersion (on Kubernetes the card is the
    ConfigMap's, so a version change never changes the pod template)."""
    argv = ["--role", role, "--port", str(ports.http), "--control-port", str(ports.control)]
    if diffusion_steps(model) is not None:  # no KV cache: no events, blocks or sequences
        return argv + ([] if version is None else ["--weights-version", version])
    argv += ["--kv-events-port", str(ports.kv_events), "--kv-events-replay-port",
             str(ports.kv_replay)]  # fmt: skip
    if version is not None:
        argv += ["--weights-version", version]
    argv += runtime_engine_flags(role_settings(deployment, role), served_component(model))
    if role != "aggregated":
        argv += ["--on-transfer-failure", deployment.spec.failover.on_transfer_failure]
        if kv_connector is not None:
            argv += ["--kv-connector", kv_connector]
    if ports.kv_side is not None:
        argv += ["--kv-side-port", str(ports.kv_side)]
    return argv


def kv_offload_gib(settings: Role) -> float:
    """The role's CPU KV offload tier in GiB (0: none): `kvOffload.hostGiB`, or beside HiSparse
    `hiSparse.offloadGiB` (the runtime's offload then keeps the host pool's evicted blocks). The
    card refuses both at once (role_rules.offload_problems)."""
    return float(card_value(setting("kv_offload_gib"), settings) or 0.0)


def router_policy(router: Router, scored: Role | None) -> dict[str, Any]:
    """The router section as the router runs it. When the pool whose cache the prefix index
    predicts keeps no prefix cache (its `engine.prefixCaching: false`), nothing a prefix or a
    session could earn exists there: the prefixCache scorer's weight, session affinity and the
    in-flight prefix window are rendered off (a scorer chasing hits that never come would pile
    requests sharing a prefix onto one worker), and the queue scorer gets weight 1 if no other
    weight is left."""
    doc = router.model_dump(mode="json", by_alias=True)
    if scored is None or scored.engine.prefix_caching:
        return doc
    scorers = doc["scorers"]
    scorers["prefixCache"] = 0.0
    if scorers["queue"] + scorers["kvCacheUtilization"] <= 0:
        scorers["queue"] = 1.0
    doc["sessionAffinity"]["enabled"] = False
    doc["inFlightPrefixSeconds"] = 0.0
    return doc


def router_document(
    card: DeploymentCard,
    model_name: str,
    tokenizer_path: Path | None,
    diffusion: int | None = None,
    program: int | None = None,
    workflows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """ROUTER.json as a document. The block size is the decode role's (or the aggregated
    role's): the pool whose cache the prefix index predicts. Prefill pods report theirs in every
    KV event, and a pod whose block size differs is flagged by the index, never scored zero.
    `diffusion`: the model's denoise steps (see `diffusion_steps`) for a diffusion fleet, whose
    router serves the image and video routes by predicted cost. `program`: the draw steps of a
    text model's program (see `program_steps`): its router also serves the image route.
    `workflows`: the card's workflows with their stages' router URLs (fleet/workflows.py)."""
    spec = card.spec
    roles = spec.roles.present()
    engine_role = roles.get("decode") or roles.get("aggregated") or roles.get("prefill")
    block_size = engine_role.engine.block_size if engine_role is not None else 16
    return {
        "model_name": model_name,
        "tokenizer_path": None if tokenizer_path is None else str(tokenizer_path),
        "block_size": block_size,
        "hash_seed": spec.prefix_caching.hash_seed,
        "hash_algo": spec.prefix_caching.hash_algo,
        "router": router_policy(spec.router, engine_role),
        "failover": spec.failover.model_dump(mode="json", by_alias=True),
        "endpoints": [],
        **({} if diffusion is None else {"diffusion": {"default_steps": diffusion}}),
        **({} if program is None else {"diffusion": {"default_steps": program, "text": True}}),
        **({"scale_from_zero": True} if scales_from_zero(card) else {}),
        **({"workflows": workflows} if workflows else {}),
    }


def scales_from_zero(card: DeploymentCard) -> bool:
    """The planner may take the serving role (decode or aggregated) to zero workers: the router
    then holds requests while none exists (router.hold bounds it) instead of refusing them."""
    a = card.spec.autoscaling
    if a is None:
        return False
    return any(b is not None and b.min == 0 for b in (a.decode, a.aggregated))
