"""The operator on the real control plane: `kubectl apply` a card and get a served fleet.

The operator runs as a process with the admin kubeconfig (the Helm install, with its own
ServiceAccount, is the chart's suite); its pods run on the stand-in kubelet.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.conftest import wait_for
from e2e.fleet_helpers import (
    Operator,
    card,
    condition,
    invalid,
    operator_namespace,
    patch_card,
    pods,
    ready,
    router_url,
)
from e2e.providers import REPO, Cluster
from loom_operator.k8s.drift import REAPPLY_INTERVAL_S

pytestmark = pytest.mark.timeout(420)

TINY_PD = list(yaml.safe_load_all((REPO / "examples" / "tiny-pd.yaml").read_text()))


@pytest.fixture(scope="module")
def operator_ns(cluster: Cluster) -> Iterator[str]:
    """A namespace with an operator watching it."""
    name = operator_namespace(cluster)
    operator = Operator(cluster, name, "main")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        operator.stop()


class StreamingLoad:
    """Streaming chat requests, one after another on a thread, each checked to completion."""

    def __init__(self, url: str) -> None:
        self.client = OpenAI(base_url=url, api_key="unused", timeout=120)
        self.done, self.failed = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stream = self.client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "tell me a story"}],
                    max_tokens=24, stream=True,
                )  # fmt: skip
                finish = [c.choices[0].finish_reason for c in stream if c.choices]
                # A whole answer: it ends with a finish reason (a sampled EOS is a "stop").
                assert finish and finish[-1] in ("length", "stop"), finish
                self.done += 1
            except Exception as exc:
                self.failed.append(repr(exc))

    def __enter__(self) -> StreamingLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(180)


def test_apply_a_card_and_the_router_serves_it_disaggregated(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    cluster.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "tiny-pd.yaml"))
    got = wait_for(lambda: ready(cluster, ns, "tiny-pd"), 300, "tiny-pd Ready")
    status = got["status"]
    assert status["phase"] == "Ready" and status["readyRoles"] == "2/2"
    assert status["roles"]["prefill"] == {"ready": 1, "desired": 1, "weightsVersion": "v1"}
    assert status["roles"]["decode"] == {"ready": 1, "desired": 1, "weightsVersion": "v1"}
    assert status["observedGeneration"] == got["metadata"]["generation"]
    assert condition(got, "Valid")["status"] == "True"

    table = cluster.kubectl("get", "deploymentcards", "-n", ns).stdout.split("\n")
    assert table[0].split()[:4] == ["NAME", "PHASE", "READY", "VERSION"], table
    assert table[1].split()[:4] == ["tiny-pd", "Ready", "2/2", "v1"], table

    client = OpenAI(base_url=router_url(cluster, ns, "tiny-pd"), api_key="unused", timeout=60)
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6
    )
    assert out.usage is not None and out.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi again"}], max_tokens=6, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) >= 6
    # Disaggregated: the prefill worker computed the prompts.
    (prefill,) = pods(cluster, ns, "loom.dev/deployment=tiny-pd,loom.dev/role=prefill")
    metrics = OpenAI(base_url=f"http://{prefill['status']['podIP']}:8000", api_key="x").get(
        "/metrics", cast_to=str
    )
    prompt_tokens = [ln for ln in metrics.splitlines() if ln.startswith("vllm:prompt_tokens_total")]
    assert prompt_tokens and float(prompt_tokens[0].split()[-1]) > 0


def test_scale_decode_up_and_down_under_a_streaming_load(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    wait_for(lambda: ready(cluster, ns, "tiny-pd"), 300, "tiny-pd Ready")
    with StreamingLoad(router_url(cluster, ns, "tiny-pd")) as load:
        wait_for(lambda: load.done >= 2, 120, "the load to run")
        patch_card(cluster, ns, "tiny-pd", {"spec": {"roles": {"decode": {"replicas": 2}}}})
        two = wait_for(lambda: ready(cluster, ns, "tiny-pd", decode=2), 300, "two decode workers")
        assert two["status"]["roles"]["decode"]["desired"] == 2
        before = load.done
        wait_for(lambda: load.done >= before + 3, 120, "requests on the scaled fleet")
        patch_card(cluster, ns, "tiny-pd", {"spec": {"roles": {"decode": {"replicas": 1}}}})
        wait_for(
            lambda: len(pods(cluster, ns, "loom.dev/deployment=tiny-pd,loom.dev/role=decode")) == 1,
            180, "decode back to one pod",
        )  # fmt: skip
        before = load.done
        wait_for(lambda: load.done >= before + 3, 120, "requests after scaling down")
    assert not load.failed, load.failed


def test_a_decode_pod_deleted_mid_stream_finishes_its_request_and_comes_back(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    wait_for(lambda: ready(cluster, ns, "tiny-pd", decode=1), 300, "tiny-pd Ready, one decode")
    (decode,) = pods(cluster, ns, "loom.dev/deployment=tiny-pd,loom.dev/role=decode")
    client = OpenAI(base_url=router_url(cluster, ns, "tiny-pd"), api_key="unused", timeout=120)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a long story"}], max_tokens=200,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices
    cluster.kubectl("delete", "pod", decode["metadata"]["name"], "-n", ns, "--wait=false")
    seen: list[tuple[str, ...]] = []

    def capacity_lost() -> bool:
        degraded = condition(card(cluster, ns, "tiny-pd"), "Degraded")
        state = tuple(str(degraded.get(k, "")) for k in ("status", "reason", "message"))
        if not seen or seen[-1] != state:
            seen.append(state)
        return state[1] == "CapacityLost"

    try:
        wait_for(capacity_lost, 60, "Degraded=CapacityLost while the pod drains and is replaced")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; Degraded was, in turn: {seen}") from None
    rest = [c for c in chunks if c.choices]
    assert rest[-1].choices[0].finish_reason == "length", "the stream did not finish whole"
    assert len(rest) + 1 >= 200
    back = wait_for(lambda: ready(cluster, ns, "tiny-pd"), 300, "tiny-pd Ready again")
    (new,) = pods(cluster, ns, "loom.dev/deployment=tiny-pd,loom.dev/role=decode")
    assert new["metadata"]["uid"] != decode["metadata"]["uid"]
    assert condition(back, "Degraded")["status"] == "False"


def test_cards_only_the_operator_can_judge_get_valid_false_with_the_field_path(
    cluster: Cluster, operator_ns: str
) -> None:
    ns = operator_ns
    orphan = {**TINY_PD[1], "metadata": {"name": "orphan"}}
    orphan["spec"] = {**orphan["spec"], "modelCard": "no-such-model"}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(orphan))
    bad = wait_for(lambda: invalid(cluster, ns, "orphan"), 120, "orphan Valid=False")
    assert bad["status"]["phase"] == "Invalid"
    assert "spec.modelCard" in condition(bad, "Valid")["message"]

    sparse = yaml.safe_load(yaml.safe_dump(TINY_PD[1]))
    sparse["metadata"] = {"name": "hisparse-on-llama"}
    sparse["spec"]["roles"]["decode"]["hiSparse"] = {"hostPoolGiB": 1, "offloadGiB": 1}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(sparse))
    bad = wait_for(lambda: invalid(cluster, ns, "hisparse-on-llama"), 120, "Valid=False")
    message = condition(bad, "Valid")["message"]
    assert "spec.roles.decode.hiSparse" in message and "sparse-mla" in message
    assert not pods(cluster, ns, "loom.dev/deployment=hisparse-on-llama"), (
        "an invalid card got pods"
    )


def test_objects_edited_or_deleted_by_hand_come_back_within_the_reapply_interval(
    cluster: Cluster, operator_ns: str
) -> None:
    """The drift correction runs in the card's loop (no kopf timer): REAPPLY_INTERVAL_S after
    its last apply it applies again what the watch cache says is no longer as rendered — a
    ConfigMap's data, a deleted Service, a rendered label of a StatefulSet or Deployment (which
    leaves their generation) — and makes the token Secret again with the tokens the pods hold."""
    ns = operator_ns
    wait_for(lambda: ready(cluster, ns, "tiny-pd"), 300, "tiny-pd Ready")
    cards, managed = "tiny-pd-cards", "app.kubernetes.io/managed-by"

    def get(kind: str, name: str) -> dict[str, Any] | None:
        out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def state() -> tuple[Any, ...]:
        sts, router = get("statefulset", "tiny-pd-decode"), get("deployment", "tiny-pd-router")
        secret, config = get("secret", "tiny-pd-control"), get("configmap", cards)
        return (config and config["data"], secret and secret["data"],
                sts and sts["metadata"]["labels"].get(managed),
                router and router["metadata"]["labels"].get(managed),
                get("service", "tiny-pd-router") is not None)  # fmt: skip

    rendered = state()
    assert rendered[2] == rendered[3] == "loom-operator" and rendered[1] and rendered[4]
    cluster.kubectl("patch", "configmap", cards, "-n", ns, "--type=merge",
                    "-p", json.dumps({"data": {"router.json": "{}"}}))  # fmt: skip
    cluster.kubectl("delete", "service", "tiny-pd-router", "-n", ns)
    for kind, name in (("statefulset", "tiny-pd-decode"), ("deployment", "tiny-pd-router")):
        cluster.kubectl("label", kind, name, "-n", ns, f"{managed}=someone", "--overwrite")
    cluster.kubectl("delete", "secret", "tiny-pd-control", "-n", ns)
    edited = time.monotonic()
    assert state() != rendered
    wait_for(lambda: state() == rendered, REAPPLY_INTERVAL_S + 15,
             "the edited ConfigMap and labels, the deleted Service and Secret back")  # fmt: skip
    assert time.monotonic() - edited <= REAPPLY_INTERVAL_S + 15


def test_deleting_the_card_garbage_collects_every_child(cluster: Cluster, operator_ns: str) -> None:
    ns = operator_ns
    wait_for(lambda: ready(cluster, ns, "tiny-pd"), 300, "tiny-pd Ready")
    kinds = ",".join([
        "statefulsets", "deployments", "services", "configmaps", "secrets", "pods",
        "poddisruptionbudgets", "roles", "rolebindings", "serviceaccounts", "rolescales",
    ])  # fmt: skip

    def children() -> list[str]:
        out = cluster.kubectl(
            "get", kinds, "-n", ns, "-l", "loom.dev/deployment=tiny-pd", "-o", "name"
        )
        return out.stdout.split()

    assert len(children()) >= 10
    cluster.kubectl("delete", "deploymentcard", "tiny-pd", "-n", ns, "--wait=false")
    wait_for(lambda: not children(), 180, "every child of tiny-pd to be garbage-collected")


def test_a_glm_5_class_fleet_is_scheduled_onto_gpu_nodes_and_its_status_converges(
    cluster: Cluster, operator_ns: str
) -> None:
    """Scale by simulation: 8 prefill + 64 decode pods of 8 GPUs each on 100 kwok nodes of 8
    GPUs; the real scheduler places them, kwok marks them Ready (nothing serves)."""
    if cluster.root is None:
        pytest.skip("kwok nodes are the local provider's")
    ns = operator_ns
    capacity = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti"}
    nodes = cluster.add_fake_nodes(100, capacity)
    docs = list(yaml.safe_load_all((REPO / "examples" / "glm-5-class.yaml").read_text()))
    docs[1]["spec"]["roles"]["prefill"]["replicas"] = 8
    docs[1]["spec"]["roles"]["decode"]["replicas"] = 64
    try:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))

        def converged() -> dict[str, Any] | None:
            roles = (card(cluster, ns, "glm-5").get("status") or {}).get("roles") or {}
            want = {"prefill": 8, "decode": 64}
            done = all(roles.get(r, {}).get("ready") == n for r, n in want.items())
            return roles if done else None

        roles = wait_for(converged, 300, "8 prefill and 64 decode pods ready", interval=2.0)
        assert roles["prefill"]["desired"] == 8 and roles["decode"]["desired"] == 64
        workers = pods(cluster, ns, "loom.dev/deployment=glm-5,app.kubernetes.io/component=worker")
        per_node: dict[str, int] = {}
        for p in workers:
            per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
        assert set(per_node) <= set(nodes), "a GPU worker landed on a node without GPUs"
        assert max(per_node.values()) == 1, "two 8-GPU workers on one 8-GPU node"
    finally:  # kwok deletes its pods within their grace period; the namespace goes at the end
        cluster.kubectl("delete", "deploymentcard", "glm-5", "-n", ns, "--wait=false", check=False)
        for name in nodes:
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def test_of_two_operator_replicas_exactly_one_acts_and_the_other_takes_over(
    cluster: Cluster,
) -> None:
    ns = operator_namespace(cluster)
    first = Operator(cluster, ns, "a")
    second = None
    try:
        wait_for(lambda: first.said("acquired lease"), 60, "the first replica to lead")
        second = Operator(cluster, ns, "b")
        wait_for(lambda: second.said("another replica leads"), 60, "the second replica to wait")
        cluster.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "tiny-aggregated.yaml"))
        wait_for(lambda: first.said("applied"), 60, "the leader to apply the card")
        assert not second.said("applied"), "the waiting replica acted too"

        first.proc.kill()  # kill -9: no release, the lease must expire
        first.proc.wait()
        wait_for(lambda: second.said("acquired lease"), 60, "the second replica to take over")
        wait_for(lambda: second.said("applied"), 60, "the new leader to resume the card")
        wait_for(lambda: ready(cluster, ns, "tiny-aggregated"), 300, "tiny-aggregated Ready")
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for op in (first, second):
            if op is not None:
                op.stop()
