"""Where a worker finds a checkpoint: a card's `source.uri` or a LoadWeights source, as a path.

Owns the schemes a worker can load from itself (a path, file:, loom://tiny); never downloads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from loom_runtime.card import Source
from loom_runtime.errors import CheckpointError
from loom_runtime.models.tiny import resolve_source
from loom_runtime.wire.push import PUSH_SCHEME


def checkpoint_path(uri: str, card_path: str | Path | None = None) -> Path:
    """The local directory `uri` names; CheckpointError for what this worker cannot load.

    Relative `file:` URIs and plain relative paths resolve against the card file's directory
    when `card_path` is given, else against the working directory.
    """
    if not uri:
        raise CheckpointError("the checkpoint source is empty: give a path, file:… or loom://tiny")
    if ":" not in uri.split("/", 1)[0] or uri.startswith("/"):
        path = Path(uri)
        if not path.is_absolute() and card_path is not None:
            path = Path(card_path).parent / path
        return path.resolve()
    if uri.startswith(PUSH_SCHEME):
        raise CheckpointError(
            f"{uri} is a version a trainer pushed (docs/rl.md): only the workers that received "
            "that push hold it; start this worker from a checkpoint, or push again"
        )
    try:
        source = Source(uri=uri)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        raise CheckpointError(f"bad checkpoint source {uri!r}: {msg}") from None
    if source.scheme == "file":
        # local_path resolves a relative file: against the card's directory; without a card,
        # a stand-in file in the working directory makes that directory the base.
        base = Path(card_path) if card_path is not None else Path.cwd() / "card.yaml"
        local = source.local_path(base)
        if local is None:  # unreachable for the file scheme; keeps the type narrow
            raise CheckpointError(f"{uri}: no local path")
        return local
    if source.scheme in ("loom", "pvc"):  # pvc: the path in its claim's mount (models/tiny.py)
        return resolve_source(uri)  # generates the tiny checkpoint on first use
    raise CheckpointError(
        f"{uri}: a worker loads only local checkpoints (a path, file:… or loom://tiny); "
        f"fetch {source.scheme}:// sources onto a volume first and point at the path"
    )
