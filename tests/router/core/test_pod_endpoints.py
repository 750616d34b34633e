"""Worker pods as endpoints: the operator's labels, annotations and status, read by the router."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.pod_endpoints import endpoint_from_pod, reconcile_endpoints


def worker(name: str = "w-decode-0", ip: str | None = "127.0.10.3", **kw: Any) -> dict[str, Any]:
    ready = kw.pop("ready", True)
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"loom.dev/deployment": "w", "loom.dev/role": kw.pop("role", "decode")},
        "annotations": {"loom.dev/weights-version": "v1", **kw.pop("annotations", {})},
        **kw.pop("meta", {}),
    }
    named = {"http": 8000, "control": 50051, "kv-events": 5557, "kv-replay": 5558}
    ports = [{"name": n, "containerPort": p} for n, p in named.items()]
    ready_cond = {"type": "Ready", "status": "True" if ready else "False"}
    status: dict[str, Any] = {"phase": kw.pop("phase", "Running"), "conditions": [ready_cond]}
    if ip:
        status["podIP"] = ip
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "runtime", "ports": ports}]},
        "status": status,
    }


def test_a_ready_worker_pod_is_a_routable_endpoint() -> None:
    e = endpoint_from_pod(worker())
    events, replay = "tcp://127.0.10.3:5557", "tcp://127.0.10.3:5558"
    expected = Endpoint("w-decode-0", "http://127.0.10.3:8000", "decode", "v1", ready=True,
                        kv_events=events, kv_replay=replay)  # fmt: skip
    assert e == expected
    assert e is not None and e.routable


@pytest.mark.parametrize(
    ("pod", "routable"),
    [
        (worker(ready=False), False),
        (worker(annotations={"loom.dev/draining": "true"}), False),
        (worker(meta={"deletionTimestamp": "2026-12-01T00:00:00Z"}), False),  # Terminating
        (worker(annotations={"loom.dev/draining": "false"}), True),
        (worker(annotations={"loom.dev/weights-version": ""}), False),  # not admitted yet
    ],
)
def test_not_ready_draining_and_terminating_pods_take_no_new_requests(
    pod: dict[str, Any], routable: bool
) -> None:
    e = endpoint_from_pod(pod)
    assert e is not None and e.routable is routable


@pytest.mark.parametrize(
    "pod",
    [worker(ip=None), worker(role="router"), worker(phase="Failed"), worker(phase="Succeeded")],
)
def test_pods_that_are_no_endpoint(pod: dict[str, Any]) -> None:
    assert endpoint_from_pod(pod) is None


def test_reconcile_adds_updates_and_removes_and_keeps_a_down_mark_of_the_same_pod() -> None:
    old_a = Endpoint("a", "http://127.0.10.2:8000", "decode", "v1", down=True)
    old_b = Endpoint("b", "http://127.0.10.9:8000", "decode", "v1", down=True)
    gone = Endpoint("gone", "http://127.0.10.7:8000", "decode", "v1")
    current = EndpointSnapshot((old_a, old_b, gone))
    pods = [worker("a", "127.0.10.2", annotations={"loom.dev/weights-version": "v2"}),
            worker("b", "127.0.10.4"), worker("c", "127.0.10.5")]  # fmt: skip
    add, update, remove = reconcile_endpoints(current, pods)
    assert [e.id for e in add] == ["c"] and remove == ["gone"]
    by_id = {e.id: e for e in update}
    assert by_id["a"].down and by_id["a"].weights_version == "v2"  # same pod: still down
    assert not by_id["b"].down  # a new pod at a new address starts up
    assert reconcile_endpoints(EndpointSnapshot((*add, *update)), pods) == ([], [], [])
