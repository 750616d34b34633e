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
