"""response_format and structured_outputs parse into one GrammarSpec naming the field that asked;
every refused sub-field is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.request import ChatCompletionRequest, CompletionRequest, parse_request
from loom_runtime.wire.openai.structured import GrammarSpec, is_constrained

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(ChatCompletionRequest, json.dumps(body).encode())


def _completion(**fields: Any) -> CompletionRequest:
    body = {"model": "m", "prompt": "hi", **fields}
    return parse_request(CompletionRequest, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("fields", "spec"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}},
         GrammarSpec("json_object", "", "response_format")),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
         GrammarSpec("json", json.dumps(SCHEMA), "response_format.json_schema.schema")),
        ({"structured_outputs": {"json": SCHEMA}},
         GrammarSpec("json", json.dumps(SCHEMA), "structured_outputs.json")),
        ({"structured_outputs": {"json": '{"type": "string"}'}},
         GrammarSpec("json", '{"type": "string"}', "structured_outputs.json")),
        ({"structured_outputs": {"regex": "[0-9]+", "disable_any_whitespace": True}},
         GrammarSpec("regex", "[0-9]+", "structured_outputs.regex", any_whitespace=False)),
        ({"structured_outputs": {"choice": ["yes", "no"]}},
         GrammarSpec("choice", '["yes", "no"]', "structured_outputs.choice")),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}},
         GrammarSpec("grammar", 'root ::= "a"', "structured_outputs.grammar")),
        ({"structured_outputs": {"json_object": True}},
         GrammarSpec("json_object", "", "structured_outputs.json_object")),
        # response_format replaces structured_outputs' constraint of the same kind (vLLM)
        ({"structured_outputs": {"json": {"type": "string"}, "disable_any_whitespace": True},
          "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                      "schema": SCHEMA}}},
         GrammarSpec("json", json.dumps(SCHEMA), "response_format.json_schema.schema", False)),
    ],
)  # fmt: skip
def test_both_endpoints_parse_the_one_constraint(
    fields: dict[str, Any], spec: GrammarSpec | None
) -> None:
    assert _chat(**fields).grammar == spec
    assert _completion(**fields).grammar == spec


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"structured_outputs": {}}, "structured_outputs", "needs one of"),
        ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs.grammar",
         "only one kind"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "response_format", "only one kind"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag",
         "not supported"),
        ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
         "structured_outputs.whitespace_pattern", "not supported"),
        ({"structured_outputs": {"regex": "a", "backend": "outlines"}},
         "structured_outputs.backend", "unsupported field"),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format.type",
         "not supported"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema",
         "required"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'text'"),
        ({"structured_outputs": {"regex": "a" * 70_000}}, "structured_outputs.regex",
         "at most"),
    ],
)  # fmt: skip
def test_refused_structured_fields_name_themselves(
    fields: dict[str, Any], param: str, words: str
) -> None:
    for parse in (_chat, _completion):
        with pytest.raises(InvalidRequestError) as err:
            parse(**fields)
        assert err.value.param == param
        assert words in str(err.value)


def test_is_constrained_reads_raw_bodies() -> None:
    assert not is_constrained({"response_format": {"type": "text"}})
    assert is_constrained({"response_format": {"type": "json_object"}})
    assert is_constrained({"structured_outputs": {"regex": "a"}})
    assert not is_constrained({"prompt": "x"})
