"""Readiness, liveness and startup probes: the kubelet's timing rules and the three handlers.

Owns when a probe is due and what its thresholds make of the results; never restarts a
container itself (the pod runner reads `failed`).
"""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ProbeState:
    """One probe of one container run: its spec and the kubelet's success/failure counters."""

    spec: Mapping[str, Any]
    started_at: float
    last_run: float = 0.0
    successes: int = 0
    failures: int = 0
    ok: bool = False
    failed: bool = False

    def due(self, now: float) -> bool:
        if now < self.started_at + float(self.spec.get("initialDelaySeconds") or 0):
            return False
        return now >= self.last_run + float(self.spec.get("periodSeconds") or 10)

    def record(self, now: float, success: bool) -> None:
        self.last_run = now
        if success:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold") or 1):
                self.ok, self.failed = True, False
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.failures >= int(self.spec.get("failureThreshold") or 3):
                self.ok, self.failed = False, True


def _port(value: Any, ports: Sequence[Mapping[str, Any]]) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for p in ports:
        if p.get("name") == value:
            return int(p["containerPort"])
    raise ValueError(f"probe names port {value!r}, which the container does not declare")


def run_probe(
    spec: Mapping[str, Any], pod_ip: str, ports: Sequence[Mapping[str, Any]], pid: int
) -> bool:
    """Runs one probe now; True on success. `pid` is the container's, for exec probes."""
    timeout = float(spec.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in spec:
            get = spec["httpGet"]
            host, port = get.get("host") or pod_ip, _port(get["port"], ports)
            cls = (
                http.client.HTTPSConnection
                if get.get("scheme") == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = cls(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                conn.request("GET", get.get("path") or "/", headers=headers)
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in spec:
            tcp = spec["tcpSocket"]
            with socket.create_connection(
                (tcp.get("host") or pod_ip, _port(tcp["port"], ports)), timeout=timeout
            ):
                return True
        if "exec" in spec:
            # Inside the container's mount namespace, as `kubectl exec` would be.
            argv = ["nsenter", "-t", str(pid), "-m", "--", *spec["exec"]["command"]]
            return subprocess.run(argv, timeout=timeout, capture_output=True).returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired, http.client.HTTPException):
        return False
    return False
