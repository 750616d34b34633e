"""The state directory of a local fleet (`.loom/<deployment>/`): what another shell or a restarted
controller needs to find the fleet — the applied card, the record, processes, secrets, logs.

Owns the layout, atomic writes and the process table's versioned JSON; never starts a process
or decides anything. Every file is replaced atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

SCHEMA = "loom.dev/local-processes"
SCHEMA_VERSION = 1
DEFAULT_ROOT = Path(".loom")


class StateError(RuntimeError):
    """The state directory cannot be used: a file is unreadable, or another controller holds it."""


@dataclass(frozen=True)
class StatePaths:
    """Where each part of one fleet's state lives."""

    root: Path

    @classmethod
    def for_deployment(cls, deployment: str, base: Path = DEFAULT_ROOT) -> StatePaths:
        return cls(base / deployment)

    @property
    def card(self) -> Path:
        """The card the controller serves (`loom apply` replaces it)."""
        return self.root / "card.yaml"

    @property
    def applied(self) -> Path:
        """Where the applied card came from (relative sources resolve against its directory)."""
        return self.root / "applied.json"

    @property
    def record(self) -> Path:
        """The fleet controller's FleetRecord."""
        return self.root / "record.json"

    @property
    def processes(self) -> Path:
        return self.root / "processes.json"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets.json"

    @property
    def status(self) -> Path:
        """The controller's latest view of the fleet, for `loom status`."""
        return self.root / "status.json"

    @property
    def lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def controller(self) -> Path:
        """The running controller's pid and endpoint."""
        return self.root / "controller.json"

    @property
    def router_config(self) -> Path:
        return self.root / "router.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def worker_card(self, name: str) -> Path:
        """The ModelCard a worker was started with (its source and version filled in)."""
        return self.root / "workers" / f"{name}.yaml"


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` by `text`: a crash leaves the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Secrets:
    """Shared tokens of the fleet: workers' control service and the router's admin API."""

    control_token: str
    admin_token: str


def load_or_create_secrets(paths: StatePaths) -> Secrets:
    """The fleet's tokens; new random ones (file mode 0600) the first time."""
    try:
        doc = json.loads(paths.secrets.read_text(encoding="utf-8"))
        return Secrets(str(doc["control_token"]), str(doc["admin_token"]))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StateError(f"{paths.secrets}: unreadable ({e}); delete it to make new tokens") from e
    s = Secrets(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
    write_atomic(paths.secrets, json.dumps(dataclasses.asdict(s)), mode=0o600)
    return s


@dataclass(frozen=True)
class WorkerEntry:
    """One worker process: how to find it, check it is still the same process, and reach it."""

    name: str
    role: Literal["prefill", "decode", "aggregated"]
    pid: int
    ident: str | None
    """The process's start time in clock ticks (/proc): tells it from a later process that got
    the same pid. None where /proc is not available."""
    started_at: float
    http_port: int
    control_port: int
    kv_events_port: int
    kv_replay_port: int
    kv_side_port: int | None
    version: str
    """The weights version it serves as far as the controller knows: the one it was started
    with, or the last one a LoadWeights call finished loading."""
    source: str
    restarts: int = 0
    last_exit_at: float | None = None
    stopping: bool = False
    """Being stopped (scale-down): no longer part of the fleet; stop it if still alive."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def control(self) -> str:
        return f"127.0.0.1:{self.control_port}"

    def ports(self) -> tuple[int, ...]:
        ports = (self.http_port, self.control_port, self.kv_events_port, self.kv_replay_port)
        return ports + (() if self.kv_side_port is None else (self.kv_side_port,))


@dataclass(frozen=True)
class RouterEntry:
    """The router process."""

    pid: int
    ident: str | None
    started_at: float
    port: int
    admin_port: int
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"


@dataclass(frozen=True)
class ProcessTable:
    """Every process the fleet runs, as the controller last wrote it."""

    workers: tuple[WorkerEntry, ...] = ()
    router: RouterEntry | None = None

    def get(self, name: str) -> WorkerEntry | None:
        return next((w for w in self.workers if w.name == name), None)

    def with_worker(self, entry: WorkerEntry) -> ProcessTable:
        """This table with `entry` added or replacing the worker of the same name."""
        rest = tuple(w for w in self.workers if w.name != entry.name)
        return dataclasses.replace(self, workers=tuple(sorted((*rest, entry), key=_name)))

    def without(self, name: str) -> ProcessTable:
        return dataclasses.replace(self, workers=tuple(w for w in self.workers if w.name != name))

    def ports(self) -> set[int]:
        """Every port the table hands out (new processes must not get one of them)."""
        out = {p for w in self.workers for p in w.ports()}
        if self.router is not None:
            out |= {self.router.port, self.router.admin_port}
        return out

    def to_json(self) -> str:
        doc = {"schema": SCHEMA, "version": SCHEMA_VERSION, **dataclasses.asdict(self)}
        return json.dumps(doc, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str = "processes.json") -> ProcessTable:
        try:
            doc = json.loads(text)
            if doc.get("schema") != SCHEMA or doc.get("version") != SCHEMA_VERSION:
                raise StateError(f"{where}: not a {SCHEMA} v{SCHEMA_VERSION} file")
            workers = tuple(_entry(WorkerEntry, w) for w in doc["workers"])
            router = None if doc["router"] is None else _entry(RouterEntry, doc["router"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StateError(f"{where}: unreadable process table: {e}") from e
        return cls(workers, router)


def _name(w: WorkerEntry) -> str:
    return w.name


E = TypeVar("E")


def _entry(cls: type[E], doc: Any) -> E:
    if not isinstance(doc, dict):
        raise TypeError(f"expected an object, got {doc!r}")
    return cls(**doc)


def load_processes(paths: StatePaths) -> ProcessTable:
    """The process table; an empty one when the fleet never ran here."""
    try:
        text = paths.processes.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ProcessTable()
    return ProcessTable.from_json(text, str(paths.processes))


def save_processes(paths: StatePaths, table: ProcessTable) -> None:
    write_atomic(paths.processes, table.to_json())


class ControllerLock:
    """Held by the one controller of a state directory (released by the OS if it dies)."""

    def __init__(self, paths: StatePaths) -> None:
        self._path = paths.lock
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock; StateError when another controller holds it."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        f = self._path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise StateError(
                f"another `loom up` runs this fleet ({self._path.parent}): use `loom status`, "
                "`loom apply` or `loom down`"
            ) from None
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def controller_running(paths: StatePaths) -> bool:
    """True when a controller holds the state directory's lock now."""
    if not paths.lock.exists():
        return False
    with paths.lock.open("a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return False


@dataclass(frozen=True)
class ControllerInfo:
    """Who runs the fleet and where clients reach it."""

    pid: int
    started_at: float
    endpoint: str
    """The router's OpenAI base URL (http://127.0.0.1:PORT/v1)."""
    weights_url: str = ""
    """The controller's weight-push API (http://127.0.0.1:PORT), where a trainer connects."""


def save_controller(paths: StatePaths, info: ControllerInfo) -> None:
    write_atomic(paths.controller, json.dumps(dataclasses.asdict(info)))


def load_controller(paths: StatePaths) -> ControllerInfo | None:
    try:
        doc = json.loads(paths.controller.read_text(encoding="utf-8"))
        return _entry(ControllerInfo, doc)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise StateError(f"{paths.controller}: unreadable: {e}") from e


@dataclass(frozen=True)
class Applied:
    """Where the applied card came from."""

    origin: str
    """Absolute path of the file that was applied (relative sources resolve against it)."""
    sha256: str
    applied_at: float


def save_applied(paths: StatePaths, text: str, applied: Applied) -> None:
    """Install `text` as the card to serve, then say where it came from."""
    write_atomic(paths.card, text)
    write_atomic(paths.applied, json.dumps(dataclasses.asdict(applied)))


def load_applied(paths: StatePaths) -> Applied | None:
    try:
        return _entry(Applied, json.loads(paths.applied.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise StateError(f"{paths.applied}: unreadable: {e}") from e


def find_state(
    deployment: str | None, state_dir: Path | None, base: Path = DEFAULT_ROOT
) -> StatePaths:
    """The state directory: `state_dir` if given, else `base/<deployment>`, else the only fleet
    under `base`. StateError says what to pass when that is ambiguous or there is none."""
    if state_dir is not None:
        return StatePaths(state_dir)
    if deployment is not None:
        return StatePaths.for_deployment(deployment, base)
    fleets = sorted(p for p in base.glob("*") if (p / "processes.json").exists())
    if len(fleets) == 1:
        return StatePaths(fleets[0])
    if not fleets:
        raise StateError(f"no local fleet under {base}/: start one with `loom up CARD.yaml`")
    names = ", ".join(p.name for p in fleets)
    raise StateError(f"several fleets under {base}/ ({names}): pass CARD.yaml or --state-dir")
