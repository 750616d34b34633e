"""The JSON-schema rewrite Loom applies before xgrammar compiles a schema: a string bounded by
minLength / maxLength gets an equivalent pattern that excludes raw control characters.

xgrammar 0.2.9 compiles a length-bounded string to the class [^"\\\r\n], which admits the
other control characters (U+0000-U+001F) that JSON forbids unescaped, so `json.loads` rejects
such an answer. Owns only this rewrite; never changes what a schema accepts otherwise.
"""

from __future__ import annotations

from typing import Any

_SHAPED = ("pattern", "format", "enum", "const")


def without_raw_controls(schema: Any) -> Any:
    """`schema` with every length-bounded plain string expressed as a pattern of the same
    length bounds over characters JSON allows unescaped (the rest of the schema unchanged)."""
    if isinstance(schema, list):
        return [without_raw_controls(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: without_raw_controls(value) for key, value in schema.items()}
    bounded = "minLength" in out or "maxLength" in out
    if out.get("type") == "string" and bounded and not any(k in out for k in _SHAPED):
        low = int(out.pop("minLength", 0))
        high = out.pop("maxLength", None)
        top = "" if high is None else str(int(high))
        out["pattern"] = '^[^\\x00-\\x1f"\\\\]{' + f"{low},{top}" + "}$"
    return out
