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
from typing import Any

import yaml

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import Role, RoleName
from loom_operator.fleet.desired import served_component
from loom_operator.local.cards import FleetCards

CONTROL_TOKEN_ENV = "LOOM_CONTROL_TOKEN"
ADMIN_TOKEN_ENV = "LOOM_ROUTER_ADMIN_TOKEN"
HOST = "127.0.0.1"
ROUTER_MODULE = "loom_router"
# Card precision / engine dtype -> the runtime's --dtype (fp8 has no CPU compute dtype: default).
DTYPES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class WorkerPorts:
    http: int
    control: int
    kv_events: int
    kv_replay: int
    kv_side: int | None = None
    """Prefill only: the KV side channel decode workers pull from."""

    @classmethod
    def from_list(cls, role: RoleName, ports: list[int]) -> WorkerPorts:
        """Ports from `ports_needed(role)` free ports, in order."""
        http, control, events, replay = ports[:4]
        return cls(http, control, events, replay, ports[4] if role == "prefill" else None)


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


def role_settings(cards: FleetCards, role: RoleName) -> Role:
    role_card = cards.deployment.spec.roles.present().get(role)
    if role_card is None:  # a worker of a role the card dropped (retiring): its defaults
        return Role()
    return role_card


def worker_dtype(cards: FleetCards, role: RoleName) -> str | None:
    engine = role_settings(cards, role).engine
    name = engine.dtype or served_component(cards.model).precision.weights
    return DTYPES.get(name)


def worker_card(cards: FleetCards, source: str, version: str) -> str:
    """The ModelCard YAML a worker starts from: the served component first (the runtime serves
    `components[0]`), loading `source` as `version`."""
    doc: dict[str, Any] = cards.model.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc.pop("status", None)
    served = served_component(cards.model).name
    comps = doc["spec"]["components"]
    comps.sort(key=lambda c: c["name"] != served)
    comps[0]["source"] = {"uri": source}
    comps[0]["weightsVersion"] = version
    return yaml.safe_dump(doc, sort_keys=False)


def worker_argv(
    cards: FleetCards,
    role: RoleName,
    card_path: Path,
    ports: WorkerPorts,
    version: str,
    options: LaunchOptions,
) -> list[str]:
    """`python -m loom_runtime runtime …` for one worker (the control token goes in the env)."""
    engine = role_settings(cards, role).engine
    argv = [
        options.python, "-m", "loom_runtime", "runtime",
        "--card", str(card_path), "--role", role, "--host", HOST,
        "--port", str(ports.http), "--control-port", str(ports.control),
        "--kv-events-port", str(ports.kv_events), "--kv-events-replay-port", str(ports.kv_replay),
        "--block-size", str(engine.block_size), "--max-num-seqs", str(engine.max_num_seqs),
        "--weights-version", version,
    ]  # fmt: skip
    if engine.max_model_len is not None:
        argv += ["--max-model-len", str(engine.max_model_len)]
    dtype = worker_dtype(cards, role)
    if dtype is not None:
        argv += ["--dtype", dtype]
    if role != "aggregated":
        argv += ["--on-transfer-failure", cards.deployment.spec.failover.on_transfer_failure]
        if options.kv_connector is not None:
            argv += ["--kv-connector", options.kv_connector]
    if ports.kv_side is not None:
        argv += ["--kv-side-port", str(ports.kv_side)]
    return argv


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


def router_config(cards: FleetCards, tokenizer_path: Path) -> str:
    """The router's ROUTER.json: model, hashing, the card's router and failover settings; the
    endpoints are registered over the admin API as workers become ready."""
    doc = router_document(cards.deployment, cards.model.name, tokenizer_path)
    return json.dumps(doc, indent=1, sort_keys=True)


def router_document(
    card: DeploymentCard, model_name: str, tokenizer_path: Path | None
) -> dict[str, Any]:
    """ROUTER.json as a document. The block size is the decode role's (or the aggregated
    role's): the pool whose cache the prefix index predicts. Prefill pods report theirs in every
    KV event, and a pod whose block size differs is flagged by the index, never scored zero."""
    spec = card.spec
    roles = spec.roles.present()
    engine_role = roles.get("decode") or roles.get("aggregated") or roles.get("prefill")
    block_size = engine_role.engine.block_size if engine_role is not None else 16
    return {
        "model_name": model_name,
        "tokenizer_path": None if tokenizer_path is None else str(tokenizer_path),
        "block_size": block_size,
        "hash_seed": spec.prefix_caching.hash_seed,
        "hash_algo": spec.prefix_caching.hash_algo,
        "router": spec.router.model_dump(mode="json", by_alias=True),
        "failover": spec.failover.model_dump(mode="json", by_alias=True),
        "endpoints": [],
    }


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
