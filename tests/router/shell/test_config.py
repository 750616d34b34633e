"""ROUTER.json: the card's router and failover sections become RoutingSettings; every problem
is reported at once with its field path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loom_router.errors import ConfigError
from loom_router.shell.config import endpoint_from_doc, file_config_from_dict, load_file_config


def doc(**more: Any) -> dict[str, Any]:
    return {
        "model_name": "tiny",
        "tokenizer_path": "tok",
        "block_size": 32,
        "hash_seed": "7",
        "hash_algo": "sha256_cbor",
        "router": {
            "scorers": {"prefixCache": 5.0, "queue": 1.0, "kvCacheUtilization": 0.5},
            "prefixScorer": "approximate",
            "disaggregation": {"minUncachedTokens": 64},
            "sessionAffinity": {"enabled": False, "header": "x-s"},
            "hotspot": {"spillMargin": 0.5},
            "inFlightPrefixSeconds": 2.5,
        },
        "failover": {"migrationLimit": 2, "healthTimeoutSeconds": 1.5, "onTransferFailure": "fail"},
        "endpoints": [
            {
                "id": "d0",
                "url": "http://127.0.0.1:1/",
                "role": "decode",
                "weights_version": "v1",
                "kv_events": "tcp://127.0.0.1:2",
            }
        ],
        **more,
    }


def test_card_sections_become_settings(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(doc()))
    config = load_file_config(path)
    s = config.settings
    assert (s.weights.prefix_cache, s.weights.queue, s.weights.kv_cache_utilization) == (5, 1, 0.5)
    assert s.prefix_scorer == "approximate" and s.min_uncached_tokens == 64
    assert not s.session_affinity and s.session_header == "x-s" and s.spill_margin == 0.5
    assert (s.block_size, s.hash_seed, s.migration_limit) == (32, "7", 2)
    assert s.in_flight_prefix_s == 2.5
    assert config.settings.on_transfer_failure == "fail"
    assert config.settings.health_timeout_s == 1.5
    assert config.tokenizer_path == tmp_path / "tok"  # relative to the file
    (e,) = config.endpoints
    assert (e.id, e.url, e.role, e.kv_events, e.kv_replay) == (
        "d0",
        "http://127.0.0.1:1",
        "decode",
        "tcp://127.0.0.1:2",
        None,
    )


def test_defaults_are_the_cards() -> None:
    config = file_config_from_dict({"model_name": "m"})
    assert config.settings.weights.prefix_cache == 3 and config.settings.block_size == 16
    assert config.settings.in_flight_prefix_s == 10  # one replica unless the card says more
    assert config.settings.migration_limit == 3 and config.endpoints == ()
    assert config.tokenizer_path is None


def test_every_problem_is_reported_with_its_path() -> None:
    bad = doc(model_name="", block_size=0, extra=1)
    bad["router"]["scorers"]["queue"] = -1.0
    bad["endpoints"].append({"id": "x", "url": "ftp://h", "role": "boss", "weights_version": ""})
    with pytest.raises(ConfigError) as err:
        file_config_from_dict(bad)
    text = str(err.value)
    for needle in (
        "extra: unknown field",
        "model_name",
        "router.scorers.queue",
        "endpoints[1].url",
        "endpoints[1].role",
        "endpoints[1].weights_version",
    ):
        assert needle in text, needle


def test_endpoint_body_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match=r"body\.port: unknown field"):
        endpoint_from_doc(
            "a", {"url": "http://h", "role": "decode", "weights_version": "v", "port": 1}, "body"
        )


def test_a_diffusion_object_turns_on_media_routing_and_is_checked() -> None:
    assert file_config_from_dict(doc()).diffusion is None
    config = file_config_from_dict(doc(diffusion={"default_steps": 4}))
    assert config.diffusion is not None and config.diffusion.default_steps == 4
    assert file_config_from_dict(doc(diffusion={})).diffusion is not None  # the default steps
    text = file_config_from_dict(doc(diffusion={"default_steps": 4, "text": True})).diffusion
    assert text is not None and text.text and not config.diffusion.text
    cases = (({"default_steps": 0}, r"in \[1, 1000\]"), ({"steps": 4}, "only"), ("yes", "object"),
             ({"text": "yes"}, "true or false"))  # fmt: skip
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            file_config_from_dict(doc(diffusion=bad))


def test_workflows_are_read_and_must_end_on_a_route_this_fleet_serves() -> None:
    flows = [{"name": "story", "stages": [
        {"name": "think", "card": "mot", "route": "images", "url": "http://mot:8000"},
        {"name": "animate", "card": "wan", "route": "videos", "url": None},
    ]}]  # fmt: skip
    config = file_config_from_dict(doc(diffusion={"default_steps": 4}, workflows=flows))
    assert [w.name for w in config.workflows] == ["story"]
    for diffusion in (None, {"default_steps": 4, "text": True}):
        extra = {} if diffusion is None else {"diffusion": diffusion}
        with pytest.raises(ConfigError, match="ends with a videos stage, which this fleet"):
            file_config_from_dict(doc(workflows=flows, **extra))
