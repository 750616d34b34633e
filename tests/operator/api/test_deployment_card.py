"""DeploymentCard: defaults of every section, ranges, status from the cluster, round trips."""

from __future__ import annotations

from typing import Any

import pytest

from loom_operator.api import DeploymentCard
from loom_runtime.card import CardError
from loom_runtime.card.load import parse_card


def _codes(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(CardError) as info:
        parse_card(DeploymentCard, data)
    return {e.path: e.code for e in info.value.errors}


def test_defaults_match_the_documented_values(deploy_data: dict[str, Any]) -> None:
    spec = parse_card(DeploymentCard, deploy_data).spec
    assert spec.backend == "native"
    assert spec.router.replicas == 1
    assert spec.router.prefix_scorer == "precise"
    scorers = spec.router.scorers
    assert (scorers.prefix_cache, scorers.queue, scorers.kv_cache_utilization) == (3, 2, 2)
    assert spec.router.disaggregation.min_uncached_tokens == 2048
    assert spec.router.session_affinity.header == "x-session-token"
    assert (spec.prefix_caching.hash_algo, spec.prefix_caching.hash_seed) == ("sha256_cbor", "0")
    sync = spec.weight_sync
    assert (sync.strategy, sync.max_unavailable, sync.drain_timeout_seconds) == ("Rolling", 1, 60)
    fail = spec.failover
    assert (fail.migration_limit, fail.health_timeout_seconds) == (3, 5)
    assert fail.on_transfer_failure == "recompute"


@pytest.mark.parametrize(
    ("section", "value", "path", "code"),
    [
        (
            "weightSync",
            {"maxUnavailable": 0},
            "spec.weightSync.maxUnavailable",
            "greater_than_equal",
        ),
        ("weightSync", {"strategy": "Canary"}, "spec.weightSync.strategy", "literal_error"),
        (
            "failover",
            {"healthTimeoutSeconds": 0},
            "spec.failover.healthTimeoutSeconds",
            "greater_than",
        ),
        (
            "failover",
            {"onTransferFailure": "retry"},
            "spec.failover.onTransferFailure",
            "literal_error",
        ),
        (
            "router",
            {"scorers": {"prefixCache": 0, "queue": 0, "kvCacheUtilization": 0}},
            "spec.router.scorers",
            "no_scorer",
        ),
        (
            "router",
            {"hotspot": {"spillMargin": 1.5}},
            "spec.router.hotspot.spillMargin",
            "less_than_equal",
        ),
        ("prefixCaching", {"hashSeed": 0}, "spec.prefixCaching.hashSeed", "string_type"),
        ("backend", "sglang", "spec.backend", "literal_error"),
        ("modelCard", "Tiny", "spec.modelCard", "dns_label"),
    ],
)
def test_out_of_range_settings_are_errors(
    deploy_data: dict[str, Any], section: str, value: Any, path: str, code: str
) -> None:
    deploy_data["spec"][section] = value
    assert _codes(deploy_data) == {path: code}


def test_status_from_the_cluster_parses(deploy_data: dict[str, Any]) -> None:
    deploy_data["metadata"].update(uid="u", generation=4, managedFields=[{"manager": "kubectl"}])
    deploy_data["status"] = {
        "phase": "WeightSyncing",
        "observedGeneration": 4,
        "readyRoles": "1/2",
        "weightsVersion": "v1",
        "roles": {"prefill": {"ready": 1, "desired": 1, "weightsVersion": "v2"}},
        "conditions": [
            {
                "type": "WeightSyncing",
                "status": "True",
                "reason": "Draining",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 4,
            }
        ],
        "weightSync": {
            "phase": "Syncing",
            "targetVersions": {"decoder": "v2"},
            "workers": {"tiny-pd-decode-0": "Draining"},
            "updated": 1,
            "total": 3,
        },
        "endpoint": "http://tiny-pd-router:8000",
    }
    card = parse_card(DeploymentCard, deploy_data)
    status = card.status
    assert status is not None and status.weight_sync is not None
    assert status.roles["prefill"].weights_version == "v2"
    assert status.weight_sync.workers == {"tiny-pd-decode-0": "Draining"}
    assert status.conditions[0].last_transition_time is not None
    assert status.conditions[0].last_transition_time.year == 2026


def test_status_role_keys_are_role_names(deploy_data: dict[str, Any]) -> None:
    deploy_data["status"] = {"roles": {"encoder": {"ready": 1}}}
    with pytest.raises(CardError) as info:
        parse_card(DeploymentCard, deploy_data)
    [error] = info.value.errors
    assert error.path == "status.roles.encoder"
    assert error.message.startswith("key 'encoder': Input should be 'prefill', 'decode' or")


def test_round_trip_through_yaml_names_is_lossless(deploy_data: dict[str, Any]) -> None:
    card = parse_card(DeploymentCard, deploy_data)
    dumped = card.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["spec"]["roles"]["decode"]["replicas"] == 2
    assert "kvCacheGiB" not in dumped["spec"]["roles"]["decode"]["engine"]  # None is dropped
    assert parse_card(DeploymentCard, dumped) == card


def test_a_role_offloading_kv_without_prefix_caching_is_refused_at_its_path(
    deploy_data: dict[str, Any],
) -> None:
    prefill = {"replicas": 1, "kvOffload": {"hostGiB": 64}, "engine": {"prefixCaching": False}}
    deploy_data["spec"]["roles"]["prefill"] = prefill
    assert _codes(deploy_data) == {
        "spec.roles.prefill.engine.prefixCaching": "offload_without_prefix_caching"
    }
    deploy_data["spec"]["roles"]["prefill"].pop("kvOffload")
    card = parse_card(DeploymentCard, deploy_data)
    roles = card.spec.roles
    assert roles.prefill is not None and roles.prefill.engine.prefix_caching is False
    assert roles.decode is not None and roles.decode.engine.prefix_caching is True
    dumped = card.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert parse_card(DeploymentCard, dumped) == card
