"""Structured outputs with the real `openai` SDK against `loom up examples/tiny-pd.yaml` (router,
one prefill, one decode; every request prefilled remotely, so the prefill's first token and the
decode's matcher are both under the grammar): a json_schema answer at temperature 1 parses and
matches its schema for every seed, choice and regex answers match, a greedy constrained answer
equals the free one where that already matches, and a bad schema is a 400 naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from openai import OpenAI

from loom_operator.testing.fleet import FleetProcess
from loom_runtime.wire.headers import PD_HEADER

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        "open": {"type": "boolean"},
    },
    "required": ["city", "rank", "open"],
    "additionalProperties": False,
}
PROMPT = "Name a city, its rank and whether it is open, as JSON. " * 3  # > one KV block


def valid(doc: Any) -> bool:
    return (
        isinstance(doc, dict) and set(doc) == {"city", "rank", "open"}
        and isinstance(doc["city"], str) and len(doc["city"]) <= 8
        and type(doc["rank"]) is int and 1 <= doc["rank"] <= 99
        and type(doc["open"]) is bool
    )  # fmt: skip


EXAMPLE = "tiny-pd"


@pytest.fixture(scope="module")
def fleet(tiny_example: FleetProcess) -> FleetProcess:
    return tiny_example


@pytest.fixture(scope="module")
def client(fleet: FleetProcess) -> OpenAI:
    return OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0, timeout=120)


def test_json_schema_answers_parse_and_match_for_every_seed(client: OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    for seed in range(5):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], temperature=1.0,
            seed=seed, max_tokens=300, response_format=fmt,
        )  # fmt: skip
        assert raw.headers[PD_HEADER] == "remote-prefill"
        answer = raw.parse().choices[0]
        assert answer.finish_reason == "stop", answer.message.content
        assert valid(json.loads(answer.message.content or "")), answer.message.content


def test_json_object_answers_are_json_objects(client: OpenAI) -> None:
    for seed in (1, 2):
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], temperature=1.0,
            seed=seed, max_tokens=300, response_format={"type": "json_object"},
            extra_body={"structured_outputs": {"json_object": True,
                                               "disable_any_whitespace": True}},
        ).choices[0]  # fmt: skip
        if answer.finish_reason == "stop":  # json_object bounds no string: it may run out
            assert isinstance(json.loads(answer.message.content or ""), dict)
        else:
            assert (answer.message.content or "").startswith("{")


def test_choice_and_regex_answers_match_on_both_routes(client: OpenAI) -> None:
    colours = ["red", "green", "blue"]
    for seed in range(3):
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], temperature=1.0,
            seed=seed, max_tokens=20, extra_body={"structured_outputs": {"choice": colours}},
        ).choices[0]  # fmt: skip
        assert chat.message.content in colours and chat.finish_reason == "stop"
        done = client.completions.create(
            model="tiny", prompt=PROMPT, temperature=1.0, seed=seed, max_tokens=40,
            extra_body={"structured_outputs": {"regex": "[A-Z][a-z]{2,5}-[0-9]{2}"}},
        ).choices[0]  # fmt: skip
        assert re.fullmatch("[A-Z][a-z]{2,5}-[0-9]{2}", done.text) and done.finish_reason == "stop"


def test_a_greedy_constrained_answer_equals_the_free_one_that_matches(client: OpenAI) -> None:
    free = client.completions.create(
        model="tiny", prompt=PROMPT, temperature=0.0, max_tokens=12,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    ).choices[0]  # fmt: skip
    constrained = client.completions.create(
        model="tiny", prompt=PROMPT, temperature=0.0, max_tokens=12,
        extra_body={"ignore_eos": True, "return_token_ids": True,
                    "structured_outputs": {"choice": [free.text]}},
    ).choices[0]  # fmt: skip
    ids = "token_ids"
    assert getattr(constrained, ids) == getattr(free, ids) and constrained.text == free.text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": 5}}}},
         "response_format.json_schema.schema"),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= nothing"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ],
)  # fmt: skip
def test_a_bad_constraint_is_a_400_naming_its_field(
    client: OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            extra_body=extra,
        )  # fmt: skip
    body: Any = err.value.body
    assert body["param"] == param, body
    # the fleet serves on
    ok = client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0.0)
    assert ok.choices[0].finish_reason == "length"
