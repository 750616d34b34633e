"""How the operator renders pods: images and the command that starts Loom in them.

Owns the operator's rendering settings and their defaults (flags of `loom operator`); never
reads the environment itself.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderSettings:
    runtime_image: str = "ghcr.io/loom-serving/loom-runtime:0.1.0"
    """The image of worker pods (images/runtime); the stand-in kubelet of the e2e harness runs
    the command without it."""
    router_image: str = "ghcr.io/loom-serving/loom-operator:0.1.0"
    """The image of router pods (the operator image carries the router)."""
    loom: tuple[str, ...] = ("loom",)
    """How a pod starts Loom: the `loom` entrypoint both images put on PATH."""
    kv_connector: str | None = None
    """--kv-connector of P/D workers (nixl | tcp); None: the runtime's default."""
    router_api_keys: tuple[str, str] | None = None
    """(Secret name, key) in each card's namespace holding the router's API keys, comma-separated;
    None: the router accepts any request."""
    network_policies: bool = False
    """Render each deployment's NetworkPolicies (render/network.py)."""
    operator_namespace: str = "default"
    """Where the operator's pods run (what the NetworkPolicies admit to control ports)."""
    operator_labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "loom-operator"),)
    """Labels of the operator's pods (the chart sets them)."""
    metrics_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods may scrape the workers' /metrics through the NetworkPolicies."""
