"""Card errors: `FieldError` records (path, message, code) and `CardError`, which holds all of them.

Owns the conversion from pydantic's errors to camelCase field paths; never decides what is valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pydantic import ValidationError

from loom_runtime.errors import LoomError

# One segment of a field path: a camelCase key or a list index.
PathPart = str | int
# A problem found by a model's own check: (path relative to the model, code, message).
Problem = tuple[tuple[PathPart, ...], str, str]

# pydantic error types whose message reads better with the offending value attached.
_SHOW_INPUT = frozenset({"literal_error", "enum", "extra_forbidden"})


@dataclass(frozen=True)
class FieldError:
    """One problem in a card: where it is (`spec.loops[1].components[0]`), what, and its kind.

    `source` names the file and document (`cards.yaml:2`) when the card came from a file.
    """

    path: str
    message: str
    code: str = "invalid"
    source: str = ""

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.source}: {where}{self.message}" if self.source else f"{where}{self.message}"


class CardError(LoomError):
    """A card (or a set of cards) is invalid; `errors` lists every problem found, not just one."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        super().__init__("\n".join(str(e) for e in self.errors) or "invalid card")


def format_path(parts: Sequence[PathPart]) -> str:
    """`("spec", "loops", 1, "components", 0)` -> `spec.loops[1].components[0]`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("-", "").replace("_", "").isalnum():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def field_errors(exc: ValidationError, prefix: Sequence[PathPart] = ()) -> list[FieldError]:
    """Every error of a pydantic ValidationError as a FieldError with a camelCase path."""
    found: list[FieldError] = []
    for err in exc.errors(include_url=False):
        parts: list[PathPart] = [*prefix, *(p for p in err["loc"] if p != "[key]")]
        message = err["msg"]
        if err["type"] in _SHOW_INPUT:
            message = f"{message} (got {err['input']!r})"
        if "[key]" in err["loc"]:
            message = f"key {parts[-1]!r}: {message}"
        found.append(FieldError(format_path(parts), message, err["type"]))
    return found


def with_source(errors: Iterable[FieldError], source: str) -> list[FieldError]:
    """The same errors, each labelled with where the card came from (`file:document`)."""
    return [replace(e, source=source) for e in errors]
