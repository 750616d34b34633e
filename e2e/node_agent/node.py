"""The Node objects a stand-in agent registers, their status and their heartbeat Lease.

Owns the pure manifests; never decides which pods a node runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

AGENT_LABEL = "loom.dev/node-agent"
KUBELET_VERSION = "v1.36.3"
LEASE_SECONDS = 40


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                AGENT_LABEL: "true",
            },
        },
        "spec": {},
    }


def node_status(cpu: str, memory: str, pods: int) -> dict[str, Any]:
    now = _now()
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi"}

    def cond(kind: str, status: str, reason: str) -> dict[str, str]:
        return {
            "type": kind, "status": status, "reason": reason, "message": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }  # fmt: skip

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "loom e2e stand-in kubelet",
            "containerRuntimeVersion": "loom-e2e://processes",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def lease_manifest(name: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now},
    }
