"""Free ports: distinct, never one the fleet already handed out, and really bindable."""

from __future__ import annotations

import socket

from loom_operator.local.ports import free_ports, port_is_free


def test_free_ports_are_distinct_and_skip_the_ones_to_avoid() -> None:
    first = free_ports(4)
    again = free_ports(6, avoid=first)
    assert len(set(first)) == 4
    assert len(set(again)) == 6
    assert not set(first) & set(again)


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port)
    assert port_is_free(port)
