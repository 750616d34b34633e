"""Typed reads of one component's config.json fields, collecting every problem instead of the first.

Reads plain JSON values only; never opens files or knows what a field means to a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loom_runtime.errors import CheckpointError

_MISSING = object()


class Fields:
    """One config's raw JSON with its path; each read records what is missing or mistyped."""

    def __init__(self, raw: Mapping[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where
        self.errors: list[str] = []

    def _get(self, name: str, default: Any) -> Any:
        value = self.raw.get(name, default)
        if value is _MISSING:
            self.errors.append(f"{name} is missing")
        return value

    def positive_int(self, name: str, default: Any = _MISSING) -> int:
        value = self._get(name, default)
        if value is _MISSING:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.errors.append(f"{name} must be a positive integer, got {value!r}")
            return 0
        return value

    def number(self, name: str, default: Any = _MISSING) -> float:
        value = self._get(name, default)
        if value is _MISSING:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.errors.append(f"{name} must be a number, got {value!r}")
            return 0.0
        return float(value)

    def flag(self, name: str, default: Any = _MISSING) -> bool:
        value = self._get(name, default)
        if value is _MISSING:
            return False
        if not isinstance(value, bool):
            self.errors.append(f"{name} must be true or false, got {value!r}")
            return False
        return value

    def ints(self, name: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self._get(name, default)
        if value is _MISSING:
            return ()
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
        ):
            self.errors.append(f"{name} must be a list of positive integers, got {value!r}")
            return ()
        return tuple(value)

    def flags(self, name: str, default: Any = _MISSING) -> tuple[bool, ...]:
        value = self._get(name, default)
        if value is _MISSING:
            return ()
        if not isinstance(value, list | tuple) or not all(isinstance(v, bool) for v in value):
            self.errors.append(f"{name} must be a list of true/false, got {value!r}")
            return ()
        return tuple(value)

    def numbers(self, name: str, default: Any = _MISSING) -> tuple[float, ...]:
        value = self._get(name, default)
        if value is _MISSING:
            return ()
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            self.errors.append(f"{name} must be a list of numbers, got {value!r}")
            return ()
        return tuple(float(v) for v in value)

    def text(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if value is _MISSING:
            return ""
        if not isinstance(value, str):
            self.errors.append(f"{name} must be a string, got {value!r}")
            return ""
        return value

    def expect(self, name: str, allowed: Iterable[Any], default: Any, why: str) -> None:
        """A field Loom reads but supports only some values of (absent means `default`)."""
        value = self.raw.get(name, default)
        choices = list(allowed)
        if value not in choices:
            self.errors.append(f"{name}={value!r} is not supported ({why})")

    def reject_unknown(self, known: Iterable[str]) -> None:
        """Every field must be one this config class has; `_`-prefixed metadata is skipped."""
        unknown = sorted(k for k in self.raw if not k.startswith("_") and k not in set(known))
        if unknown:
            self.errors.append(
                f"unknown field(s) {', '.join(unknown)}: not a config Loom knows for this class"
            )

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            self.errors.append(message)

    def raise_if_any(self) -> None:
        if self.errors:
            raise CheckpointError(f"{self.where}: " + "; ".join(self.errors))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; CheckpointError naming the file when it is absent or not an object."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a diffusers-format checkpoint needs it")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw
