"""Plain-JSON access to a Kubernetes API server: requests, server-side apply, watches.

Owns the HTTP calls of the operator, the e2e harness and its tests (no typed models:
manifests stay the dicts a user would write); never caches objects.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client, config

Json = dict[str, Any]
POOL_SIZE = 32
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# kind -> (API prefix, plural) of the kinds the operator applies; all namespaced.
RESOURCES = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Pod": ("/api/v1", "pods"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "ModelCard": ("/apis/loom.dev/v1alpha1", "modelcards"),
    "DeploymentCard": ("/apis/loom.dev/v1alpha1", "deploymentcards"),
    "RoleScale": ("/apis/loom.dev/v1alpha1", "rolescales"),
}


def object_path(kind: str, namespace: str, name: str = "", sub: str = "") -> str:
    """The URL path of a namespaced object (or of its collection, without a name)."""
    prefix, plural = RESOURCES[kind]
    path = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    if name:
        path += f"/{quote(name)}"
    if sub:
        path += f"/{sub}"
    return path


class KubeError(RuntimeError):
    """A non-2xx answer: its HTTP status and the API server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class Kube:
    """One API server, as the admin kubeconfig, a given kubeconfig or the pod's account sees it."""

    def __init__(self, kubeconfig: Path | None = None) -> None:
        """`kubeconfig`, else the in-cluster service account, else $KUBECONFIG / ~/.kube/config."""
        self.requests: Counter[str] = Counter()  # sent, by HTTP method (a watch is a GET)
        configuration = client.Configuration()
        if kubeconfig is not None:
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        # Fleet rounds of many cards call from several threads at once: one pool slot each.
        configuration.connection_pool_maxsize = POOL_SIZE
        self._api = client.ApiClient(configuration)

    @property
    def server(self) -> str:
        return str(self._api.configuration.host)

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] = 30.0,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        self.requests[method] += 1
        method, url, headers, body, _ = self._api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return self._api.call_api(method, url, headers, body, _request_timeout=timeout)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Json:
        resp = self._send(method, path, body, query, content_type)
        data = resp.read()
        if not 200 <= resp.status < 300:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")
            raise KubeError(resp.status, message)
        out: Json = json.loads(data) if data else {}
        return out

    def get(self, path: str, **query: Any) -> Json:
        return self.call("GET", path, query=query)

    def create(self, path: str, body: Json) -> Json:
        return self.call("POST", path, body)

    def patch(self, path: str, body: Json, content_type: str = MERGE) -> Json:
        return self.call("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: Json | None = None) -> Json:
        return self.call("DELETE", path, body)

    def apply(self, manifest: Json, field_manager: str) -> Json:
        """Server-side apply of a whole manifest under `field_manager` (conflicts forced: the
        operator owns what it renders)."""
        meta = manifest["metadata"]
        path = object_path(manifest["kind"], meta["namespace"], meta["name"])
        query = {"fieldManager": field_manager, "force": "true"}
        return self.call("PATCH", path, manifest, query=query, content_type=APPLY)

    def watch(self, path: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, Json]]:
        """(type, object) events from `resource_version` on, until the server ends the watch."""
        query = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": timeout_s}
        resp = self._send("GET", path, query=query, timeout=(10.0, timeout_s + 10.0))
        if resp.status != 200:
            raise KubeError(resp.status, resp.read().decode(errors="replace"))
        try:
            for line in resp.response:
                if line.strip():
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        raise KubeError(int(event["object"].get("code", 500)), str(event["object"]))
                    yield event["type"], event["object"]
        finally:
            resp.response.release_conn()


def pod_path(namespace: str, name: str = "", sub: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace)}/pods"
    if name:
        path += f"/{quote(name)}"
    if sub:
        path += f"/{sub}"
    return path
