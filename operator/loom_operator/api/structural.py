"""Turns a card model's pydantic JSON schema into a Kubernetes structural OpenAPI v3 schema.

Pure: inlines $refs, spells optional as `nullable`, drops what apiextensions rejects; no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

# Keys pydantic writes that a CRD schema does not take (titles are noise in `kubectl explain`).
_DROPPED = frozenset({"title", "$defs"})


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of `model` (camelCase properties, descriptions from docstrings)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}), "#")


def _resolve(node: Schema, defs: Schema) -> Schema:
    """`node` with its $ref replaced by the definition, the node's own keys winning."""
    name = node["$ref"].removeprefix("#/$defs/")
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**defs[name], **siblings}


def _unwrap_optional(node: Schema, where: str) -> Schema:
    """`anyOf: [X, {type: null}]` -> X with `nullable: true`; other unions are not structural."""
    variants = node["anyOf"]
    others = [v for v in variants if v != {"type": "null"}]
    if len(others) != 1:
        raise ValueError(f"{where}: unions other than optional are not structural: {variants}")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    merged = {**others[0], **rest}
    if len(others) < len(variants):
        merged["nullable"] = True
    return merged


def _property_names_rule(enum: list[Any]) -> Schema:
    allowed = json.dumps(enum).replace('"', "'")
    return {"rule": f"self.all(k, k in {allowed})", "message": f"keys must be one of {enum}"}


def _bounds(node: Schema) -> None:
    """Draft 2020-12 numeric exclusive bounds -> OpenAPI v3.0 booleans, in place."""
    for exclusive, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(exclusive)
        if value is not None and not isinstance(value, bool):
            node[plain] = value
            node[exclusive] = True


def _convert(node: Schema, defs: Schema, where: str) -> Schema:
    if "$ref" in node:
        node = _resolve(node, defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        node = _unwrap_optional(node, where)
    if "$ref" in node:
        return _convert(node, defs, where)
    out: Schema = {}
    key_rules: list[Schema] = []
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "description":
            out[key] = " ".join(str(value).split())
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {k: _convert(v, defs, f"{where}.{k}") for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs, f"{where}.{key}")
        elif key == "propertyNames":
            key_rules.append(_property_names_rule(value["enum"]))
        else:
            out[key] = value
    if key_rules:
        out["x-kubernetes-validations"] = [*out.get("x-kubernetes-validations", []), *key_rules]
    _bounds(out)
    return out
