from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.local.launch import router_document
from loom_router.core.settings import RoutingSettings, ScorerWeights
from loom_router.errors import ConfigError
from loom_router.shell.config import file_config_from_dict


def settings_from_card(card: DeploymentCard) -> RoutingSettings:
    """What the router runs with for `card`: the ROUTER.json the operator writes, as read back."""
    return file_config_from_dict(router_document(card, "tiny", None)).settings


def card(spec_extra: dict[str, Any]) -> DeploymentCard:
    doc = {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "DeploymentCard",
        "metadata": {"name": "tiny-pd"},
        "spec": {
            "modelCard": "tiny",
            "roles": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
            **spec_extra,
        },
    }
    return DeploymentCard.model_validate(doc)


def test_defaults_follow_the_card_defaults() -> None:
    s = settings_from_card(card({}))
    assert s == RoutingSettings()
    assert (s.weights.prefix_cache, s.weights.queue, s.weights.kv_cache_utilization) == (3, 2, 2)
    assert (s.prefix_scorer, s.min_uncached_tokens, s.spill_margin) == ("precise", 2048, 0.2)
    assert s.in_flight_prefix_s == 10  # one router replica: nothing to disagree with
    assert (s.hash_algo, s.hash_seed, s.block_size, s.migration_limit) == (
        "sha256_cbor",
        "0",
        16,
        3,
    )


def test_card_values_are_carried_over() -> None:
    s = settings_from_card(
        card(
            {
                "roles": {"aggregated": {"engine": {"blockSize": 32}}},
                "router": {
                    "scorers": {"prefixCache": 5, "queue": 1, "kvCacheUtilization": 0},
                    "prefixScorer": "approximate",
                    "disaggregation": {"minUncachedTokens": 512},
                    "sessionAffinity": {"enabled": False, "header": "x-conv"},
                    "hotspot": {"spillMargin": 0.5},
                    "inFlightPrefixSeconds": 4.0,
                },
                "prefixCaching": {"hashSeed": "42"},
                "failover": {"migrationLimit": 7},
            }
        )
    )
    assert s.weights == ScorerWeights(prefix_cache=5, queue=1, kv_cache_utilization=0)
    assert s.prefix_scorer == "approximate"
    assert s.min_uncached_tokens == 512
    assert (s.session_affinity, s.session_header) == (False, "x-conv")
    assert s.spill_margin == 0.5
    assert s.in_flight_prefix_s == 4.0
    assert (s.block_size, s.hash_seed, s.migration_limit) == (32, "42", 7)


def test_a_scored_pool_without_prefix_caching_turns_prefix_routing_off() -> None:
    """The decode role keeps no prefix cache: no prefix or session credit for its endpoints,
    and what was left of the card's weights still routes (queue alone if nothing else)."""
    off = {"engine": {"prefixCaching": False}}
    s = settings_from_card(card({"roles": {"prefill": {}, "decode": off}}))
    assert s.weights == ScorerWeights(prefix_cache=0, queue=2, kv_cache_utilization=2)
    assert (s.session_affinity, s.in_flight_prefix_s) == (False, 0)
    only_prefix = {"scorers": {"prefixCache": 3, "queue": 0, "kvCacheUtilization": 0}}
    s = settings_from_card(card({"roles": {"aggregated": off}, "router": only_prefix}))
    assert s.weights == ScorerWeights(prefix_cache=0, queue=1, kv_cache_utilization=0)
    kept = settings_from_card(card({"roles": {"prefill": off, "decode": {}}}))
    assert kept.weights.prefix_cache == 3  # the prefill role's cache is not the scored one


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"stale_after_s": 0},
        {"max_index_entries": 0},
        {"min_uncached_tokens": -1},
        {"spill_margin": -0.1},
        {"in_flight_prefix_s": -1.0},
        {"prefix_scorer": "fuzzy"},
        {"picker": "first"},
    ],
)
def test_out_of_range_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RoutingSettings(**kwargs)


def test_weights_must_not_all_be_zero_or_negative() -> None:
    with pytest.raises(ConfigError):
        ScorerWeights(0, 0, 0, 0, 0, 0)
    with pytest.raises(ConfigError):
        ScorerWeights(queue=-1)


@pytest.mark.parametrize("seconds", [-1, 61])
def test_the_card_refuses_in_flight_prefix_seconds_out_of_range(seconds: float) -> None:
    with pytest.raises(ValidationError, match="inFlightPrefixSeconds"):
        card({"router": {"inFlightPrefixSeconds": seconds}})


@pytest.mark.parametrize(
    ("router", "seconds"),
    [
        ({"replicas": 2}, 0.0),  # active-active: decide from KV events alone
        ({"replicas": 2, "inFlightPrefixSeconds": 3.0}, 3.0),  # unless the card opts in
        ({"inFlightPrefixSeconds": 0}, 0.0),
    ],
)
def test_in_flight_prefixes_default_by_router_replicas(
    router: dict[str, object], seconds: float
) -> None:
    assert settings_from_card(card({"router": router})).in_flight_prefix_s == seconds
