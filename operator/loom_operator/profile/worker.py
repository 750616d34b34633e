"""The one worker a profile measures: a `loom runtime` process started as `loom up` starts one
(`local.launch`: the same ModelCard, flags and environment), from a one-worker aggregated card
that carries the profiled role's engine settings, waited on until it answers /ready.

Owns that process from start to stop (stopped on every way out); never sends it load.
Why one bare worker and not `loom up` on a one-worker card: the capacity is one worker's, so
the router's hop, a controller and the planner would only add noise and processes to measure
around; the worker's own OpenAI routes serve the load, and its argv is `loom up`'s own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp

from loom_operator.api.roles import RoleName, Roles
from loom_operator.fleet.commands import role_settings
from loom_operator.local.cards import FleetCards
from loom_operator.local.launch import (
    LaunchOptions,
    ports_needed,
    worker_argv,
    worker_card,
    worker_env,
    worker_ports,
)
from loom_operator.local.ports import free_ports
from loom_operator.local.process import LocalProcess
from loom_operator.profile.load import Target

POLL_S = 0.2
STOP_GRACE_S = 15.0


class WorkerStartError(RuntimeError):
    """The worker exited or did not become ready in time; the message names its log."""


def aggregated_cards(cards: FleetCards, role: RoleName) -> FleetCards:
    """`cards` with one aggregated worker that has `role`'s settings (engine, parallelism), and
    no autoscaling section (it names roles this card no longer has)."""
    settings = role_settings(cards.deployment, role)
    roles = Roles(aggregated=settings.model_copy(update={"replicas": 1}))
    spec = cards.deployment.spec.model_copy(update={"roles": roles, "autoscaling": None})
    deployment = cards.deployment.model_copy(update={"spec": spec})
    return dataclasses.replace(cards, deployment=deployment)


async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/ready", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _wait_ready(proc: LocalProcess, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while not await _ready(session, url):
            if not proc.alive():
                raise WorkerStartError(
                    f"the worker exited ({proc.exit_code()}) before it was ready; its log: {log}"
                )
            if time.monotonic() > deadline:
                raise WorkerStartError(
                    f"the worker was not ready after {timeout:g}s; its log: {log}"
                )
            await asyncio.sleep(POLL_S)


@contextlib.asynccontextmanager
async def profiled_worker(
    cards: FleetCards, role: RoleName, logs: Path, env: Mapping[str, str], timeout: float
) -> AsyncIterator[Target]:
    """One ready aggregated worker with `role`'s settings (its log in `logs`); always stopped."""
    one = aggregated_cards(cards, role)
    ports = worker_ports("aggregated", free_ports(ports_needed("aggregated")))
    logs.mkdir(parents=True, exist_ok=True)
    card_path = (logs / f"{role}-worker-card.yaml").resolve()
    desired = cards.desired
    card_path.write_text(worker_card(one, desired.source_uri, desired.weights_version))
    options = LaunchOptions()
    argv = worker_argv(one, "aggregated", card_path, ports, desired.weights_version, options)
    log = logs / f"{role}-worker.log"
    proc = LocalProcess.spawn(
        f"profile-{role}", argv, worker_env(env, secrets.token_hex(16), 1, options), log
    )
    url = f"http://127.0.0.1:{ports.http}"
    try:
        await _wait_ready(proc, url, log, timeout)
        yield Target(url, cards.model.name)
    finally:
        await proc.stop(STOP_GRACE_S)
