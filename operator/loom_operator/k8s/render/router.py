"""The router of one deployment: its Deployment, Service, PodDisruptionBudget, and the
ServiceAccount + Role that let it watch its deployment's pods.

Pure; the router finds workers by watching pods (never EndpointSlices: see docs/e2e.md).
"""

from __future__ import annotations

from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.fleet.commands import ADMIN_TOKEN_ENV, API_KEYS_ENV
from loom_operator.k8s.labels import common, control_secret, router_object, router_selector
from loom_operator.k8s.render.config import CARDS_MOUNT, MOUNT_PATH, ROUTER_KEY, cards_volume
from loom_operator.k8s.render.security import (
    SCRATCH_ENV,
    SCRATCH_MOUNT,
    SCRATCH_VOLUME,
    container_security,
    pod_security,
)
from loom_operator.k8s.render.workers import http_service
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.wire.pods import DEPLOYMENT_LABEL, HTTP_PORT, ROUTER_ADMIN_PORT, ROUTER_PORTS


def router_container(deployment: DeploymentCard, settings: RenderSettings) -> dict[str, Any]:
    command = [
        *settings.loom, "router", "--config", f"{MOUNT_PATH}/{ROUTER_KEY}",
        "--host", "$(POD_IP)", "--port", str(ROUTER_PORTS[HTTP_PORT]),
        "--admin-host", "$(POD_IP)", "--admin-port", str(ROUTER_PORTS[ROUTER_ADMIN_PORT]),
        "--watch-pods", f"{DEPLOYMENT_LABEL}={deployment.name}", "--namespace", "$(POD_NAMESPACE)",
    ]  # fmt: skip
    token = {"secretKeyRef": {"name": control_secret(deployment.name), "key": "admin-token"}}
    return {
        "name": "router",
        "image": settings.router_image,
        "command": command,
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": ADMIN_TOKEN_ENV, "valueFrom": token},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            SCRATCH_ENV,
            *_api_keys(settings),
        ],
        "ports": [{"name": n, "containerPort": p} for n, p in ROUTER_PORTS.items()],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": HTTP_PORT}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": HTTP_PORT}, "periodSeconds": 10},
        "volumeMounts": [CARDS_MOUNT, SCRATCH_MOUNT],
        "securityContext": container_security(),
    }


def _api_keys(settings: RenderSettings) -> list[dict[str, Any]]:
    if settings.router_api_keys is None:
        return []
    secret, key = settings.router_api_keys
    ref = {"secretKeyRef": {"name": secret, "key": key}}
    return [{"name": API_KEYS_ENV, "valueFrom": ref}]


def router_manifests(deployment: DeploymentCard, settings: RenderSettings) -> list[dict[str, Any]]:
    name, selector = router_object(deployment.name), router_selector(deployment.name)
    labels = common(deployment.name, "router")
    replicas = deployment.spec.router.replicas
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "labels": labels},
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name}],
    }
    router = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "securityContext": pod_security(),
                    "containers": [router_container(deployment, settings)],
                    "volumes": [cards_volume(deployment), SCRATCH_VOLUME],
                },
            },
        },
    }
    service = http_service(name, labels, selector, ROUTER_PORTS[HTTP_PORT], headless=False)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels},
        "spec": {"maxUnavailable": 1 if replicas > 1 else 0, "selector": {"matchLabels": selector}},
    }
    return [account, role, binding, router, service, pdb]
