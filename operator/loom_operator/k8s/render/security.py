"""How every pod Loom renders is locked down: a non-root user, a read-only root filesystem, no
capabilities, and one scratch volume that is the only place a container writes.

Pure; the one definition the workers and the router follow (the chart's operator pod too, which
its test checks). The images' user is 65532 and their HOME and LOOM_CACHE are SCRATCH
(images/*/Dockerfile).
"""

from __future__ import annotations

from typing import Any

USER = 65532
SCRATCH = "/var/cache/loom"
"""Generated checkpoints, compiled kernels, temporary files: an emptyDir, as TMPDIR too."""


def pod_security() -> dict[str, Any]:
    """The pod's securityContext: never root; volumes owned by the image's group."""
    return {"runAsNonRoot": True, "runAsUser": USER, "runAsGroup": USER, "fsGroup": USER,
            "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip


def container_security() -> dict[str, Any]:
    """A container's securityContext: read-only root, no privilege escalation, no capabilities."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}  # fmt: skip


SCRATCH_VOLUME = {"name": "scratch", "emptyDir": {}}
SCRATCH_MOUNT = {"name": "scratch", "mountPath": SCRATCH}
SCRATCH_ENV = {"name": "TMPDIR", "value": SCRATCH}
