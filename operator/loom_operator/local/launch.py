"""How each local process is started: a worker's ModelCard, flags and environment from the cards;
the router's config file and flags. Pure: the same cards and ports give the same command.

Owns the mapping from card fields to `loom runtime` and router flags; never starts a process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loom_operator.api.roles import RoleName
from loom_operator.fleet import commands
from loom_operator.fleet.commands import (  # re-exported: the local substrate's names
    ADMIN_TOKEN_ENV,
    CONTROL_TOKEN_ENV,
    WorkerPorts,
    router_document,
)
from loom_operator.fleet.workflows import workflows_document
from loom_operator.local.cards import FleetCards
from loom_runtime.wire.push import PUSH_SCHEME

HOST = "127.0.0.1"
ROUTER_MODULE = "loom_router"


def worker_ports(role: RoleName, ports: list[int]) -> WorkerPorts:
    """Ports from `ports_needed(role)` free ports, in order."""
    http, control, events, replay = ports[:4]
    return WorkerPorts(http, control, events, replay, ports[4] if role == "prefill" else None)


def ports_needed(role: RoleName) -> int:
    return 5 if role == "prefill" else 4


@dataclass(frozen=True)
class LaunchOptions:
    """What `loom up` adds to the cards."""

    python: str = sys.executable
    kv_connector: str | None = None
    """--kv-connector of P/D workers (nixl | tcp); None: the runtime's default."""
    threads_per_worker: int | None = None
    """OMP_NUM_THREADS of each worker unless the environment sets it; None: cores / workers."""
    router_module: str = ROUTER_MODULE
    """The router, run as `python -m ROUTER_MODULE` with the router's flags."""


@dataclass(frozen=True)
class WorkerStart:
    """What a starting worker loads: a checkpoint as a version, and a pushed version to
    rebuild from a peer on top of it (None: none)."""

    source: str
    version: str
    rebuild: tuple[str, str, str] | None = None
    """(a peer's control address, the push's update_id, the version it became)."""

    def flags(self) -> list[str]:
        if self.rebuild is None:
            return []
        peer, update_id, version = self.rebuild
        return ["--rebuild-from", peer, "--rebuild-update", update_id, "--rebuild-version", version]


def plan_start(
    source: str, version: str, cards: FleetCards, peers: Mapping[str, str]
) -> WorkerStart:
    """A worker asked to start on `source` as `version`. A pushed version (push://<update_id>)
    lives only in the workers that hold it, so the worker starts from the card's checkpoint and
    rebuilds it from a peer serving it (`peers`: control address -> the version it serves);
    with no such peer it starts as asked, and says in its log that it cannot load a push."""
    if not source.startswith(PUSH_SCHEME):
        return WorkerStart(source, version)
    serving = sorted(address for address, v in peers.items() if v == version)
    if not serving:
        return WorkerStart(source, version)
    card = cards.desired
    update_id = source.removeprefix(PUSH_SCHEME)
    return WorkerStart(card.source_uri, card.weights_version, (serving[0], update_id, version))


def worker_card(cards: FleetCards, source: str, version: str) -> str:
    """The ModelCard YAML a local worker starts from (see `commands.worker_card`)."""
    return commands.worker_card(cards.model, source, version)


def worker_argv(
    cards: FleetCards,
    role: RoleName,
    card_path: Path,
    ports: WorkerPorts,
    version: str,
    options: LaunchOptions,
) -> list[str]:
    """`python -m loom_runtime runtime …` for one worker (the control token goes in the env)."""
    head = [
        options.python,
        "-m",
        "loom_runtime",
        "runtime",
        "--card",
        str(card_path),
        "--host",
        HOST,
    ]
    flags = commands.runtime_flags(
        cards.model, cards.deployment, role, ports, version, options.kv_connector
    )
    return head + flags


def worker_env(
    base: Mapping[str, str], token: str, workers: int, options: LaunchOptions
) -> dict[str, str]:
    """The worker's environment: `base` plus the control token and a torch thread count that
    keeps `workers` processes from oversubscribing the cores (unless `base` sets one)."""
    env = dict(base)
    env[CONTROL_TOKEN_ENV] = token
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "OMP_NUM_THREADS" not in env:
        threads = options.threads_per_worker
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // max(workers, 1))
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def router_config(
    cards: FleetCards, tokenizer_path: Path, stage_urls: Mapping[str, str] | None = None
) -> str:
    """The router's ROUTER.json: model, hashing, the card's router and failover settings, its
    workflows (`stage_urls`: the router of each other card a stage runs on); the endpoints are
    registered over the admin API as workers become ready. A diffusion fleet's router reads no
    tokenizer (it routes by predicted cost, not prefix)."""
    steps = commands.diffusion_steps(cards.model)
    tokenizer = tokenizer_path if steps is None else None
    program = commands.program_steps(cards.model)
    flows = workflows_document(cards.deployment, stage_urls or {})
    doc = router_document(cards.deployment, cards.model.name, tokenizer, steps, program, flows)
    return json.dumps(doc, indent=1, sort_keys=True)


def router_argv(config: Path, port: int, admin_port: int, options: LaunchOptions) -> list[str]:
    """`python -m loom_router …` (the admin token goes in the env: see router_env)."""
    return [
        options.python, "-m", options.router_module, "--config", str(config), "--host", HOST,
        "--port", str(port), "--admin-port", str(admin_port),
    ]  # fmt: skip


def router_env(base: Mapping[str, str], admin_token: str) -> dict[str, str]:
    env = dict(base)
    env[ADMIN_TOKEN_ENV] = admin_token
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
