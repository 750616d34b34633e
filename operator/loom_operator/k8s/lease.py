"""The coordination.k8s.io Lease as the operator's replicas use it: who holds one, whether its
holder is still alive, and the body that takes, renews or gives one up.

Pure functions over the Lease's JSON; the leader elector and the shard keeper own the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

API = "/apis/coordination.k8s.io/v1"
_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

Lease = Mapping[str, Any]


def leases_path(namespace: str, name: str = "") -> str:
    path = f"{API}/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    for fmt in (_FORMAT, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def holder(lease: Lease | None) -> str | None:
    """Who holds the lease (None: free, or nobody at all)."""
    if lease is None:
        return None
    return (lease.get("spec") or {}).get("holderIdentity") or None


def live(lease: Lease | None, now: datetime) -> bool:
    """True while the lease has a holder that renewed it within its duration."""
    if holder(lease) is None:
        return False
    assert lease is not None
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return renewed is not None and now < renewed + timedelta(seconds=duration)


def lease_body(
    name: str,
    namespace: str,
    identity: str | None,
    duration_s: float,
    lease: Lease | None,
    now: datetime,
    *,
    acquire: bool,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Lease to create or PUT: held by `identity` (None: given up) and renewed now. A PUT
    carries the read resourceVersion, so a replica that lost a race is refused (409), never
    overwrites the winner."""
    spec = dict((lease or {}).get("spec") or {})
    spec |= {"holderIdentity": identity, "leaseDurationSeconds": int(duration_s),
             "renewTime": now.strftime(_FORMAT) if identity else None}  # fmt: skip
    if acquire:
        spec |= {"acquireTime": now.strftime(_FORMAT),
                 "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1}  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    if lease is not None:
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": spec}  # fmt: skip
