"""Grammar compilation: an invalid schema, regex or grammar is an InvalidRequestError naming the
field that sent it (never a crash), and the cache is bounded and keyed by spec and tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import xgrammar as xgr

from loom_runtime.engine.grammar.compiler import GrammarCompiler, choice_ebnf, is_lark
from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.structured import GrammarSpec
from loom_runtime.wire.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (GrammarSpec("json", '{"type": 5}', "response_format.json_schema.schema"), "JSON schema"),
        (GrammarSpec("json", "{", "structured_outputs.json"), "JSON schema"),
        (GrammarSpec("json", '{"$ref": "#/nowhere"}', "structured_outputs.json"), "nowhere"),
        (GrammarSpec("regex", "[a-", "structured_outputs.regex"), "Unclosed"),
        (GrammarSpec("grammar", "root ::= rule", "structured_outputs.grammar"), "not defined"),
    ],
)
def test_an_invalid_spec_is_a_400_naming_its_field(
    tokenizer: Tokenizer, spec: GrammarSpec, words: str
) -> None:
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    with pytest.raises(InvalidRequestError) as err:
        compiler.compile(spec)
    assert err.value.param == spec.param
    assert spec.param in str(err.value) and words in str(err.value)
    assert "grammar_matcher.cc" not in str(err.value) and ".cc:" not in str(err.value)
    assert len(compiler) == 0


def test_the_cache_is_bounded_and_reuses_a_compiled_grammar(tokenizer: Tokenizer) -> None:
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, cache_size=2)
    a = GrammarSpec("regex", "a+", "r")
    first = compiler.compile(a)
    assert compiler.compile(GrammarSpec("regex", "a+", "other field")) is first
    compiler.compile(GrammarSpec("regex", "b+", "r"))
    compiler.compile(GrammarSpec("regex", "c+", "r"))
    assert len(compiler) == 2
    assert compiler.compile(a) is not first  # evicted, compiled again


def test_the_tokenizer_is_part_of_the_key(tokenizer: Tokenizer) -> None:
    narrow = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    wide = GrammarCompiler(tokenizer, tokenizer.vocab_size + 64)
    assert narrow.fingerprint != wide.fingerprint


def test_choices_are_escaped_literals() -> None:
    assert choice_ebnf(['say "hi"', "a\nb"]) == 'root ::= "say \\"hi\\"" | "a\\nb"'


def test_a_grammar_without_ebnf_rules_is_read_as_lark(tokenizer: Tokenizer) -> None:
    assert is_lark('start: "yes" | "no"  // a comment')
    assert not is_lark('root ::= "yes" | "no"\n# start: "x"')
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    for text in ('start: "yes" | "no"', 'root ::= "yes" | "no"'):
        assert compiler.compile(GrammarSpec("grammar", text, "g")) is not None
    with pytest.raises(InvalidRequestError, match="Lark"):
        compiler.compile(GrammarSpec("grammar", "start: undefined_rule", "g"))


def test_json_object_is_any_object_with_compact_separators_without_whitespace(
    tokenizer: Tokenizer,
) -> None:
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    compact = compiler.compile(GrammarSpec("json_object", "", "j", any_whitespace=False))
    free = compiler.compile(GrammarSpec("json_object", "", "j"))
    assert not xgr.GrammarMatcher(compact).accept_string("[1]")
    assert xgr.GrammarMatcher(compact).accept_string('{"a":1,"b":2}')
    assert not xgr.GrammarMatcher(compact).accept_string('{"a": 1')
    assert xgr.GrammarMatcher(free).accept_string('{"a": 1')
