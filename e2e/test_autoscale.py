"""Each role a scale target, and Loom's planner, on the real control plane: `kubectl scale` on a
role's RoleScale changes its pods (and the card's replicas), a scale-down never deletes a pod
while it still streams, an autoscaling/v2 HorizontalPodAutoscaler targeting a role is accepted and
resolves its scale target, and the planner scales decode up under load and back down with no
failed or cut request, and a role scaled to zero serves its first request (held by the router
while the planner starts a worker) and goes back to zero once idle.

The operator runs as a process with the admin kubeconfig; its pods run on the stand-in kubelet
(pod IPs reachable from the test, which reads a worker's /metrics).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.conftest import wait_for
from e2e.fleet_helpers import Operator, card, condition, operator_namespace, pods, ready, router_url
from e2e.providers import REPO, Cluster

pytestmark = pytest.mark.timeout(600)

TINY_PD = list(yaml.safe_load_all((REPO / "examples" / "tiny-pd.yaml").read_text()))
TINY_AGGREGATED = list(yaml.safe_load_all((REPO / "examples" / "tiny-aggregated.yaml").read_text()))
DECODE = "loom.dev/deployment={},loom.dev/role=decode"
AGGREGATED = "loom.dev/deployment={},loom.dev/role=aggregated"


@pytest.fixture(scope="module")
def operator_ns(cluster: Cluster) -> Iterator[str]:
    name = operator_namespace(cluster)
    operator = Operator(cluster, name, "scale")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        operator.stop()


def apply_cards(cluster: Cluster, ns: str, name: str, spec: dict[str, Any]) -> None:
    model, deployment = yaml.safe_load(yaml.safe_dump(TINY_PD))
    deployment["metadata"] = {"name": name}
    deployment["spec"] |= spec
    docs = yaml.safe_dump_all([model, deployment])
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=docs)


def role_scale(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "rolescale", name, "-n", ns, "-o", "json")
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def decode_pods(cluster: Cluster, ns: str, card_name: str) -> list[dict[str, Any]]:
    return pods(cluster, ns, DECODE.format(card_name))


def running(pod: dict[str, Any]) -> float:
    """The worker's `vllm:num_requests_running` (0 when it no longer answers)."""
    url = f"http://{pod['status']['podIP']}:8000/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return 0.0
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running")]
    return sum(float(ln.split()[-1]) for ln in lines)


class Streams:
    """`clients` threads streaming completions of `max_tokens` tokens until stopped; every
    stream checked whole (its length reached, or the model's end of text)."""

    def __init__(self, url: str, clients: int, max_tokens: int) -> None:
        self.client = OpenAI(base_url=url, api_key="unused", timeout=300, max_retries=0)
        self.max_tokens, self.done, self.failed = max_tokens, 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                stream = self.client.completions.create(
                    model="tiny", prompt=f"{i}-{n} once upon a time", max_tokens=self.max_tokens,
                    stream=True, stream_options={"include_usage": True},
                )  # fmt: skip
                finish, tokens = None, 0
                for event in stream:
                    finish = next((c.finish_reason for c in event.choices if c.finish_reason),
                                  finish)  # fmt: skip
                    tokens = event.usage.completion_tokens if event.usage else tokens
                whole = finish == "stop" or (finish == "length" and tokens == self.max_tokens)
                assert whole, (finish, tokens)
                self.done += 1
            except Exception as exc:  # counted: the point is that there are none
                self.failed.append(repr(exc))

    def __enter__(self) -> Streams:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(300)


def test_kubectl_scale_on_a_role_changes_its_pods_and_never_deletes_a_streaming_one(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    apply_cards(cluster, ns, "scaled", {})
    wait_for(lambda: ready(cluster, ns, "scaled"), 300, "scaled Ready")
    wait_for(lambda: role_scale(cluster, ns, "scaled-decode")["spec"].get("replicas") == 1, 60,
             "the decode RoleScale to mirror the card")  # fmt: skip

    cluster.kubectl("scale", "rolescale", "scaled-decode", "-n", ns, "--replicas=2")
    two = wait_for(lambda: ready(cluster, ns, "scaled", decode=2), 300, "two decode workers")
    assert two["spec"]["roles"]["decode"]["replicas"] == 2  # written into the card
    assert two["status"]["replicas"] == "prefill 1/1, decode 2/2"
    table = cluster.kubectl("get", "deploymentcards", "scaled", "-n", ns).stdout
    assert "decode 2/2" in table, table

    with Streams(router_url(cluster, ns, "scaled"), clients=4, max_tokens=400) as load:
        (busy,) = [p for p in decode_pods(cluster, ns, "scaled")
                   if p["metadata"]["name"] == "scaled-decode-1"]  # fmt: skip
        wait_for(lambda: running(busy) > 0, 120, "a stream on scaled-decode-1")
        cluster.kubectl("scale", "rolescale", "scaled-decode", "-n", ns, "--replicas=1")
        killed_busy: list[float] = []

        def gone() -> bool:
            live = [p for p in decode_pods(cluster, ns, "scaled")
                    if p["metadata"]["name"] == "scaled-decode-1"]  # fmt: skip
            if live and live[0]["metadata"].get("deletionTimestamp"):
                n = running(live[0])
                if n > 0:
                    killed_busy.append(n)
            return not live or bool(live[0]["metadata"].get("deletionTimestamp"))

        wait_for(gone, 300, "scaled-decode-1 drained and removed", interval=0.1)
        assert not killed_busy, f"the pod was deleted with {killed_busy[0]:g} requests running"
        before = load.done
        wait_for(lambda: load.done >= before + 2, 300, "requests on one decode")
    assert not load.failed, load.failed[:3]
    back = card(cluster, ns, "scaled")
    assert back["spec"]["roles"]["decode"]["replicas"] == 1
    wait_for(lambda: len(decode_pods(cluster, ns, "scaled")) == 1, 120, "one decode pod")
    cluster.kubectl("delete", "deploymentcard", "scaled", "-n", ns, "--wait=false")


def test_an_hpa_targeting_a_role_is_accepted_and_its_scale_target_resolves(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    apply_cards(cluster, ns, "hpa", {})
    wait_for(lambda: ready(cluster, ns, "hpa"), 300, "hpa Ready")
    wait_for(lambda: role_scale(cluster, ns, "hpa-decode")["status"].get("replicas") == 1, 60,
             "the decode RoleScale's status")  # fmt: skip
    raw = cluster.kubectl(
        "get", "--raw", f"/apis/loom.dev/v1alpha1/namespaces/{ns}/rolescales/hpa-decode/scale"
    ).stdout
    scale = json.loads(raw)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
    assert scale["status"]["selector"] == DECODE.format("hpa")
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "hpa-decode"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "loom.dev/v1alpha1", "kind": "RoleScale",
                               "name": "hpa-decode"},
            "minReplicas": 1, "maxReplicas": 2,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(hpa))

    def resolved() -> dict[str, Any] | None:
        out = cluster.kubectl("get", "hpa", "hpa-decode", "-n", ns, "-o", "json").stdout
        got: dict[str, Any] = json.loads(out)
        able = condition(got, "AbleToScale")
        read = (got.get("status") or {}).get("currentReplicas") == 1
        return got if able.get("reason") == "SucceededGetScale" and read else None

    got = wait_for(resolved, 180, "the HPA to read its scale target")
    assert condition(got, "AbleToScale")["status"] == "True"
    listed = cluster.kubectl("get", "hpa", "-n", ns).stdout
    assert "RoleScale/hpa-decode" in listed, listed
    cluster.kubectl("delete", "hpa", "hpa-decode", "-n", ns)
    cluster.kubectl("delete", "deploymentcard", "hpa", "-n", ns, "--wait=false")


def test_the_planner_scales_decode_up_under_load_and_back_down_losing_nothing(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    roles = yaml.safe_load(yaml.safe_dump(TINY_PD[1]["spec"]["roles"]))
    roles["decode"]["engine"]["maxNumSeqs"] = 2  # a queue forms on one decode worker
    apply_cards(cluster, ns, "planned", {
        "roles": roles,
        "autoscaling": {"decode": {"min": 1, "max": 2}, "targets": {"queue": 1, "kvUsage": 1.0},
                        "scaleUpSeconds": 0, "scaleDownSeconds": 15},
    })  # fmt: skip
    wait_for(lambda: ready(cluster, ns, "planned"), 300, "planned Ready")
    with Streams(router_url(cluster, ns, "planned"), clients=8, max_tokens=64) as load:
        grown = wait_for(lambda: ready(cluster, ns, "planned", decode=2), 300, "two decode")
        assert role_scale(cluster, ns, "planned-decode")["spec"]["replicas"] == 2
        scaling = condition(grown, "Autoscaling")
        assert scaling["status"] == "True", scaling
        before = load.done
        wait_for(lambda: load.done >= before + 4, 300, "requests on two decode workers")
    assert not load.failed, load.failed[:3]
    wait_for(lambda: len(decode_pods(cluster, ns, "planned")) == 1, 300, "decode back to one")
    assert role_scale(cluster, ns, "planned-decode")["spec"]["replicas"] == 1
    said = autoscale_events(cluster, ns, "planned")
    assert any(m.startswith("scaling up decode 1 → 2 (QueueAboveTarget") for m in said), said
    assert any(m.startswith("scaling down decode 2 → 1") for m in said), said


def test_a_role_scaled_to_zero_serves_its_first_request_without_an_error(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    model, deployment = yaml.safe_load(yaml.safe_dump(TINY_AGGREGATED))
    deployment["metadata"] = {"name": "zero"}
    deployment["spec"]["roles"]["aggregated"]["replicas"] = 0
    deployment["spec"]["autoscaling"] = {
        "aggregated": {"min": 0, "max": 1}, "scaleUpSeconds": 0, "scaleDownSeconds": 10,
    }  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all([model, deployment]))

    def idle() -> dict[str, Any] | None:
        got = card(cluster, ns, "zero")
        at_zero = condition(got, "Ready").get("reason") == "ScaledToZero"
        return got if at_zero and not pods(cluster, ns, AGGREGATED.format("zero")) else None

    wait_for(idle, 300, "the card at zero, with no worker")
    url = wait_for(lambda: router_ready_url(cluster, ns, "zero"), 300, "the router")
    client = OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    started = time.monotonic()
    reply = client.completions.create(model="tiny", prompt="Once", max_tokens=8)
    first = time.monotonic() - started
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    print(f"first request from zero answered in {first:.1f}s")  # a measurement, not a bound
    said = autoscale_events(cluster, ns, "zero")
    assert any(m.startswith("scaling up aggregated 0 → 1 (ScaleFromZero") for m in said), said
    wait_for(idle, 300, "the card back at zero once idle")
    said = autoscale_events(cluster, ns, "zero")
    assert any(m.startswith("scaling down aggregated 1 → 0") for m in said), said
    cluster.kubectl("delete", "deploymentcard", "zero", "-n", ns, "--wait=false")


def router_ready_url(cluster: Cluster, ns: str, name: str) -> str | None:
    """The card's router URL once its pod is ready (it holds requests from then on)."""
    selector = f"loom.dev/deployment={name},app.kubernetes.io/component=router"
    live = [p for p in pods(cluster, ns, selector) if not p["metadata"].get("deletionTimestamp")]
    up = [p for p in live if condition(p, "Ready").get("status") == "True"]
    return router_url(cluster, ns, name) if up else None


def events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    """The card's Events."""
    out = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def autoscale_events(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The planner's decisions on the card, as its Events say them."""
    return [e["message"] for e in events(cluster, ns, name) if e["reason"] == "Autoscale"]


def test_a_role_the_card_drops_is_drained_and_its_objects_deleted(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    apply_cards(cluster, ns, "switch", {})
    wait_for(lambda: ready(cluster, ns, "switch"), 300, "switch Ready (P/D)")
    aggregated = yaml.safe_load(yaml.safe_dump(TINY_AGGREGATED[1]["spec"]["roles"]))
    with Streams(router_url(cluster, ns, "switch"), clients=2, max_tokens=64) as load:
        apply_cards(cluster, ns, "switch", {"roles": aggregated})  # P/D → aggregated

        def switched() -> bool:
            got = ready(cluster, ns, "switch")
            left = [
                p["metadata"]["name"]
                for p in pods(cluster, ns, "loom.dev/deployment=switch")
                if p["metadata"]["labels"].get("loom.dev/role") in ("prefill", "decode")
            ]
            return got is not None and not left

        wait_for(switched, 300, "the aggregated worker serving and the P/D pods gone")
        before = load.done
        wait_for(lambda: load.done >= before + 2, 120, "requests on the aggregated worker")
    assert not load.failed, load.failed[:3]
    names = [f"{kind}/switch-{role}" for kind in ("statefulset", "service", "rolescale")
             for role in ("prefill", "decode")]  # fmt: skip

    def left() -> list[str]:
        out = cluster.kubectl("get", *names, "-n", ns, "--ignore-not-found", "-o", "name")
        return out.stdout.split()

    wait_for(lambda: not left(), 60, f"{', '.join(names)} deleted")
    said = [e["message"] for e in events(cluster, ns, "switch") if e["reason"] == "RoleRemoved"]
    assert sorted(m.split()[0] for m in said) == ["decode", "prefill"], said
    cluster.kubectl("delete", "deploymentcard", "switch", "-n", ns, "--wait=false")
