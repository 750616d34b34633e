"""Structured outputs on the wire: OpenAI's `response_format` and vLLM's `structured_outputs`
object, parsed into one GrammarSpec (what the output must match, and the field that asked).

Owns the request shapes and which of vLLM 0.33's sub-fields are honoured or refused; never
compiles a grammar (the engine's grammar compiler does) and never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loom_runtime.errors import InvalidRequestError

GrammarKind = Literal["json", "json_object", "regex", "choice", "grammar"]
MAX_GRAMMAR_CHARS = 65_536
"""The longest schema, regex, grammar or choice list (as JSON text) a request may send."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class JsonSchemaFormat(_Body):
    """OpenAI's response_format.json_schema (`schema` is a pydantic name, hence the alias)."""

    name: str
    description: str | None = None  # documentation for the model; does not constrain
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced exactly, strict or not


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: Any = None  # structural_tag only (refused)
    structures: Any = None  # vLLM's legacy structural_tag (refused)
    triggers: Any = None


class StructuredOutputs(_Body):
    """vLLM's StructuredOutputsParams: exactly one constraint, and its options."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match. `text` is the schema (JSON text), the regex, the
    EBNF grammar or the choices (a JSON list); `param` names the field that asked for it, for
    the 400 an invalid one gets."""

    kind: GrammarKind
    text: str
    param: str
    any_whitespace: bool = True

    @property
    def key(self) -> tuple[str, str, bool]:
        """What a compiled grammar is cached by (with the tokenizer's fingerprint)."""
        return (self.kind, self.text, self.any_whitespace)


_REFUSED_OPTIONS = {
    "structural_tag": "structural tags (tool-call triggers) are not implemented: use json, "
    "regex, choice or grammar",
    "whitespace_pattern": "a custom whitespace pattern is not implemented (as in vLLM's "
    "xgrammar backend): use disable_any_whitespace",
}


def grammar_spec(
    response_format: ResponseFormat | None, structured: StructuredOutputs | None
) -> GrammarSpec | None:
    """The one constraint a request asks for, None when it asks for none; vLLM's rule:
    response_format overrides structured_outputs' constraint and keeps its options, and two
    constraints at once are a 400."""
    found = [] if structured is None else _constraints(structured)
    if response_format is not None and response_format.type != "text":
        asked = _from_format(response_format)  # replaces the same constraint, as vLLM's
        found = [c for c in found if c.kind != asked.kind] + [asked]
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise InvalidRequestError(
            f"only one kind of structured output may be asked for, got {names}",
            param=found[1].param,
        )
    if not found:
        if structured is not None:
            raise InvalidRequestError(
                "structured_outputs needs one of json, regex, choice, grammar or json_object",
                param="structured_outputs",
            )
        return None
    spec = found[0]
    if len(spec.text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequestError(
            f"{spec.param} is {len(spec.text)} characters: at most {MAX_GRAMMAR_CHARS}",
            param=spec.param,
        )
    if structured is not None and structured.disable_any_whitespace:
        return GrammarSpec(spec.kind, spec.text, spec.param, any_whitespace=False)
    return spec


def _constraints(so: StructuredOutputs) -> list[GrammarSpec]:
    for name, why in _REFUSED_OPTIONS.items():
        if getattr(so, name) is not None:
            raise InvalidRequestError(
                f"structured_outputs.{name} is not supported: {why}",
                param=f"structured_outputs.{name}",
            )
    out = []
    if so.json_ is not None:
        text = so.json_ if isinstance(so.json_, str) else json.dumps(so.json_)
        out.append(GrammarSpec("json", text, "structured_outputs.json"))
    if so.regex is not None:
        out.append(GrammarSpec("regex", so.regex, "structured_outputs.regex"))
    if so.choice is not None:
        if not so.choice:
            raise InvalidRequestError(
                "structured_outputs.choice needs at least one choice",
                param="structured_outputs.choice",
            )
        out.append(GrammarSpec("choice", json.dumps(so.choice), "structured_outputs.choice"))
    if so.grammar is not None:
        out.append(GrammarSpec("grammar", so.grammar, "structured_outputs.grammar"))
    if so.json_object is not None:
        out.append(GrammarSpec("json_object", "", "structured_outputs.json_object"))
    return out


def _from_format(rf: ResponseFormat) -> GrammarSpec:
    if rf.type == "structural_tag":
        raise InvalidRequestError(
            f"response_format.type structural_tag is not supported: "
            f"{_REFUSED_OPTIONS['structural_tag']}",
            param="response_format.type",
        )
    if rf.type == "json_object":
        return GrammarSpec("json_object", "", "response_format")
    schema = None if rf.json_schema is None else rf.json_schema.json_schema
    if schema is None:
        raise InvalidRequestError(
            "response_format.json_schema.schema is required when type is json_schema",
            param="response_format.json_schema",
        )
    return GrammarSpec("json", json.dumps(schema), "response_format.json_schema.schema")


def is_constrained(body: dict[str, Any] | Any) -> bool:
    """Whether a raw request body asks for a structured output (the router's question: such a
    stream's grammar state lives on the worker that generated it)."""
    if not isinstance(body, dict):
        return False
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        return True
    return body.get("structured_outputs") is not None
