"""The router's pod watch: list, then watch, and relist after any break.

The API is a scripted test double of list and watch (the two callables PodWatch takes); the real
API server's watch is exercised by the e2e suite, where the router finds its worker pods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from loom_router.core.endpoints import StaticEndpoints
from loom_router.shell.pod_watch import PodWatch

Pod = dict[str, Any]


def worker(name: str, ip: str, version: str = "v1") -> Pod:
    ports = [{"name": "http", "containerPort": 8000}]
    return {
        "metadata": {"name": name, "labels": {"loom.dev/role": "decode"},
                     "annotations": {"loom.dev/weights-version": version}},
        "spec": {"containers": [{"name": "runtime", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


class ScriptedApi:
    """Test double of the pod API: each list returns the next scripted pod set; the first watch
    streams `events` then breaks (a dropped connection), later watches idle until stopped."""

    def __init__(self, lists: list[list[Pod]], events: list[tuple[str, Pod]]) -> None:
        self.lists, self.events = lists, events
        self.listed = 0
        self.watches = 0
        self.stop = threading.Event()

    def list_pods(self, namespace: str, selector: str) -> tuple[list[Pod], str]:
        pods = self.lists[min(self.listed, len(self.lists) - 1)]
        self.listed += 1
        return pods, str(self.listed)

    def watch_pods(self, namespace: str, selector: str, version: str) -> Iterator[tuple[str, Pod]]:
        self.watches += 1
        if self.watches == 1:
            yield from self.events
            raise ConnectionResetError("watch connection dropped")
        while not self.stop.wait(0.05):
            pass
        return


def ids(source: StaticEndpoints) -> set[str]:
    return {e.id for e in source.snapshot().endpoints}


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_pod_deleted_while_the_watch_was_down_is_dropped_after_the_relist() -> None:
    a, b = worker("w-decode-0", "127.0.9.1"), worker("w-decode-1", "127.0.9.2")
    api = ScriptedApi(
        lists=[[a, b], [a]], events=[("MODIFIED", worker("w-decode-1", "127.0.9.2", "v2"))]
    )
    source = StaticEndpoints()
    watch = PodWatch(source, "ns", "loom.dev/deployment=w", api.list_pods, api.watch_pods)
    watch.start()
    try:
        wait_until(lambda: api.listed >= 2)  # the watch broke and was relisted
        wait_until(lambda: ids(source) == {"w-decode-0"})
        assert watch.synced.is_set()
    finally:
        watch.stop()
        api.stop.set()


def test_watch_events_add_update_and_remove_endpoints() -> None:
    a = worker("w-decode-0", "127.0.9.1")
    b = worker("w-decode-1", "127.0.9.2")
    a2 = worker("w-decode-0", "127.0.9.1", "v2")
    events = [("ADDED", b), ("MODIFIED", a2), ("DELETED", b)]
    seen: list[set[str]] = []
    source = StaticEndpoints()
    api = ScriptedApi(lists=[[a], [a2]], events=events)

    def record(*_: Any) -> None:
        seen.append(ids(source))

    source.subscribe(record)
    watch = PodWatch(source, "ns", "sel", api.list_pods, api.watch_pods)
    watch.start()
    try:
        wait_until(lambda: api.listed >= 2)
        assert {"w-decode-0", "w-decode-1"} in seen  # b was added before it was deleted
        wait_until(lambda: ids(source) == {"w-decode-0"})
        (e,) = source.snapshot().endpoints
        assert e.weights_version == "v2"
    finally:
        watch.stop()
        api.stop.set()
