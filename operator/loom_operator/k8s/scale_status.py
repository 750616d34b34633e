"""What the operator writes about scaling: a RoleScale's status, the card's `Autoscaling`
condition from the planner's latest plan, and whether the scaler already owns a StatefulSet's
replicas.

Pure over plain data and listed objects; never writes (k8s/scaler.py does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loom_operator.fleet.autoscale import AUTOSCALING, AutoscalePlan

Obj = Mapping[str, Any]


def role_scale_status(
    serving: int, desired: int, selector: str, taken: int | None, reason: str
) -> dict[str, Any]:
    """A RoleScale's status: the scale subresource's replicas and selector, the count the role
    runs toward, the generation taken in and who decided."""
    out: dict[str, Any] = {"replicas": serving, "desiredReplicas": desired,
                           "selector": selector, "reason": reason}  # fmt: skip
    if taken is not None:
        out["observedGeneration"] = taken
    return out


def autoscaling_condition(plan: AutoscalePlan, generation: int) -> dict[str, Any]:
    """`Autoscaling=True` with the plan's summary (AutoscalePlan.summary)."""
    reason, message = plan.summary()
    return {"type": AUTOSCALING, "status": "True", "reason": reason, "message": message,
            "observedGeneration": generation}  # fmt: skip


def owns_replicas(statefulset: Obj, manager: str) -> bool:
    """`manager` is among the owners of the StatefulSet's spec.replicas (server-side apply)."""
    for entry in (statefulset.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in spec:
            return True
    return False
