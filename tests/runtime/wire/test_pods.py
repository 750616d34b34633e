"""A pod spec's named ports: what the operator and the router both read from worker pods."""

from __future__ import annotations

from loom_runtime.wire.pods import named_ports


def test_named_ports_span_every_container_and_skip_unnamed_ones() -> None:
    spec = {"containers": [
        {"name": "vllm", "ports": [{"name": "http", "containerPort": 8000},
                                   {"containerPort": 9999}]},
        {"name": "control", "ports": [{"name": "control", "containerPort": 50051}]},
        {"name": "bare"},
    ]}  # fmt: skip
    assert named_ports(spec) == {"http": 8000, "control": 50051}
    assert named_ports({}) == {}
