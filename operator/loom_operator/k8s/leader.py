"""Leader election over a coordination.k8s.io Lease: of several operator replicas, one acts.

Owns the Lease protocol (acquire when free or expired, renew while holding, release on a clean
stop); the rule deciding each step is pure (`next_step`). Never acts on cards itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from loom_operator.k8s.kube import Kube, KubeError
from loom_operator.k8s.lease import holder, lease_body, leases_path, live

logger = logging.getLogger(__name__)

Step = Literal["acquire", "renew", "wait"]


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    duration_s: float = 15.0
    """A holder that has not renewed for this long has lost the lease."""
    renew_s: float = 5.0
    """How often the holder renews (and a waiting replica looks again)."""


def next_step(lease: dict[str, Any] | None, me: str, now: datetime) -> Step:
    """acquire a free or expired lease, renew our own, wait while another holds a live one."""
    if lease is None:
        return "acquire"
    if holder(lease) == me:
        return "renew"
    return "wait" if live(lease, now) else "acquire"


class LeaderElector:
    def __init__(self, kube: Kube, settings: LeaseSettings) -> None:
        self.kube, self.settings = kube, settings
        self._path = leases_path(settings.namespace)
        self.lost = threading.Event()

    def _body(
        self, lease: dict[str, Any] | None, now: datetime, acquire: bool, identity: str | None
    ) -> dict[str, Any]:
        s = self.settings
        return lease_body(s.name, s.namespace, identity, s.duration_s, lease, now, acquire=acquire)

    def try_once(self) -> bool:
        """One round of the protocol; True while this replica holds the lease."""
        try:
            lease: dict[str, Any] | None = self.kube.get(f"{self._path}/{self.settings.name}")
        except KubeError as exc:
            if exc.status != 404:
                raise
            lease = None
        now = datetime.now(UTC)
        step = next_step(lease, self.settings.identity, now)
        if step == "wait":
            return False
        body = self._body(lease, now, step == "acquire", self.settings.identity)
        try:
            if lease is None:
                self.kube.create(self._path, body)
            else:
                self.kube.call("PUT", f"{self._path}/{self.settings.name}", body)
        except KubeError as exc:
            if exc.status in (409, 422):  # another replica won this round
                return False
            raise
        if step == "acquire":
            logger.info("leader election: acquired lease %s/%s as %s", self.settings.namespace,
                        self.settings.name, self.settings.identity)  # fmt: skip
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica leads (True) or `stop` is set (False)."""
        told = False
        while not stop.is_set():
            try:
                if self.try_once():
                    return True
            except (KubeError, OSError) as exc:
                logger.warning("leader election: %s", exc)
            if not told:
                logger.info("leader election: another replica leads; waiting for lease %s",
                            self.settings.name)  # fmt: skip
                told = True
            stop.wait(self.settings.renew_s)
        return False

    def keep(self, stop: threading.Event) -> None:
        """Renew until `stop`; if renewing fails for a whole lease duration, set `lost`."""
        last_ok = datetime.now(UTC)
        while not stop.wait(self.settings.renew_s):
            try:
                if self.try_once():
                    last_ok = datetime.now(UTC)
                    continue
                expired = True  # another replica holds it now
            except (KubeError, OSError) as exc:
                logger.warning("leader election: renew failed: %s", exc)
                expired = datetime.now(UTC) - last_ok >= timedelta(seconds=self.settings.duration_s)
            if expired:
                logger.error("leader election: lease %s lost; stopping", self.settings.name)
                self.lost.set()
                return

    def release(self) -> None:
        """Give the lease up on a clean stop, so a successor need not wait for it to expire."""
        try:
            lease = self.kube.get(f"{self._path}/{self.settings.name}")
            if (lease.get("spec") or {}).get("holderIdentity") != self.settings.identity:
                return
            body = self._body(lease, datetime.now(UTC), False, None)
            self.kube.call("PUT", f"{self._path}/{self.settings.name}", body)
        except (KubeError, OSError) as exc:
            logger.warning("leader election: release failed: %s", exc)
