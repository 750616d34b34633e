"""`loom up`'s pushes: the coordinator (control/pushes.py) over the local process table, the push
every worker staged kept in the state directory, and the trainer's TCPStore on this machine.

Owns where a local push is persisted and how a local worker is reached; never decides anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from loom_operator.control.client import ControlClient
from loom_operator.control.probe import Observer
from loom_operator.control.pushes import PushCoordinator
from loom_operator.fleet.push import PushUpdate
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.state import write_atomic
from loom_operator.local.workers import ProcessSet

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


def local_pushes(
    processes: ProcessSet, observer: Observer, events: EventSink, wake: Callable[[], None],
    path: Path,
) -> PushCoordinator:  # fmt: skip
    """The local fleet's push coordinator; the push every worker staged is kept at `path`."""

    def client(name: str) -> ControlClient | None:
        entry = processes.table.get(name)
        return None if entry is None else observer.control(entry)

    def say(message: str, warning: bool) -> None:
        events(FleetEvent("push", message, level="warning" if warning else "info"))

    def persist(update: PushUpdate) -> None:
        write_atomic(path, json.dumps(update.as_json()))

    return PushCoordinator(client, say, wake, persist, load_serving(path))


def load_serving(path: Path) -> PushUpdate | None:
    """The push the fleet served when the controller last ran (None: none, or unreadable)."""
    try:
        return PushUpdate.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("%s: ignored (%s); the fleet serves the card's version", path, exc)
        return None
