"""What a local fleet tells the person running it: one `FleetEvent` per notable thing (a worker
started, exited or loaded weights, a condition changed, the card changed or was refused).

Owns the event record; never prints (the CLI renders events) and never decides anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

Level = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class FleetEvent:
    kind: str
    """started | exited | restarted | stopping | stopped | weights | condition | card | router |
    adopted | draining | error"""
    message: str
    worker: str = ""
    level: Level = "info"


EventSink = Callable[[FleetEvent], None]


def log_events(event: FleetEvent) -> None:
    """An EventSink that only logs (the default without a console)."""
    level = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}[event.level]
    logger.log(level, event.message, extra={"event": event.kind, "worker": event.worker})
