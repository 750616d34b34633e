"""Checks that a CRD schema is structural, as the API server requires (apiextensions v1).

Pure: walks a schema and lists every violation with its path; never fixes one.
"""

from __future__ import annotations

import re
from typing import Any

Schema = dict[str, Any]

TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
# What pydantic or JSON Schema 2020-12 may produce and a structural schema must not contain.
FORBIDDEN = ("$ref", "$defs", "definitions", "const", "oneOf", "allOf", "not", "prefixItems")
CEL_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "size"})
_CEL_REF = re.compile(r"\bself((?:\.[A-Za-z_]\w*)+)")
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _fits(kind: str | None, value: object) -> bool:
    """Whether a default or enum value has the node's type."""
    checks: dict[str, tuple[type, ...]] = {
        "integer": (int,),
        "number": (int, float),
        "string": (str,),
        "boolean": (bool,),
        "object": (dict,),
        "array": (list,),
    }
    if kind is None or kind not in checks:
        return True
    if kind != "boolean" and isinstance(value, bool):
        return False
    return isinstance(value, checks[kind])


def _type_problems(node: Schema, path: str) -> list[str]:
    if node.get("x-kubernetes-int-or-string"):
        ok = "type" not in node and node.get("anyOf", _INT_OR_STRING) == _INT_OR_STRING
        return [] if ok else [f"{path}: int-or-string takes no type and anyOf integer|string only"]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return []
    problems = [f"{path}: anyOf outside int-or-string"] if "anyOf" in node else []
    if node.get("type") not in TYPES:
        problems.append(f"{path}: every node needs a type (got {node.get('type')!r})")
    return problems


def _value_problems(node: Schema, path: str) -> list[str]:
    problems = [f"{path}: {key} is not structural" for key in FORBIDDEN if key in node]
    kind = node.get("type")
    if "nullable" in node and not isinstance(node["nullable"], bool):
        problems.append(f"{path}: nullable must be a boolean")
    if "default" in node:
        default = node["default"]
        if default is None or not _fits(kind, default):
            problems.append(f"{path}: default {default!r} does not fit type {kind}")
        elif "enum" in node and default not in node["enum"]:
            problems.append(f"{path}: default {default!r} is not in the enum")
    wrong = [v for v in node.get("enum", ()) if not _fits(kind, v)]
    problems += [f"{path}: enum value {v!r} is not {kind}" for v in wrong]
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if key in node and (not isinstance(node[key], bool) or bound not in node):
            problems.append(f"{path}: {key} must be a boolean next to {bound}")
    return problems


def _shape_problems(node: Schema, path: str) -> list[str]:
    problems: list[str] = []
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if props is not None and extra is not None:
        problems.append(f"{path}: properties and additionalProperties exclude each other")
    if extra is not None and not isinstance(extra, dict):
        problems.append(f"{path}: additionalProperties must be a schema, not {extra!r}")
    missing = [name for name in node.get("required", ()) if name not in (props or {})]
    problems += [f"{path}: required {name!r} is not a property" for name in missing]
    if node.get("type") == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{path}: an array needs one items schema")
    if node.get("x-kubernetes-list-type") == "map":
        items = node.get("items") or {}
        keys = node.get("x-kubernetes-list-map-keys") or []
        if not keys or any(k not in items.get("required", ()) for k in keys):
            problems.append(f"{path}: list-map keys must be required fields of the items")
    return problems


def _cel_problems(node: Schema, path: str) -> list[str]:
    """Every `self.a.b` in a CEL rule names properties that exist."""
    problems: list[str] = []
    for rule in node.get("x-kubernetes-validations", ()):
        if not rule.get("rule") or not rule.get("message"):
            problems.append(f"{path}: a CEL rule needs rule and message")
        for match in _CEL_REF.finditer(rule.get("rule", "")):
            here = node
            for name in match.group(1).split(".")[1:]:
                if name in CEL_MACROS or "properties" not in here:
                    break
                if name not in here["properties"]:
                    problems.append(f"{path}: CEL rule refers to unknown field self.{name}")
                    break
                here = here["properties"][name]
    return problems


def _walk(node: object, path: str) -> list[str]:
    if not isinstance(node, dict):
        return [f"{path}: a schema must be a mapping"]
    problems = [
        *_type_problems(node, path),
        *_value_problems(node, path),
        *_shape_problems(node, path),
        *_cel_problems(node, path),
    ]
    for name, child in (node.get("properties") or {}).items():
        problems += _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            problems += _walk(node[key], f"{path}.{key}")
    return problems


def structural_problems(schema: Schema) -> list[str]:
    """Every way `schema` (a CRD's openAPIV3Schema) breaks the structural-schema rules."""
    problems = _walk(schema, "openAPIV3Schema")
    metadata = (schema.get("properties") or {}).get("metadata")
    if metadata is not None and metadata != {"type": "object"}:
        problems.append("openAPIV3Schema.metadata: may only be {type: object}")
    return problems
