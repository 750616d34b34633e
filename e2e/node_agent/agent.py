"""The stand-in kubelet's main loop: registers its Nodes, keeps their Leases, runs their pods.

Owns the node registrations, the pod watch and which runner holds which pod (and pod IP);
never changes a pod's spec and never touches pods bound to other nodes.
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from e2e.node_agent.ips import IPPool
from e2e.node_agent.node import lease_manifest, node_manifest, node_status
from e2e.node_agent.pod_runner import PodRunner, Settings
from loom_operator.k8s.kube import STRATEGIC, Kube, KubeError, pod_path

logger = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
STATUS_S = 30.0
RESYNC_S = 10.0
SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pod_cidr: str  # a /24 of 127.0.0.0/8
    cpu: str = "2"
    memory: str = "24Gi"
    pods: int = 110


class NodeAgent:
    def __init__(self, kube: Kube, nodes: list[NodeSpec], settings: Settings) -> None:
        self.kube = kube
        self.nodes = {n.name: n for n in nodes}
        self.pools = {n.name: IPPool(n.pod_cidr) for n in nodes}
        self.settings = settings
        self._runners: dict[str, PodRunner] = {}
        self._owner: dict[str, str] = {}  # pod uid -> node name
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    # -- nodes --------------------------------------------------------------------------------
    def register(self) -> None:
        for spec in self.nodes.values():
            try:
                self.kube.create("/api/v1/nodes", node_manifest(spec.name))
            except KubeError as exc:
                if exc.status != 409:
                    raise
            self._patch_status(spec)
            self._renew(spec.name)
        logger.info("registered nodes %s", ", ".join(self.nodes))

    def _patch_status(self, spec: NodeSpec) -> None:
        body = {"status": node_status(spec.cpu, spec.memory, spec.pods)}
        self.kube.patch(f"/api/v1/nodes/{spec.name}/status", body, STRATEGIC)

    def _renew(self, name: str) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        lease = lease_manifest(name)
        try:
            self.kube.patch(f"{path}/{name}", {"spec": lease["spec"]})
        except KubeError as exc:
            if exc.status != 404:
                raise
            self.kube.create(path, lease)

    def heartbeat_forever(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(HEARTBEAT_S):
            try:
                for name in self.nodes:
                    self._renew(name)
                if time.monotonic() - last_status >= STATUS_S:
                    for spec in self.nodes.values():
                        self._patch_status(spec)
                    last_status = time.monotonic()
            except (KubeError, OSError) as exc:
                logger.warning("heartbeat failed: %s", exc)

    # -- pods ---------------------------------------------------------------------------------
    def handle(self, pod: dict[str, Any], deleted: bool = False) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in self.nodes:
            return
        uid = meta["uid"]
        with self._lock:
            runner = self._runners.get(uid)
            if deleted:
                if runner is not None:
                    runner.terminate(0.0, delete=False)
                return
            if meta.get("deletionTimestamp"):
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                if runner is not None:
                    runner.terminate(grace)
                else:
                    self._delete_now(pod)
                return
            phase = (pod.get("status") or {}).get("phase")
            if runner is not None or phase in ("Succeeded", "Failed"):
                return
            ip = self.pools[node].take(uid)
            runner = PodRunner(
                self.kube,
                pod,
                ip,
                self.settings,
                functools.partial(self._lookup, meta["namespace"]),
                functools.partial(self._token, meta["name"], uid),
                self._runner_done,
            )
            self._runners[uid], self._owner[uid] = runner, node
        logger.info("starting pod %s/%s on %s at %s", meta["namespace"], meta["name"], node, ip)
        runner.start()

    def _runner_done(self, uid: str) -> None:
        with self._lock:
            self._runners.pop(uid, None)
            node = self._owner.pop(uid, None)
            if node is not None:
                self.pools[node].release(uid)

    def _delete_now(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.kube.delete(pod_path(meta["namespace"], meta["name"]), final_delete(meta["uid"]))
        except KubeError as exc:
            if exc.status not in (404, 409):
                logger.warning("delete of %s failed: %s", meta["name"], exc.message)

    def _lookup(self, namespace: str, kind: str, name: str) -> dict[str, str] | None:
        plural = "configmaps" if kind == "configMap" else "secrets"
        try:
            obj = self.kube.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        data: dict[str, str] = obj.get("data") or {}
        if kind == "secret":
            return {k: base64.b64decode(v).decode() for k, v in data.items()}
        return dict(data)

    def _token(
        self,
        pod_name: str,
        pod_uid: str,
        namespace: str,
        account: str,
        audience: str | None,
        seconds: int,
    ) -> str:
        """A projected service-account token, bound to the pod (the TokenRequest API)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        return str(self.kube.create(path, body)["status"]["token"])

    def watch_forever(self) -> None:
        """List, then watch from the list's resourceVersion; relist on any error or timeout."""
        while not self.stopping.is_set():
            try:
                listed = self.kube.get("/api/v1/pods")
                seen = set()
                for pod in listed.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self.handle(pod)
                self._forget_missing(seen)
                rv = listed["metadata"]["resourceVersion"]
                for kind, pod in self.kube.watch("/api/v1/pods", rv, int(RESYNC_S)):
                    if self.stopping.is_set():
                        break
                    self.handle(pod, deleted=kind == "DELETED")
            except (KubeError, OSError, ValueError) as exc:
                if not self.stopping.is_set():
                    logger.warning("pod watch failed, relisting: %s", exc)
                    time.sleep(1.0)

    def _forget_missing(self, seen: set[str]) -> None:
        with self._lock:
            gone = [r for uid, r in self._runners.items() if uid not in seen]
        for runner in gone:
            runner.terminate(0.0, delete=False)

    def shutdown(self) -> None:
        """Stop every pod's processes (the pods stay in the API, as when a kubelet dies)."""
        self.stopping.set()
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.terminate(SHUTDOWN_GRACE_S, delete=False)
        for runner in runners:
            runner.join(SHUTDOWN_GRACE_S + 5.0)


def final_delete(uid: str) -> dict[str, Any]:
    """The kubelet's last word on a pod: delete now, and only the pod with this uid."""
    return {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
