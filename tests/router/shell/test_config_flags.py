"""`loom router` and `python -m loom_router` take the same flags; impossible ones are
refused with what to pass instead."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loom_operator.cli import build_parser
from loom_router.shell.config import (
    FlagsError,
    add_arguments,
    flags_from_args,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", "r.json", *argv])


def test_loom_router_is_a_command_with_the_same_flags() -> None:
    args = build_parser().parse_args(
        ["router", "--config", "r.json", "--port", "9000", "--admin-port", "9001"]
    )
    assert args.config == Path("r.json") and args.port == 9000 and args.admin_port == 9001
    assert args.run.__module__ == "loom_operator.cli.router"


def test_tokens_and_keys_come_from_flags_or_the_environment() -> None:
    env = {"LOOM_ROUTER_ADMIN_TOKEN": "t", "LOOM_ROUTER_API_KEYS": "k1, k2,"}
    flags = flags_from_args(parse("--api-key", "k0", "--policy", "random"), env)
    assert flags.admin_token == "t" and flags.api_keys == ("k0", "k1", "k2")
    assert flags.policy == "random"
    assert flags_from_args(parse("--admin-token", "x"), {}).api_keys == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "needs a token"),
        (("--admin-token", "t", "--scrape-interval", "0"), "--scrape-interval"),
        (("--admin-token", "t", "--port", "5", "--admin-port", "5"), "must differ"),
    ],
)
def test_impossible_flags_are_refused(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(FlagsError, match=message):
        flags_from_args(parse(*argv), {})


def test_max_body_bytes_is_a_flag_with_a_floor() -> None:
    assert flags_from_args(parse("--admin-token", "x"), {}).max_body_bytes == 64 << 20
    small = flags_from_args(parse("--admin-token", "x", "--max-body-bytes", "4096"), {})
    assert small.max_body_bytes == 4096
    with pytest.raises(FlagsError, match="at least 1024"):
        flags_from_args(parse("--admin-token", "x", "--max-body-bytes", "10"), {})
