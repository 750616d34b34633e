"""One role's workers: a StatefulSet (ordinal = worker identity) and its headless Service.

Pure; the pod runs the same `loom runtime` flags as `loom up` (fleet.commands), bound to
its pod IP, with the ports the router reads (wire.pods). The template names no weights version:
a new pod starts on the ConfigMap card's, and a weight sync is the operator's drain-correct
LoadWeights on running pods, never a rollout. The claims of pvc:// sources are mounted read-only
(model_volumes.py), the same for every version on that claim.
"""

from __future__ import annotations

from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import Resources, RoleName
from loom_operator.fleet.commands import (
    CONTROL_TOKEN_ENV,
    WorkerPorts,
    role_settings,
    runtime_flags,
)
from loom_operator.k8s.labels import common, control_secret, role_object, worker_selector
from loom_operator.k8s.render.config import CARDS_MOUNT, MODEL_CARD_KEY, MOUNT_PATH, cards_volume
from loom_operator.k8s.render.model_volumes import model_mounts, model_volumes
from loom_operator.k8s.render.security import (
    SCRATCH_ENV,
    SCRATCH_MOUNT,
    SCRATCH_VOLUME,
    container_security,
    pod_security,
)
from loom_operator.k8s.render.vllm import sidecar_command, vllm_args, vllm_env
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.card.model_card import ModelCard
from loom_runtime.wire.pods import (
    CONTROL_PORT,
    HTTP_PORT,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    KV_SIDE_PORT,
    ROLE_LABEL,
    WORKER_PORTS,
)

GRACE_MARGIN_S = 15  # beyond the drain timeout: the worker's own shutdown after draining


def _ports(role: RoleName) -> WorkerPorts:
    p = WORKER_PORTS
    side = p[KV_SIDE_PORT] if role == "prefill" else None
    return WorkerPorts(p[HTTP_PORT], p[CONTROL_PORT], p[KV_EVENTS_PORT], p[KV_REPLAY_PORT], side)


def resources(card: Resources | None) -> dict[str, Any]:
    """Requests = limits from the card (cpu, memory, nvidia.com/gpu)."""
    if card is None:
        return {}
    amounts: dict[str, str] = {}
    if card.cpu is not None:
        amounts["cpu"] = str(card.cpu)
    if card.memory is not None:
        amounts["memory"] = str(card.memory)
    if card.gpus:
        amounts["nvidia.com/gpu"] = str(card.gpus)
    return {"requests": amounts, "limits": dict(amounts)} if amounts else {}


def field_env(name: str, path: str) -> dict[str, Any]:
    """An env var from the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def http_service(
    name: str, labels: dict[str, str], selector: dict[str, str], port: int, headless: bool
) -> dict[str, Any]:
    """A Service with one port named http onto the container port named http. Headless for a
    role's StatefulSet (stable pod names; not-ready pods listed too)."""
    spec: dict[str, Any] = {
        "selector": selector,
        "ports": [{"name": HTTP_PORT, "port": port, "targetPort": HTTP_PORT}],
    }
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
    meta = {"name": name, "labels": labels}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def _env() -> list[dict[str, Any]]:
    return [
        field_env("POD_IP", "status.podIP"),
        field_env("POD_NAME", "metadata.name"),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        SCRATCH_ENV,
    ]


def probes(ready_path: str, startup_s: int, startup_period_s: int) -> dict[str, Any]:
    """Readiness on `ready_path`, liveness on /health (a minute of failures), and a startup probe
    that allows `startup_s` for the first start."""

    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": HTTP_PORT}}

    return {
        "readinessProbe": {**get(ready_path), "periodSeconds": 2},
        "livenessProbe": {**get("/health"), "periodSeconds": 10, "failureThreshold": 6},
        "startupProbe": {**get("/health"), "periodSeconds": startup_period_s,
                         "failureThreshold": startup_s // startup_period_s},
    }  # fmt: skip


def worker_container(
    model: ModelCard, deployment: DeploymentCard, role: RoleName, settings: RenderSettings
) -> dict[str, Any]:
    ports = _ports(role)
    flags = runtime_flags(model, deployment, role, ports, None, settings.kv_connector)
    command = [*settings.loom, "runtime", "--card", f"{MOUNT_PATH}/{MODEL_CARD_KEY}",
               "--host", "$(POD_IP)", *flags]  # fmt: skip
    token = {"secretKeyRef": {"name": control_secret(deployment.name), "key": "token"}}
    container_ports = [{"name": HTTP_PORT, "containerPort": ports.http},
                       {"name": CONTROL_PORT, "containerPort": ports.control},
                       {"name": KV_EVENTS_PORT, "containerPort": ports.kv_events},
                       {"name": KV_REPLAY_PORT, "containerPort": ports.kv_replay}]  # fmt: skip
    if ports.kv_side is not None:
        container_ports.append({"name": KV_SIDE_PORT, "containerPort": ports.kv_side})
    container: dict[str, Any] = {
        "name": "runtime",
        "image": settings.runtime_image,
        "command": command,
        "env": [*_env(), {"name": CONTROL_TOKEN_ENV, "valueFrom": token}],
        "ports": container_ports,
        # The first start may generate or load a checkpoint: allow it up to 10 minutes.
        **probes("/ready", startup_s=600, startup_period_s=2),
        "volumeMounts": [CARDS_MOUNT, SCRATCH_MOUNT, *model_mounts(model)],
        "securityContext": container_security(),
    }
    res = resources(role_settings(deployment, role).resources)
    if res:
        container["resources"] = res
    return container


def vllm_containers(
    model: ModelCard, deployment: DeploymentCard, role: RoleName, settings: RenderSettings
) -> list[dict[str, Any]]:
    """`backend: vllm`: vLLM serves the OpenAI API and KV events; the sidecar serves Loom's
    control contract on the control port, with the shared token."""
    p = WORKER_PORTS
    token = {"secretKeyRef": {"name": control_secret(deployment.name), "key": "token"}}
    server: dict[str, Any] = {
        "name": "vllm",
        "image": settings.runtime_image,
        "command": vllm_args(model, deployment, role),
        "env": [*_env(), *vllm_env(model, deployment, role)],
        "ports": [
            {"name": HTTP_PORT, "containerPort": p[HTTP_PORT]},
            {"name": KV_EVENTS_PORT, "containerPort": p[KV_EVENTS_PORT]},
            {"name": KV_REPLAY_PORT, "containerPort": p[KV_REPLAY_PORT]},
        ],
        # Loading a large checkpoint onto 8 GPUs takes a while: allow up to 30 minutes.
        **probes("/health", startup_s=1800, startup_period_s=5),
        "volumeMounts": [SCRATCH_MOUNT, *model_mounts(model)],
        "securityContext": container_security(),
    }
    res = resources(role_settings(deployment, role).resources)
    if res:
        server["resources"] = res
    card = f"{MOUNT_PATH}/{MODEL_CARD_KEY}"
    sidecar = {
        "name": "control",
        "image": settings.runtime_image,
        "command": sidecar_command(card, deployment, role, settings.loom),
        "env": [*_env(), {"name": CONTROL_TOKEN_ENV, "valueFrom": token}],
        "ports": [{"name": CONTROL_PORT, "containerPort": p[CONTROL_PORT]}],
        "volumeMounts": [CARDS_MOUNT, SCRATCH_MOUNT, *model_mounts(model)],
        "securityContext": container_security(),
    }
    return [server, sidecar]


def role_containers(
    model: ModelCard, deployment: DeploymentCard, role: RoleName, settings: RenderSettings
) -> list[dict[str, Any]]:
    if deployment.spec.backend == "vllm":
        return vllm_containers(model, deployment, role, settings)
    return [worker_container(model, deployment, role, settings)]


def role_manifests(
    model: ModelCard,
    deployment: DeploymentCard,
    role: RoleName,
    settings: RenderSettings,
    replicas: int | None,
) -> list[dict[str, Any]]:
    """The headless Service and the StatefulSet of one role; `replicas` None: the StatefulSet
    exists and its count is not rendered (the operator's scaler owns it, k8s/pod_count.py)."""
    name, selector = role_object(deployment.name, role), worker_selector(deployment.name, role)
    labels = {**common(deployment.name, "worker"), ROLE_LABEL: role}
    grace = deployment.spec.weight_sync.drain_timeout_seconds + GRACE_MARGIN_S
    service = http_service(name, labels, selector, WORKER_PORTS[HTTP_PORT], headless=True)
    statefulset: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": {
                # No weights version here: it is the ConfigMap card's, and the operator annotates
                # each pod with it once the pod serves it (a version change rolls no pod).
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "securityContext": pod_security(),
                    "containers": role_containers(model, deployment, role, settings),
                    "volumes": [cards_volume(deployment), SCRATCH_VOLUME, *model_volumes(model)],
                },
            },
        },
    }
    if replicas is not None:
        statefulset["spec"]["replicas"] = replicas
    return [service, statefulset]
