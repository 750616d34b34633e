"""tools / tool_choice / parallel_tool_calls resolved into a ToolPlan: the modes, the grammar a
forced call is held to (vLLM's schemas), and the contradictions that are a 400 naming a field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.tools import NamedToolChoice, ToolDef, tool_plan

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _tool(name: str, params: dict[str, Any] | None = None) -> ToolDef:
    function: dict[str, Any] = {"name": name} | ({"parameters": params} if params else {})
    return ToolDef.model_validate({"type": "function", "function": function})


def _named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def test_tools_default_to_auto_and_no_tools_to_none() -> None:
    assert tool_plan([_tool("a")], None, None).mode == "auto"
    assert tool_plan(None, None, None).mode == "none"
    assert tool_plan([_tool("a")], "none", None).mode == "none"
    assert tool_plan([_tool("a")], "auto", None).grammar is None


def test_a_named_function_holds_the_output_to_its_parameters() -> None:
    plan = tool_plan([_tool("other"), _tool("get_weather", WEATHER)], _named("get_weather"), None)
    assert (plan.mode, plan.named) == ("named", "get_weather")
    assert plan.grammar is not None and json.loads(plan.grammar.text) == WEATHER
    assert plan.grammar.param == "tools[1].function.parameters"
    assert not plan.grammar.any_whitespace


def test_required_holds_the_output_to_an_array_of_calls_of_the_given_functions() -> None:
    refs = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
            "$defs": {"P": {"type": "integer"}}}  # fmt: skip
    plan = tool_plan([_tool("a", WEATHER), _tool("b", refs)], "required", False)
    assert plan.grammar is not None
    schema = json.loads(plan.grammar.text)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["a"], ["b"]]
    assert schema["$defs"] == {"P": {"type": "integer"}}  # lifted: the $ref resolves from root
    assert "$defs" not in schema["items"]["anyOf"][1]["properties"]["parameters"]
    assert plan.max_calls == 1


BAD = [
    (None, "required", "tool_choice", "needs tools"),
    ([_tool("a")], _named("b"), "tool_choice.function.name", "not in tools"),
    ([_tool("a", {"$defs": {"X": {"type": "string"}}}), _tool("b", {"$defs": {"X": {}}})],
     "required", "tools[1].function.parameters.$defs", "twice"),
]  # fmt: skip


@pytest.mark.parametrize(("tools", "choice", "param", "words"), BAD)
def test_contradicting_tool_fields_are_a_400_naming_the_field(
    tools: list[ToolDef] | None, choice: Any, param: str, words: str
) -> None:
    with pytest.raises(InvalidRequestError) as err:
        tool_plan(tools, choice, None)
    assert err.value.param == param and words in str(err.value)
