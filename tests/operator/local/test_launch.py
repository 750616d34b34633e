"""Launch plans: the flags a worker gets are ones `loom runtime` accepts and mean what the card
says; the ModelCard it starts from loads the given source and version; the router's config is
one the router accepts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loom_operator.local.cards import parse_fleet_cards
from loom_operator.local.launch import (
    LaunchOptions,
    WorkerPorts,
    WorkerStart,
    plan_start,
    router_argv,
    router_config,
    router_env,
    worker_argv,
    worker_card,
    worker_env,
)
from loom_operator.testing.cards import card_text
from loom_router.shell.config import add_arguments, file_config_from_dict, flags_from_args
from loom_runtime.card import load_model_card
from loom_runtime.cli import build_parser


@pytest.fixture
def pd_card(tmp_path: Path) -> Path:
    path = tmp_path / "pd.yaml"
    text = card_text("file:weights/v1", version="v1", roles={"prefill": 1, "decode": 2})
    path.write_text(text.replace("failover: {", "failover: {onTransferFailure: fail, "))
    return path


def test_worker_flags_parse_as_the_runtime_reads_them(pd_card: Path, tmp_path: Path) -> None:
    cards = parse_fleet_cards(pd_card)
    ports = WorkerPorts(9000, 9001, 9002, 9003, 9004)
    options = LaunchOptions(python="py", kv_connector="tcp")
    argv = worker_argv(cards, "prefill", tmp_path / "w.yaml", ports, "v7", options)
    assert argv[:4] == ["py", "-m", "loom_runtime", "runtime"]
    args = build_parser().parse_args(argv[3:])
    assert (args.role, args.host, args.port, args.control_port) == (
        "prefill",
        "127.0.0.1",
        9000,
        9001,
    )
    assert (args.kv_events_port, args.kv_events_replay_port, args.kv_side_port) == (
        9002,
        9003,
        9004,
    )
    assert (args.block_size, args.max_num_seqs, args.max_model_len) == (16, 8, 512)
    assert (args.dtype, args.weights_version, args.kv_connector) == ("float64", "v7", "tcp")
    assert args.on_transfer_failure == "fail"
    assert args.control_token is None  # the token travels in the environment, not in `ps`


def test_aggregated_workers_get_no_pd_flags(tmp_path: Path) -> None:
    path = tmp_path / "agg.yaml"
    path.write_text(card_text("loom://tiny", dtype="fp32"))
    cards = parse_fleet_cards(path)
    argv = worker_argv(cards, "aggregated", path, WorkerPorts(1, 2, 3, 4), "v1", LaunchOptions())
    assert "--kv-side-port" not in argv and "--kv-connector" not in argv
    assert "--on-transfer-failure" not in argv
    assert argv[argv.index("--dtype") + 1] == "float32"


def test_worker_card_loads_the_given_source_as_the_given_version(
    pd_card: Path, tmp_path: Path
) -> None:
    cards = parse_fleet_cards(pd_card)
    source = cards.desired.source_uri
    assert source == f"file://{(pd_card.parent / 'weights/v1').resolve()}"  # made absolute
    out = tmp_path / "elsewhere" / "worker.yaml"
    out.parent.mkdir()
    out.write_text(worker_card(cards, "file:///models/v9", "v9"))
    model = load_model_card(out)
    assert model.name == "tiny"
    assert model.spec.components[0].source.uri == "file:///models/v9"
    assert model.spec.components[0].weights_version == "v9"


@pytest.mark.parametrize(
    ("source", "version", "peers", "want"),
    [
        ("file:///m/v2", "v2", {"127.0.0.1:9": "v2"}, ("file:///m/v2", "v2", None)),
        ("push://ab12", "p3", {}, ("push://ab12", "p3", None)),  # no peer: the worker says why
        ("push://ab12", "p3", {"127.0.0.1:9": "v1"}, ("push://ab12", "p3", None)),
        ("push://ab12", "p3", {"127.0.0.1:9": "v1", "127.0.0.1:8": "p3", "127.0.0.1:7": "p3"},
         ("CARD", "v1", ("127.0.0.1:7", "ab12", "p3"))),
    ],
)  # fmt: skip
def test_a_worker_starting_on_a_pushed_version_rebuilds_it_from_a_peer_serving_it(
    pd_card: Path,
    source: str,
    version: str,
    peers: dict[str, str],
    want: tuple[str, str, tuple[str, str, str] | None],
) -> None:
    cards = parse_fleet_cards(pd_card)
    start = plan_start(source, version, cards, peers)
    card_source = cards.desired.source_uri  # the card's checkpoint, the card's version (v1)
    assert start == WorkerStart(card_source if want[0] == "CARD" else want[0], want[1], want[2])
    args = build_parser().parse_args(["runtime", "--card", "c.yaml", *start.flags()])
    assert (args.rebuild_from, args.rebuild_update, args.rebuild_version) == (
        want[2] or (None,) * 3
    )


def test_worker_env_carries_the_token_and_one_thread_share(pd_card: Path) -> None:
    env = worker_env({"PATH": "/bin"}, "secret", workers=64, options=LaunchOptions())
    assert env["LOOM_CONTROL_TOKEN"] == "secret"
    assert env["OMP_NUM_THREADS"] == "1"
    assert worker_env({"OMP_NUM_THREADS": "3"}, "t", 64, LaunchOptions())["OMP_NUM_THREADS"] == "3"


def test_router_config_is_accepted_by_the_router(pd_card: Path, tmp_path: Path) -> None:
    cards = parse_fleet_cards(pd_card)
    doc = json.loads(router_config(cards, tmp_path / "tok"))
    config = file_config_from_dict(doc)
    assert config.model_name == "tiny"
    assert config.tokenizer_path == tmp_path / "tok"
    assert config.settings.min_uncached_tokens == 0
    assert config.settings.block_size == 16
    assert config.settings.on_transfer_failure == "fail"
    argv = router_argv(tmp_path / "r.json", 8000, 8001, LaunchOptions(python="py"))
    assert argv[:3] == ["py", "-m", "loom_router"]
    args = argparse.ArgumentParser()
    add_arguments(args)
    flags = flags_from_args(args.parse_args(argv[3:]), router_env({}, "tok"))
    assert (flags.port, flags.admin_port, flags.admin_token) == (8000, 8001, "tok")
    assert "tok" not in argv  # the admin token travels in the environment, not in `ps`
