"""The schema rewrite: a length-bounded string becomes a pattern of the same bounds that admits
no raw control character, so every answer is JSON that `json.loads` reads; nothing else moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xgrammar as xgr

from loom_runtime.engine.grammar.compiler import GrammarCompiler
from loom_runtime.engine.grammar.json_schema import without_raw_controls
from loom_runtime.wire.openai.structured import GrammarSpec
from loom_runtime.wire.tokenizer import Tokenizer

BOUNDED = {"type": "string", "maxLength": 3}


def test_bounded_strings_become_patterns_and_the_rest_stays() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": BOUNDED,
            "b": {"type": "array", "items": {"type": "string", "minLength": 2}},
            "c": {"type": "string", "maxLength": 3, "pattern": "^x+$"},
            "d": {"type": "integer", "maximum": 3},
        },
    }
    got = without_raw_controls(schema)["properties"]
    assert got["a"] == {"type": "string", "pattern": '^[^\\x00-\\x1f"\\\\]{0,3}$'}
    assert got["b"]["items"] == {"type": "string", "pattern": '^[^\\x00-\\x1f"\\\\]{2,}$'}
    assert got["c"] == schema["properties"]["c"] and got["d"] == schema["properties"]["d"]


@pytest.mark.parametrize(
    ("text", "ok"),
    [('{"s":"abc"}', True), ('{"s":"abcd"}', False), ('{"s":"a\x1a"}', False),
     ('{"s":""}', True)],
)  # fmt: skip
def test_a_bounded_string_admits_no_raw_control_character(
    tiny_dir: Path, text: str, ok: bool
) -> None:
    tokenizer = Tokenizer.from_dir(tiny_dir)
    schema = {"type": "object", "properties": {"s": BOUNDED}, "required": ["s"]}
    compiled = GrammarCompiler(tokenizer, tokenizer.vocab_size).compile(
        GrammarSpec("json", json.dumps(schema), "j", any_whitespace=False)
    )
    matcher = xgr.GrammarMatcher(compiled)
    assert (matcher.accept_string(text) and matcher.is_completed()) is ok
