"""The request-field contract: every field vLLM 0.33.0 or OpenAI defines has one row (images and
videos: OpenAI's), the schema agrees with it, refused fields are 400s naming them, and
docs/openai-fields.md is its rendering."""

from __future__ import annotations

import json
import os
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params as openai_completion
from openai.types import image_generate_params as openai_images
from openai.types import video_create_params as openai_videos
from openai.types.chat import completion_create_params as openai_chat
from openai.types.responses import response_create_params as openai_responses
from pydantic import BaseModel

from loom_operator.k8s.render.vllm import VLLM_VERSION
from loom_runtime.errors import InvalidRequestError
from loom_runtime.serve.diffusion.protocol import ImageGenerationRequest, VideoGenerationRequest
from loom_runtime.wire.openai.field_contract import CONTRACTS, RESPONSES_AS_CHAT, FieldRule
from loom_runtime.wire.openai.field_doc import render
from loom_runtime.wire.openai.request import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
    unknown_fields,
)
from loom_runtime.wire.openai.responses.request import ResponsesRequest

ROOT = Path(__file__).resolve().parents[4]
VENV = Path(os.environ.get("LOOM_VLLM_VENV", Path.home() / ".cache/loom/vllm" / f"v{VLLM_VERSION}"))
SCHEMAS: dict[str, type[BaseModel]] = {
    "completion": CompletionRequest,
    "chat": ChatCompletionRequest,
    "responses": ResponsesRequest,
    "images": ImageGenerationRequest,
    "videos": VideoGenerationRequest,
}
BASES: dict[str, dict[str, Any]] = {
    "completion": {"model": "m", "prompt": "hi"},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
    "images": {"model": "m", "prompt": "hi"},
    "videos": {"model": "m", "prompt": "hi"},
}
_VLLM_FIELDS = """
import json
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
print(json.dumps({"completion": list(CompletionRequest.model_fields),
                  "chat": list(ChatCompletionRequest.model_fields),
                  "responses": list(ResponsesRequest.model_fields)}))
"""


def _openai_fields(module: Any) -> set[str]:
    names: set[str] = set()
    for name in dir(module):
        if name.endswith(("ParamsStreaming", "ParamsNonStreaming", "VideoCreateParams")):
            names |= set(typing.get_type_hints(getattr(module, name)))
    return names


@pytest.fixture(scope="module")
def vllm_fields() -> dict[str, list[str]]:
    """vLLM's own request schemas, read from its environment (CI has it: `make vllm-venv`)."""
    python = VENV / "bin" / "python"
    assert python.exists(), f"no vLLM {VLLM_VERSION} environment at {VENV}: run `make vllm-venv`"
    out = subprocess.run([str(python), "-c", _VLLM_FIELDS], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    fields: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return fields


@pytest.mark.parametrize("endpoint", ["completion", "chat", "responses"])
def test_every_vllm_request_field_has_a_row(
    endpoint: str, vllm_fields: dict[str, list[str]]
) -> None:
    missing = [f for f in vllm_fields[endpoint] if f not in CONTRACTS[endpoint]]  # type: ignore[index]
    assert not missing, f"vLLM {VLLM_VERSION} defines {missing}: add them to field_contract.py"


@pytest.mark.parametrize(
    ("endpoint", "module"),
    [
        ("completion", openai_completion),
        ("chat", openai_chat),
        ("responses", openai_responses),
        ("images", openai_images),
        ("videos", openai_videos),
    ],
)
def test_every_openai_request_field_has_a_row(endpoint: str, module: Any) -> None:
    missing = sorted(_openai_fields(module) - set(CONTRACTS[endpoint]))  # type: ignore[index]
    assert not missing, f"OpenAI defines {missing}: add them to field_contract.py"


@pytest.mark.parametrize("endpoint", ["completion", "chat", "images", "videos"])
def test_the_schema_types_exactly_the_honoured_fields_and_some_meaningless_ones(
    endpoint: str,
) -> None:
    rules: dict[str, FieldRule] = dict(CONTRACTS[endpoint])  # type: ignore[index]
    schema = set(SCHEMAS[endpoint].model_fields)
    without_row = sorted(schema - set(rules))
    assert not without_row, f"schema fields without a row: {without_row}"
    refused_in_schema = sorted(f for f in schema if rules[f].status == "refused")
    assert not refused_in_schema, f"refused fields are not typed: {refused_in_schema}"
    untyped = sorted(f for f, r in rules.items() if r.status == "honoured" and f not in schema)
    assert not untyped, f"honoured fields the schema does not type: {untyped}"


def test_a_response_types_its_own_honoured_fields_and_runs_the_rest_as_chat() -> None:
    rules = CONTRACTS["responses"]
    own = set(ResponsesRequest.model_fields)
    assert not sorted(own - set(rules)), "schema fields without a row"
    assert not [f for f in own if rules[f].status == "refused"], "refused fields are not typed"
    chat = set(ChatCompletionRequest.model_fields)
    honoured = {f for f, r in rules.items() if r.status == "honoured"}
    untyped = sorted(f for f in honoured - own if f not in RESPONSES_AS_CHAT or f not in chat)
    assert not untyped, f"honoured fields neither schema types: {untyped}"
    for name in RESPONSES_AS_CHAT:
        assert rules[name] == CONTRACTS["chat"][name], name


def test_the_generated_doc_is_up_to_date() -> None:
    page = (ROOT / "docs" / "openai-fields.md").read_text(encoding="utf-8")
    assert page == render(), "docs/openai-fields.md is stale: run `make openai-fields`"


def _rows(status: str) -> list[tuple[str, str, FieldRule]]:
    return [
        (endpoint, name, rule)
        for endpoint, rules in CONTRACTS.items()
        for name, rule in rules.items()
        if rule.status == status
    ]


@pytest.mark.parametrize(("endpoint", "name", "rule"), _rows("refused"))
def test_a_refused_field_is_a_400_naming_it_and_its_off_values_pass(
    endpoint: str, name: str, rule: FieldRule
) -> None:
    cls = SCHEMAS[endpoint]
    with pytest.raises(InvalidRequestError) as err:
        parse_request(cls, json.dumps({**BASES[endpoint], name: "on"}).encode())
    assert err.value.param == name
    assert rule.why in str(err.value)
    for value in (None, *rule.off):
        parsed = parse_request(cls, json.dumps({**BASES[endpoint], name: value}).encode(), True)
        assert name not in unknown_fields(parsed)


@pytest.mark.parametrize(("endpoint", "name", "rule"), _rows("meaningless"))
def test_a_meaningless_field_is_accepted_and_not_called_unknown(
    endpoint: str, name: str, rule: FieldRule
) -> None:
    field = SCHEMAS[endpoint].model_fields.get(name)
    body = {**BASES[endpoint], name: None if field is None else field.default}
    parsed = parse_request(SCHEMAS[endpoint], json.dumps(body).encode(), strict_fields=True)
    assert name not in unknown_fields(parsed)


def test_a_field_no_schema_defines_is_named_not_refused() -> None:
    body = json.dumps({**BASES["chat"], "frobnicate": 1}).encode()
    assert unknown_fields(parse_request(ChatCompletionRequest, body)) == ("frobnicate",)
    with pytest.raises(InvalidRequestError) as err:
        parse_request(ChatCompletionRequest, body, strict_fields=True)
    assert err.value.param == "frobnicate"
