"""Tool calling on the wire: `tools`, `tool_choice` and `parallel_tool_calls` of a chat request,
resolved into one ToolPlan (what the output is read as), and the JSON schema a forced call's
output is held to (vLLM's: the function's parameters for a named function, an array of
`{"name", "parameters"}` objects for `required`).

Owns the request shapes and those rules; never parses model output (wire/openai/chat does) and
never compiles a grammar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.body import StrictBody
from loom_runtime.wire.openai.structured import GrammarSpec
from loom_runtime.wire.prompt import template_tools

MAX_TOOLS = 128  # as OpenAI allows
ToolMode = Literal["none", "auto", "required", "named"]
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionDef(StrictBody):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # a forced call's arguments always match the schema exactly


class ToolDef(StrictBody):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(StrictBody):
    name: str


class NamedToolChoice(StrictBody):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolPlan:
    """How a request's output is read: `none` (content only), `auto` (the model's tool-call
    format, parsed), `required` / `named` (the grammar forces JSON, read as calls)."""

    mode: ToolMode = "none"
    named: str | None = None  # the function tool_choice names
    max_calls: int | None = None  # 1 when parallel_tool_calls is false
    tools: tuple[Mapping[str, Any], ...] = ()  # as the template sees them
    grammar: GrammarSpec | None = field(default=None, compare=False)


def tool_plan(
    tools: Sequence[ToolDef] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolPlan:
    """The plan for a request's tool fields; InvalidRequestError naming the field if they
    contradict each other."""
    if tools is not None and len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"at most {MAX_TOOLS} tools, got {len(tools)}", param="tools")
    given = tuple(template_tools([t.model_dump() for t in tools or ()]))
    mode: ToolMode = ("auto" if tools else "none") if choice is None else _mode(choice)
    if mode != "none" and not tools:
        raise InvalidRequestError(
            f"tool_choice {mode!r} needs tools: send the functions the model may call",
            param="tool_choice",
        )
    max_calls = 1 if parallel is False else None
    if mode == "named":
        assert isinstance(choice, NamedToolChoice)
        return _named(tools or (), choice.function.name, given, max_calls)
    grammar = _required_grammar(tools or (), max_calls) if mode == "required" else None
    return ToolPlan(mode, None, max_calls, given, grammar)


def _mode(choice: ToolChoice) -> ToolMode:
    return "named" if isinstance(choice, NamedToolChoice) else choice


def _named(
    tools: Sequence[ToolDef], name: str, given: tuple[Mapping[str, Any], ...], max_calls: int | None
) -> ToolPlan:
    for i, tool in enumerate(tools):
        if tool.function.name == name:
            schema = tool.function.parameters or _EMPTY_PARAMETERS
            param = f"tools[{i}].function.parameters"
            grammar = GrammarSpec("json", json.dumps(schema), param, any_whitespace=False)
            return ToolPlan("named", name, max_calls, given, grammar)
    names = ", ".join(repr(t.function.name) for t in tools)
    raise InvalidRequestError(
        f"tool_choice names function {name!r}, which is not in tools ({names})",
        param="tool_choice.function.name",
    )


def _required_grammar(tools: Sequence[ToolDef], max_calls: int | None) -> GrammarSpec:
    """vLLM's schema for `required`: a non-empty array of calls of the given functions, each
    function's `$defs` lifted to the top (a `$ref` resolves from the root)."""
    defs: dict[str, Any] = {}
    items = []
    for i, tool in enumerate(tools):
        params = dict(tool.function.parameters or _EMPTY_PARAMETERS)
        for name, definition in dict(params.pop("$defs", None) or {}).items():
            if name in defs and defs[name] != definition:
                raise InvalidRequestError(
                    f"tools define $defs {name!r} twice, differently: give them distinct names",
                    param=f"tools[{i}].function.parameters.$defs",
                )
            defs[name] = definition
        items.append({"type": "object",
                      "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                     "parameters": params},
                      "required": ["name", "parameters"]})  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    if defs:
        schema["$defs"] = defs
    return GrammarSpec("json", json.dumps(schema), "tools", any_whitespace=False)


def calls_are_read(body: Mapping[str, Any] | Any) -> bool:
    """Whether a raw chat body's output is read back as tool calls on the worker (`tools` with a
    tool_choice other than none): the router's question, whose stream then carries deltas that
    are not the output's text."""
    if not isinstance(body, Mapping) or not body.get("tools"):
        return False
    return body.get("tool_choice") != "none"
