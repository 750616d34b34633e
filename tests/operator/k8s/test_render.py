"""The renderers: what each example card becomes, and every manifest valid for Kubernetes 1.35."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from loom_operator.api.documents import load_documents, parse_documents
from loom_operator.api.roles import RoleName
from loom_operator.k8s.render import render
from loom_operator.k8s.render.security import SCRATCH_ENV, SCRATCH_MOUNT, SCRATCH_VOLUME, USER
from loom_operator.k8s.settings import RenderSettings
from loom_router.shell.config import file_config_from_dict

Validate = Callable[[dict[str, Any]], None]
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
UID = "0b0c6a4e-7a1d-4d7e-9a0b-000000000001"


def rendered(example: str, settings: RenderSettings | None = None) -> list[dict[str, Any]]:
    cards = load_documents(EXAMPLES / example)
    (model,) = cards.model_cards
    (deployment,) = cards.deployment_cards
    return render(model, deployment, UID, settings or RenderSettings())


def render_docs(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    cards = parse_documents(list(enumerate(docs)), "test")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    return by_kind(render(model, deployment, UID, RenderSettings()))


def by_kind(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


@pytest.mark.parametrize("example", ["tiny-pd.yaml", "tiny-aggregated.yaml", "glm-5-class.yaml"])
def test_every_manifest_validates_against_kubernetes_1_35(
    example: str, validate_manifest: Validate
) -> None:
    for manifest in rendered(example):
        validate_manifest(manifest)


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        (
            "tiny-pd.yaml",
            {("ConfigMap", "tiny-pd-cards"), ("StatefulSet", "tiny-pd-prefill"),
             ("Service", "tiny-pd-prefill"), ("StatefulSet", "tiny-pd-decode"),
             ("Service", "tiny-pd-decode"), ("Deployment", "tiny-pd-router"),
             ("Service", "tiny-pd-router"), ("PodDisruptionBudget", "tiny-pd-router"),
             ("ServiceAccount", "tiny-pd-router"), ("Role", "tiny-pd-router"),
             ("RoleBinding", "tiny-pd-router"), ("RoleScale", "tiny-pd-prefill"),
             ("RoleScale", "tiny-pd-decode")},
        ),
        (
            "tiny-aggregated.yaml",
            {("ConfigMap", "tiny-aggregated-cards"), ("StatefulSet", "tiny-aggregated-aggregated"),
             ("Service", "tiny-aggregated-aggregated"), ("Deployment", "tiny-aggregated-router"),
             ("Service", "tiny-aggregated-router"),
             ("PodDisruptionBudget", "tiny-aggregated-router"),
             ("ServiceAccount", "tiny-aggregated-router"), ("Role", "tiny-aggregated-router"),
             ("RoleBinding", "tiny-aggregated-router"),
             ("RoleScale", "tiny-aggregated-aggregated")},
        ),
    ],
)  # fmt: skip
def test_objects_per_deployment(example: str, expected: set[tuple[str, str]]) -> None:
    assert set(by_kind(rendered(example))) == expected


def test_every_object_is_owned_by_the_deployment_card_and_labelled() -> None:
    for m in rendered("tiny-pd.yaml"):
        (owner,) = m["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "loom.dev/v1alpha1", "kind": "DeploymentCard", "name": "tiny-pd",
            "uid": UID, "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert m["metadata"]["labels"]["loom.dev/deployment"] == "tiny-pd"


def test_worker_pods_run_the_same_runtime_flags_as_loom_up_on_their_pod_ip() -> None:
    objs = by_kind(rendered("tiny-pd.yaml", RenderSettings(loom=("loom",), kv_connector="tcp")))
    pod = objs[("StatefulSet", "tiny-pd-prefill")]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    cmd = container["command"]
    assert cmd[:6] == [
        "loom",
        "runtime",
        "--card",
        "/etc/loom/model-card.yaml",
        "--host",
        "$(POD_IP)",
    ]
    flags = dict(zip(cmd[6::2], cmd[7::2], strict=True))
    assert flags["--role"] == "prefill" and flags["--port"] == "8000"
    assert flags["--kv-side-port"] == "5600" and flags["--kv-connector"] == "tcp"
    assert flags["--block-size"] == "16"
    assert pod["metadata"]["labels"]["loom.dev/role"] == "prefill"
    names = {p["name"] for p in container["ports"]}
    assert names == {"http", "control", "kv-events", "kv-replay", "kv-side"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    token = next(e for e in container["env"] if e["name"] == "LOOM_CONTROL_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "tiny-pd-control", "key": "token"}
    decode = objs[("StatefulSet", "tiny-pd-decode")]["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-side-port" not in decode["command"]


def test_a_role_without_prefix_caching_runs_its_pods_with_no_prefix_caching() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text()))
    before = render_docs(docs)
    docs[1]["spec"]["roles"]["prefill"]["engine"]["prefixCaching"] = False
    after = render_docs(docs)

    def command(objs: dict[tuple[str, str], dict[str, Any]], role: str) -> list[str]:
        pod = objs[("StatefulSet", f"tiny-pd-{role}")]["spec"]["template"]["spec"]
        cmd: list[str] = pod["containers"][0]["command"]
        return cmd

    assert "--no-prefix-caching" not in command(before, "prefill")
    prefill = command(after, "prefill")
    assert prefill.count("--no-prefix-caching") == 1
    assert [a for a in prefill if a != "--no-prefix-caching"] == command(before, "prefill")
    assert command(after, "decode") == command(before, "decode")


def test_resources_come_from_the_card_as_requests_and_limits() -> None:
    objs = by_kind(rendered("glm-5-class.yaml"))
    sts = [m for (kind, _), m in objs.items() if kind == "StatefulSet"]
    assert sts
    for s in sts:
        res = s["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert res["requests"] == res["limits"]
        assert int(res["limits"]["nvidia.com/gpu"]) >= 1


def test_the_router_watches_its_deployment_pods_with_a_least_privilege_role() -> None:
    objs = by_kind(rendered("tiny-pd.yaml"))
    router = objs[("Deployment", "tiny-pd-router")]["spec"]["template"]["spec"]
    cmd = router["containers"][0]["command"]
    assert cmd[cmd.index("--watch-pods") + 1] == "loom.dev/deployment=tiny-pd"
    assert router["serviceAccountName"] == "tiny-pd-router"
    role = objs[("Role", "tiny-pd-router")]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    cm = objs[("ConfigMap", "tiny-pd-cards")]
    assert set(cm["data"]) == {"model-card.yaml", "deployment-card.yaml", "router.json"}


def test_a_workflows_stages_on_other_cards_reach_their_router_services() -> None:
    """The router of tiny-storyboard calls tiny-mot's router Service (same namespace) for the
    think stage and itself for the last; the router config it reads says so."""
    objs = by_kind(rendered("tiny-storyboard.yaml"))
    router = json.loads(objs[("ConfigMap", "tiny-storyboard-cards")]["data"]["router.json"])
    config = file_config_from_dict(router)
    (flow, _) = config.workflows
    assert [(s.name, s.card, s.route, s.url) for s in flow.stages] == [
        ("think", "tiny-mot", "images", "http://tiny-mot-router:8000"),
        ("animate", "tiny-storyboard", "videos", None),
    ]
    service = objs[("Service", "tiny-storyboard-router")]["spec"]["ports"][0]
    assert service["port"] == 8000  # every card's router Service: what the stage URL names


def test_a_weights_version_change_touches_only_the_config_map() -> None:
    """A sync is the operator's LoadWeights on running pods: no template changes, so the
    StatefulSet rolls no pod; the ConfigMap card (what a new pod starts on) does change."""
    docs = list(yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text()))
    before = render_docs(docs)
    docs[0]["spec"]["components"][0]["weightsVersion"] = "v2"
    after = render_docs(docs)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("ConfigMap", "tiny-pd-cards")}
    assert "weightsVersion: v2" in after[("ConfigMap", "tiny-pd-cards")]["data"]["model-card.yaml"]
    template = after[("StatefulSet", "tiny-pd-decode")]["spec"]["template"]
    assert "annotations" not in template["metadata"]


LOCKED = RenderSettings(
    network_policies=True,
    operator_namespace="loom-system",
    metrics_namespaces=("monitoring",),
    router_api_keys=("keys", "api-keys"),
)


@pytest.mark.parametrize("example", ["tiny-pd.yaml", "glm-5-class.yaml"])
def test_network_policies_and_api_keys_validate_against_kubernetes_1_35(
    example: str, validate_manifest: Validate
) -> None:
    manifests = rendered(example, LOCKED)
    assert {m["kind"] for m in manifests} >= {"NetworkPolicy"}
    for manifest in manifests:
        validate_manifest(manifest)


def test_only_the_operator_reaches_control_ports_and_only_the_router_the_api() -> None:
    objs = by_kind(rendered("tiny-pd.yaml", LOCKED))
    workers = objs[("NetworkPolicy", "tiny-pd-workers")]["spec"]
    assert workers["podSelector"]["matchLabels"] == {
        "loom.dev/deployment": "tiny-pd", "app.kubernetes.io/component": "worker"
    }  # fmt: skip
    by_port: dict[str, list[Any]] = {}
    for rule in workers["ingress"]:
        for port in rule.get("ports") or [{"port": "*"}]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    ns_name = "kubernetes.io/metadata.name"
    operator = {
        "namespaceSelector": {"matchLabels": {ns_name: "loom-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "loom-operator"}},
    }
    assert by_port["control"] == [operator]
    router_labels = {"loom.dev/deployment": "tiny-pd", "app.kubernetes.io/component": "router"}
    router = {"podSelector": {"matchLabels": router_labels}}
    assert router in by_port["http"] and operator in by_port["http"]
    assert by_port["kv-events"] == [router]
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    assert monitoring in by_port["http"] and monitoring not in by_port["control"]
    workers_any = {
        "podSelector": {
            "matchLabels": {
                "loom.dev/deployment": "tiny-pd",
                "app.kubernetes.io/component": "worker",
            }
        }
    }
    trainers = {"podSelector": {"matchLabels": {"loom.dev/trainer-of": "tiny-pd"}}}
    assert by_port["*"] == [workers_any, trainers]  # KV transfer, a push's gloo group
    admin = objs[("NetworkPolicy", "tiny-pd-router")]["spec"]["ingress"]
    assert admin[0] == {"from": [operator], "ports": [{"protocol": "TCP", "port": "admin"}]}
    router_pod = objs[("Deployment", "tiny-pd-router")]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in router_pod["containers"][0]["env"]}
    assert env["LOOM_ROUTER_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": "keys",
        "key": "api-keys",
    }


def test_no_network_policies_unless_asked() -> None:
    assert "NetworkPolicy" not in {m["kind"] for m in rendered("tiny-pd.yaml")}


@pytest.mark.parametrize("example", ["tiny-pd.yaml", "tiny-aggregated.yaml", "glm-5-class.yaml"])
def test_every_pod_runs_as_non_root_on_a_read_only_root_with_no_capabilities(example: str) -> None:
    templates = [m["spec"]["template"]["spec"] for m in rendered(example)
                 if m["kind"] in ("StatefulSet", "Deployment")]  # fmt: skip
    assert templates
    for pod in templates:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == USER
        assert SCRATCH_VOLUME in pod["volumes"]
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            # The one writable path is the scratch volume, TMPDIR included.
            assert SCRATCH_MOUNT in container["volumeMounts"]
            assert SCRATCH_ENV in container["env"]


def test_each_role_has_a_role_scale_that_names_it_and_never_carries_a_count() -> None:
    objects = by_kind(rendered("tiny-pd.yaml"))
    for role in ("prefill", "decode"):
        scale = objects[("RoleScale", f"tiny-pd-{role}")]
        assert scale["spec"] == {"deploymentCard": "tiny-pd", "role": role}
        assert scale["metadata"]["labels"]["loom.dev/role"] == role


def test_a_statefulset_that_exists_is_rendered_without_replicas() -> None:
    cards = load_documents(EXAMPLES / "tiny-pd.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    fresh = by_kind(render(model, deployment, UID, RenderSettings()))
    assert fresh[("StatefulSet", "tiny-pd-decode")]["spec"]["replicas"] == 1
    counts: dict[RoleName, int | None] = {"prefill": None, "decode": None}
    again = by_kind(render(model, deployment, UID, RenderSettings(), counts))
    assert "replicas" not in again[("StatefulSet", "tiny-pd-decode")]["spec"]
    assert "replicas" not in again[("StatefulSet", "tiny-pd-prefill")]["spec"]


def test_a_new_statefulset_starts_at_the_card_replicas_within_the_autoscaling_bounds() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text()))
    docs[1]["spec"]["roles"]["decode"]["replicas"] = 6
    docs[1]["spec"]["autoscaling"] = {"decode": {"min": 1, "max": 3}}
    objects = render_docs(docs)
    assert objects[("StatefulSet", "tiny-pd-decode")]["spec"]["replicas"] == 3
    assert objects[("StatefulSet", "tiny-pd-prefill")]["spec"]["replicas"] == 1
