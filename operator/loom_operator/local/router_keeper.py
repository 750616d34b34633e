"""The local router process's upkeep: start it (or adopt the one an earlier controller left),
wait for its admin API, and restart it with backoff when it exits — on the same port, so the
fleet's endpoint never moves.

Owns the router's start and restart timing; never routes (RouterLink does) and never prints
(events go to a sink).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from loom_operator.fleet.workflows import stage_cards
from loom_operator.local.cards import FleetCards
from loom_operator.local.checkpoints import checkpoint_dir
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.launch import router_config
from loom_operator.local.ports import free_ports, port_is_free
from loom_operator.local.routing import RouterLink
from loom_operator.local.state import StateError, StatePaths, load_processes, write_atomic
from loom_operator.local.workers import ProcessSet

HEALTHY_AFTER_S = 60.0  # a router up this long has its restart backoff reset


class RouterKeeper:
    """Starts and keeps the router process of one fleet."""

    def __init__(
        self,
        paths: StatePaths,
        processes: ProcessSet,
        events: EventSink,
        env: Mapping[str, str],
        port: int,
        backoff_cap_s: float,
    ) -> None:
        self._paths = paths
        self._processes = processes
        self._events = events
        self._env = env
        self._port = port
        self._backoff_cap_s = backoff_cap_s
        self._next_start = 0.0
        self._failures = 0
        self._stage_urls: dict[str, str] = {}
        self.spawned = False
        """Whether this controller started a router process (an adopted one is not its own)."""

    @property
    def admin_url(self) -> str:
        router = self._processes.table.router
        assert router is not None, "the router was not started"
        return router.admin_url

    async def start(self, cards: FleetCards, now: float, first: bool = False) -> None:
        """Adopt a running router, or start one on its earlier port (else the settings' port)."""
        old = self._processes.table.router
        if self._processes.router_alive() and old is not None:
            self._events(FleetEvent("router", f"adopted the router (pid {old.pid})"))
            return
        port = old.port if old is not None else self._port
        if not port_is_free(port):
            raise StateError(
                f"port {port} (the fleet's endpoint) is in use: stop what listens there or "
                "pass --port"
            )
        admin = old.admin_port if old is not None and port_is_free(old.admin_port) else None
        admin = admin or free_ports(1, self._processes.table.ports() | {port})[0]
        if first:
            self._events(FleetEvent("router", f"preparing {cards.desired.source_uri}"))
        tokenizer = await checkpoint_dir(cards.desired.source_uri, self._env)
        urls = self._stage_urls = stage_urls(cards, self._paths, self._stage_urls)
        write_atomic(self._paths.router_config, router_config(cards, tokenizer, urls))
        entry = self._processes.start_router(port, admin, now)
        self.spawned = True
        self._events(FleetEvent("router", f"starting the router on port {entry.port}"))

    async def wait_ready(self, link: RouterLink, timeout_s: float) -> None:
        """Until the router's admin API answers; StateError if it exits or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while not await link.refresh():
            if not self._processes.router_alive():
                raise StateError(f"the router exited at start: see {self._paths.log('router')}")
            if time.monotonic() > deadline:
                raise StateError(
                    f"the router's admin API did not answer within {timeout_s:g}s: "
                    f"see {self._paths.log('router')}"
                )
            await asyncio.sleep(0.1)

    async def keep(self, cards: FleetCards, link: RouterLink, now: float) -> None:
        """Restart a router that exited, with exponential backoff up to the cap."""
        if self._processes.router_alive():
            router = self._processes.table.router
            if router is not None and now - router.started_at > HEALTHY_AFTER_S:
                self._failures = 0
            return
        if now < self._next_start:
            return
        self._failures += 1
        self._next_start = now + min(self._backoff_cap_s, 2.0 ** (self._failures - 1))
        self._events(FleetEvent("router", "the router exited; restarting it", level="warning"))
        link.forget()
        await self.start(cards, now)


def stage_urls(cards: FleetCards, paths: StatePaths, known: Mapping[str, str]) -> dict[str, str]:
    """The router URL of every card the workflows run a stage on: the fleet a `loom up` beside
    this one runs for it (its state directory is this one's sibling). `known`: URLs found
    before (a restarted router keeps them). StateError when a card has no fleet here."""
    urls = {}
    for card in stage_cards(cards.deployment):
        if card in known:
            urls[card] = known[card]
            continue
        other = StatePaths(paths.root.parent / card)
        router = load_processes(other).router
        if router is None:
            flows = [f.name for f in cards.deployment.spec.workflows if card in f.cards()]
            raise StateError(
                f"workflow {', '.join(flows)} runs a stage on DeploymentCard {card}, which no "
                f"`loom up` runs here ({other.processes} names no router): start it first, "
                f"on another port (`loom up <its card file> --port 8001`)"
            )
        urls[card] = router.url
    return urls
