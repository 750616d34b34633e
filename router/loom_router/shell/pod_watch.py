"""The Kubernetes endpoint source: watch a deployment's pods, keep the endpoint list in step.

Owns the list-then-watch loop (relisting after any break, so a pod deleted while the watch
was down is dropped); never decides what a pod means (core/pod_endpoints.py does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from loom_router.core.endpoints import StaticEndpoints
from loom_router.core.pod_endpoints import reconcile_endpoints
from loom_router.errors import EndpointError

logger = logging.getLogger(__name__)

Pod = dict[str, Any]
# (namespace, label selector) -> (pods, resourceVersion) and (…, resourceVersion) -> events.
ListPods = Callable[[str, str], tuple[list[Pod], str]]
WatchPods = Callable[[str, str, str], Iterator[tuple[str, Pod]]]

RELIST_BACKOFF_S = 1.0


class PodWatch:
    """Keeps `source` equal to the worker pods matching `selector` in `namespace`."""

    def __init__(
        self,
        source: StaticEndpoints,
        namespace: str,
        selector: str,
        list_pods: ListPods,
        watch_pods: WatchPods,
    ) -> None:
        self.source, self.namespace, self.selector = source, namespace, selector
        self._list, self._watch = list_pods, watch_pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self.synced = threading.Event()
        """Set once the first list has been applied."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, pods: dict[str, Pod]) -> None:
        add, update, remove = reconcile_endpoints(self.source.snapshot(), pods.values())
        try:
            for endpoint_id in remove:
                self.source.remove(endpoint_id)
            for endpoint in update:
                self.source.update(endpoint)
            for endpoint in add:
                self.source.add(endpoint)
        except EndpointError as exc:  # an admin changed the list meanwhile; the next event mends it
            logger.warning("pod watch: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                items, version = self._list(self.namespace, self.selector)
                pods = {p["metadata"]["name"]: p for p in items}
                self._apply(pods)
                self.synced.set()
                for kind, pod in self._watch(self.namespace, self.selector, version):
                    if self._stop.is_set():
                        return
                    name = pod["metadata"]["name"]
                    if kind == "DELETED":
                        pods.pop(name, None)
                    else:
                        pods[name] = pod
                    self._apply(pods)
            except Exception as exc:  # any break of the watch: relist, never keep a dead backend
                if not self._stop.is_set():
                    logger.warning("pod watch of %s interrupted, relisting: %s", self.selector, exc)
            self._stop.wait(RELIST_BACKOFF_S)


def kubernetes_pod_api() -> tuple[ListPods, WatchPods]:
    """List and watch functions over the in-cluster API (or $KUBECONFIG outside a cluster)."""
    from kubernetes import client, config, watch

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    api = client.ApiClient()
    core = client.CoreV1Api(api)

    def list_pods(namespace: str, selector: str) -> tuple[list[Pod], str]:
        pod_list = core.list_namespaced_pod(namespace, label_selector=selector)
        listed = api.sanitize_for_serialization(pod_list)  # type: ignore[no-untyped-call]
        return list(listed.get("items") or []), str(listed["metadata"]["resourceVersion"])

    def watch_pods(namespace: str, selector: str, version: str) -> Iterator[tuple[str, Pod]]:
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version=version,
            timeout_seconds=60,
        )
        for event in stream:
            yield str(event["type"]), dict(event["raw_object"])

    return list_pods, watch_pods
