"""The router process's command-line flags (`loom router` and `python -m loom_operator.router`).

Owns flag names, defaults and the environment fallbacks; imports nothing heavy, so the `loom`
CLI can register the command without loading the router.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

ADMIN_TOKEN_ENV = "LOOM_ROUTER_ADMIN_TOKEN"
API_KEYS_ENV = "LOOM_ROUTER_API_KEYS"
POLICIES = ("scored", "random", "round-robin")


class OptionsError(ValueError):
    """The flags ask for something impossible; the message says what to pass instead."""


@dataclass(frozen=True)
class RouterOptions:
    config: Path
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 8081
    admin_token: str = ""
    api_keys: tuple[str, ...] = ()
    """Empty: the OpenAI routes are open; else `Authorization: Bearer <one of them>`."""
    policy: str = "scored"
    """scored (filters → scorers → picker) | random | round-robin (baselines for benchmarks)."""
    seed: int = 0
    scrape_interval_s: float = 0.1
    log_level: str = "INFO"
    max_index_entries: int | None = None
    """Cap of the precise prefix index ((endpoint, block) entries); None: the default (1M)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="ROUTER.json")
    p.add_argument("--host", default="127.0.0.1", help="OpenAI API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="OpenAI API port (default 8080)")
    p.add_argument("--admin-host", default="127.0.0.1", help="admin API address")
    p.add_argument("--admin-port", type=int, default=8081, help="admin API port (default 8081)")
    p.add_argument("--admin-token", help=f"admin bearer token (default ${ADMIN_TOKEN_ENV})")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"accepted API key; repeatable (also ${API_KEYS_ENV}, comma-separated)",
    )
    p.add_argument("--policy", choices=POLICIES, default="scored", help="default scored")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of --policy random (scored picks: request id)"
    )
    p.add_argument(
        "--scrape-interval", type=float, default=0.1, help="seconds between /metrics scrapes"
    )
    p.add_argument("--log-level", default="INFO", help="default INFO")
    p.add_argument(
        "--max-index-entries",
        type=int,
        help="cap of the precise prefix index, in (endpoint, block) entries of ~0.3 KiB "
        "(default 1,000,000)",
    )


def options_from_args(args: argparse.Namespace, env: dict[str, str]) -> RouterOptions:
    token = args.admin_token or env.get(ADMIN_TOKEN_ENV, "")
    if not token:
        raise OptionsError(
            f"the admin API needs a token: pass --admin-token or set ${ADMIN_TOKEN_ENV}"
        )
    keys = [*args.api_key, *(k.strip() for k in env.get(API_KEYS_ENV, "").split(","))]
    if args.scrape_interval <= 0:
        raise OptionsError(f"--scrape-interval must be > 0, got {args.scrape_interval}")
    if args.max_index_entries is not None and args.max_index_entries <= 0:
        raise OptionsError(f"--max-index-entries must be > 0, got {args.max_index_entries}")
    if args.port == args.admin_port and args.host == args.admin_host:
        raise OptionsError("--port and --admin-port must differ")
    return RouterOptions(
        config=args.config,
        host=args.host,
        port=args.port,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        admin_token=token,
        api_keys=tuple(k for k in keys if k),
        policy=args.policy,
        seed=args.seed,
        scrape_interval_s=args.scrape_interval,
        log_level=args.log_level,
        max_index_entries=args.max_index_entries,
    )


def env() -> dict[str, str]:
    return dict(os.environ)
