"""The local state file of the fleet controller: the FleetRecord as JSON, replaced atomically.

Owns reading and writing that one file; never decides anything. (On Kubernetes the record lives
in the DeploymentCard's status instead.) A crash mid-write leaves the old file or the new one,
never a mix: the record is written to a temporary file beside it, flushed, then renamed over it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from loom_operator.fleet.record import FleetRecord, RecordError


def load_record(path: str | Path) -> FleetRecord:
    """The record saved at `path`; an empty record when there is no file yet (a new fleet).

    Raises RecordError, naming the file, when it exists but cannot be read as a record.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return FleetRecord()
    except OSError as e:
        raise RecordError(f"{p}: cannot read the fleet state file: {e}") from e
    try:
        return FleetRecord.from_json(text)
    except RecordError as e:
        raise RecordError(f"{p}: {e}") from e


def save_record(path: str | Path, record: FleetRecord) -> None:
    """Write `record` to `path` atomically (temp file in the same directory, fsync, rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(record.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(p.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (not supported everywhere; harmless where it is not)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
