from __future__ import annotations

import pytest
from e2e.node_agent.env import EnvError, container_env, expand, field_value

POD = {
    "metadata": {
        "name": "w-0",
        "namespace": "ns",
        "uid": "u1",
        "labels": {"loom.dev/role": "decode"},
    },
    "spec": {"nodeName": "loom-node-0", "serviceAccountName": "loom"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--host=$(POD_IP)", "--host=127.0.10.2"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("$$(POD_IP)", "$(POD_IP)"),
        ("a$(A)$(A)b", "axxb"),
        ("plain", "plain"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"POD_IP": "127.0.10.2", "A": "x"}) == expected


def test_downward_api_fields() -> None:
    assert field_value("metadata.name", POD, "127.0.10.2") == "w-0"
    assert field_value("status.podIP", POD, "127.0.10.2") == "127.0.10.2"
    assert field_value("metadata.labels['loom.dev/role']", POD, "") == "decode"
    with pytest.raises(EnvError, match="not supported"):
        field_value("status.phase", POD, "")


def test_container_env_resolves_refs_in_order() -> None:
    data = {("configMap", "cfg"): {"A": "1", "B": "2"}, ("secret", "tok"): {"token": "s3cret"}}

    def lookup(kind: str, name: str) -> dict[str, str] | None:
        return data.get((kind, name))

    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
            {
                "name": "OPT",
                "valueFrom": {"configMapKeyRef": {"name": "none", "key": "x", "optional": True}},
            },
        ],
    }
    env = container_env(container, POD, "127.0.10.2", lookup, ("127.0.0.1", 6443))
    assert env["CFG_A"] == "1" and env["CFG_B"] == "2"
    assert env["URL"] == "http://127.0.10.2:8000"
    assert env["TOKEN"] == "s3cret" and env["OPT"] == ""
    assert (
        env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    )


def test_a_missing_required_key_is_a_config_error() -> None:
    container = {
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]
    }
    with pytest.raises(EnvError, match="gone/k not found"):
        container_env(container, POD, "", lambda kind, name: None, ("127.0.0.1", 1))
