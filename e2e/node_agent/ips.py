"""Pod IPs for one stand-in node: addresses of a 127.x.y.0/24, reused least recently first.

Owns which address each pod holds; never hands one address to two live pods.
"""

from __future__ import annotations

import ipaddress
from collections import deque


class IPPoolExhausted(RuntimeError):
    pass


class IPPool:
    """Addresses .2 to .254 of `cidr` (a /24 inside 127.0.0.0/8)."""

    def __init__(self, cidr: str) -> None:
        net = ipaddress.IPv4Network(cidr)
        if not net.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")) or net.prefixlen != 24:
            raise ValueError(f"pod CIDR {cidr} must be a /24 inside 127.0.0.0/8")
        self._free: deque[str] = deque(str(net.network_address + i) for i in range(2, 255))
        self._held: dict[str, str] = {}

    def take(self, pod_uid: str) -> str:
        if pod_uid in self._held:
            return self._held[pod_uid]
        if not self._free:
            raise IPPoolExhausted("no pod IP left on this node (253 pods)")
        ip = self._free.popleft()
        self._held[pod_uid] = ip
        return ip

    def release(self, pod_uid: str) -> None:
        ip = self._held.pop(pod_uid, None)
        if ip is not None:
            self._free.append(ip)
