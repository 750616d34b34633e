"""Structured outputs through the engine: sampled constrained requests always match their
grammar and finish with stop, a greedy one whose free output already matches is token-identical
to it, unconstrained requests in the same batches are unchanged, and bad requests are refused."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.loader import LoadedModel
from loom_runtime.wire.openai.structured import GrammarSpec

PROPERTIES = {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"},
}
SCHEMA = {"type": "object", "properties": PROPERTIES, "required": list(PROPERTIES)}
Prompt = Callable[[int, int], tuple[int, ...]]
JSON = GrammarSpec("json", json.dumps(SCHEMA), "response_format.json_schema.schema", False)


def matches_schema(text: str) -> bool:
    doc = json.loads(text)
    return (
        set(doc) == {"name", "age", "ok"}
        and isinstance(doc["name"], str) and len(doc["name"]) <= 6
        and type(doc["age"]) is int and 0 <= doc["age"] <= 120
        and type(doc["ok"]) is bool
    )  # fmt: skip


@pytest.fixture
def engine(tiny64: LoadedModel) -> Engine:
    return Engine(tiny64, EngineConfig(dtype=torch.float64, max_model_len=512, num_blocks=128))


def run_all(engine: Engine, reqs: list[EngineRequest]) -> list[CompletedRequest]:
    got = [OutputCollector(r) for r in reqs]
    for r, c in zip(reqs, got, strict=True):
        engine.add_request(r, c)
    while engine.step():
        pass
    return [c.result() for c in got]


def test_sampled_constrained_requests_match_their_grammar_beside_free_ones(
    engine: Engine, prompt: Prompt
) -> None:
    p = prompt(10, 3)
    free = SamplingParams(max_tokens=20, temperature=1.0, seed=99, ignore_eos=True)
    reqs = [
        EngineRequest(
            f"j{s}", p, SamplingParams(max_tokens=120, temperature=1.0, seed=s, grammar=JSON)
        )
        for s in range(6)
    ]
    reqs += [
        EngineRequest("choice", p, SamplingParams(max_tokens=20, seed=1, grammar=GrammarSpec(
            "choice", '["red", "green", "blue"]', "structured_outputs.choice"))),
        EngineRequest("regex", p, SamplingParams(max_tokens=30, seed=2, grammar=GrammarSpec(
            "regex", "[0-9]{3}-[a-z]{2,4}", "structured_outputs.regex"))),
        EngineRequest("free", p, free),
    ]  # fmt: skip
    done = run_all(engine, reqs)
    for r in done[:6]:
        assert r.finish_reason == "stop" and matches_schema(r.text), r.text
    assert done[6].finish_reason == "stop" and done[6].text in {"red", "green", "blue"}
    assert done[7].finish_reason == "stop" and re.fullmatch("[0-9]{3}-[a-z]{2,4}", done[7].text)
    alone = engine.generate(p, free).output_token_ids
    assert done[8].output_token_ids == alone  # the free row never saw the mask


def test_a_greedy_constrained_request_equals_its_free_output_when_that_matches(
    engine: Engine, prompt: Prompt
) -> None:
    p = prompt(12, 5)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    free = engine.generate(p, greedy)
    spec = GrammarSpec("choice", json.dumps([free.text]), "structured_outputs.choice")
    same = engine.generate(p, replace(greedy, grammar=spec))
    assert same.output_token_ids == free.output_token_ids and same.finish_reason == "length"
    # one more token of budget: the grammar allows only EOS there, and ends the request
    longer = engine.generate(p, replace(greedy, max_tokens=11, grammar=spec))
    eos = engine.tokenizer.eos_token_ids[0]
    assert longer.output_token_ids == (*free.output_token_ids, eos)
    assert longer.finish_reason == "stop" and longer.text == free.text


@pytest.mark.parametrize(
    ("params", "param", "words"),
    [
        (SamplingParams(grammar=GrammarSpec("regex", "(", "structured_outputs.regex")),
         "structured_outputs.regex", "not closed"),
        (SamplingParams(min_tokens=2, grammar=JSON), "min_tokens", "structured output"),
    ],
)  # fmt: skip
def test_a_request_the_grammar_cannot_serve_is_refused(
    engine: Engine, prompt: Prompt, params: SamplingParams, param: str, words: str
) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(EngineRequest("bad", prompt(5, 1), params), OutputCollector(
            EngineRequest("bad", prompt(5, 1), params)))  # fmt: skip
    assert err.value.param == param and words in str(err.value)
    assert engine.generate(prompt(5, 1), SamplingParams(max_tokens=2)).finish_reason  # serves on


def test_an_aborted_constrained_request_frees_its_matcher(engine: Engine, prompt: Prompt) -> None:
    req = EngineRequest("gone", prompt(6, 2), SamplingParams(max_tokens=50, grammar=JSON))
    out = OutputCollector(req)
    engine.add_request(req, out)
    engine.step()
    state = next(s for s in engine._batcher.running if s.request_id == "gone")
    assert state.grammar is not None
    engine.abort("gone")
    while engine.step():
        pass
    assert out.result().finish_reason == "abort" and state.grammar is None
