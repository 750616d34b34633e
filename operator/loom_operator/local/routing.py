"""The controller's hold on the router's endpoint table: what the router last said it has, and
the few idempotent moves the fleet needs (register, route on, drain, mark down, migrate, remove).

Owns skipping calls the router's table already satisfies and re-registering a worker whose
address or weights version changed; never decides which move to make (the fleet core does).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from loom_operator.control.router_admin import RouterAdmin, RouterAdminError
from loom_operator.local.state import WorkerEntry
from loom_runtime.wire.router_admin import EndpointRecord, EndpointSpec, Op

logger = logging.getLogger(__name__)


def endpoint_spec(entry: WorkerEntry, weights_version: str) -> EndpointSpec:
    """How the router reaches `entry` and which weights it serves."""
    return EndpointSpec(
        url=entry.url,
        role=entry.role,
        weights_version=weights_version,
        kv_events=f"tcp://127.0.0.1:{entry.kv_events_port}",
        kv_replay=f"tcp://127.0.0.1:{entry.kv_replay_port}",
    )


class RouterLink:
    """The router's endpoint table as last read, and calls that keep it in step."""

    def __init__(self, admin: RouterAdmin) -> None:
        self.admin = admin
        self.view: dict[str, EndpointRecord] = {}
        self.known = False
        """True once the table was read since the router (re)started."""
        self.held = 0
        """Requests the router held for paused capacity when last asked."""

    async def refresh(self) -> bool:
        """Re-read the table; False (keeping the last view) when the router does not answer."""
        try:
            self.view = await self.admin.endpoints()
        except RouterAdminError as exc:
            logger.info("router table unavailable: %s", exc)
            return False
        self.known = True
        return True

    async def refresh_held(self, metrics_url: str) -> None:
        """Re-read the held-requests count (kept when the router does not answer)."""
        try:
            self.held = await self.admin.held_requests(metrics_url)
        except RouterAdminError as exc:
            logger.info("router metrics unavailable: %s", exc)

    def forget(self) -> None:
        """The router restarted: its table is empty until read again."""
        self.view = {}
        self.known = False
        self.held = 0

    def routed(self, name: str) -> bool:
        e = self.view.get(name)
        return e is not None and e.routed

    async def register(self, name: str, spec: EndpointSpec) -> None:
        """PUT the endpoint unless the router already has it exactly so."""
        current = self.view.get(name)
        if current is not None and current.spec == spec:
            return
        await self.admin.put(name, spec)
        draining = current.draining if current is not None else False
        down = current.down if current is not None else False
        self.view[name] = EndpointRecord(name, spec, draining=draining, down=down)

    async def route_on(self, name: str, spec: EndpointSpec) -> None:
        """Registered as `spec`, not draining, not down."""
        await self.register(name, spec)
        e = self.view[name]
        if e.draining:
            await self.admin.op(name, "undrain")
        if e.down and not e.down_by_router:  # the router's own probe brings that one back
            await self.admin.op(name, "up")
        self.view[name] = replace(e, draining=False, down=e.down and e.down_by_router)

    async def drain(self, name: str) -> bool:
        """Drain the endpoint; True when this call drained it (it was taking requests)."""
        e = self.view.get(name)
        if e is not None and not e.draining:
            await self._op_known(name, "drain")
            return True
        return False

    def quiet(self, name: str) -> bool:
        """The router has nothing in flight to the endpoint (or does not know it)."""
        e = self.view.get(name)
        return e is None or e.in_flight == 0

    async def down(self, name: str) -> None:
        e = self.view.get(name)
        if e is not None and (not e.down or e.down_by_router):
            await self._op_known(name, "down")

    async def migrate(self, name: str) -> None:
        if name in self.view:
            await self._op_known(name, "migrate")

    async def remove(self, name: str) -> None:
        if name in self.view:
            await self.admin.delete(name)
            self.view.pop(name, None)

    async def remove_unknown(self, names: set[str]) -> None:
        """Remove endpoints of workers the fleet no longer has (left by an earlier controller)."""
        for name in sorted(set(self.view) - names):
            await self.remove(name)

    async def _op_known(self, name: str, op: Op) -> None:
        try:
            await self.admin.op(name, op)
        except RouterAdminError as exc:
            if exc.status != 404:
                raise
            self.view.pop(name, None)
            return
        e = self.view[name]
        if op == "drain":
            self.view[name] = replace(e, draining=True)
        elif op == "down":
            self.view[name] = replace(e, down=True, down_by_router=False)
