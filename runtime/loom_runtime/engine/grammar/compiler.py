"""Compiles a request's GrammarSpec for this engine's tokenizer (xgrammar), with a bounded cache
keyed by the spec and the tokenizer's fingerprint.

Owns the xgrammar compiler and the cache; never holds a request's matcher (matcher.py does) and
never touches logits.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import xgrammar as xgr

from loom_runtime.engine.grammar.json_schema import without_raw_controls
from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.structured import GrammarSpec

CACHE_SIZE = 128
"""Compiled grammars kept (least recently used goes first)."""


class GrammarTokenizer(Protocol):
    """What the compiler needs of the checkpoint's tokenizer (wire.tokenizer.Tokenizer fits)."""

    eos_token_ids: tuple[int, ...]

    def vocabulary(self) -> list[str]: ...

    def backend_json(self) -> str: ...


class GrammarCompiler:
    """Grammars for one tokenizer and one logits width (`vocab_size`, the model's, which may
    pad past the tokenizer's). Thread-safe: the server compiles while the step thread reads."""

    def __init__(
        self, tokenizer: GrammarTokenizer, vocab_size: int, cache_size: int = CACHE_SIZE
    ) -> None:
        """Nothing is built until the first compile (most engines never see a grammar)."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: xgr.GrammarCompiler | None = None
        self._fingerprint = ""
        self._cache: OrderedDict[tuple[str, tuple[str, str, bool]], xgr.CompiledGrammar] = (
            OrderedDict()
        )
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        """The tokenizer's part of every cache key: its vocabulary, EOS ids and logits width."""
        with self._lock:
            self._start()
            return self._fingerprint

    def _start(self) -> xgr.GrammarCompiler:
        """The xgrammar compiler for this tokenizer, built once (the caller holds the lock)."""
        if self._compiler is None:
            tok = self._tokenizer
            vocab = tok.vocabulary()[: self.vocab_size]  # ids past the logits are never sampled
            meta = xgr.TokenizerInfo._detect_metadata_from_hf(tok.backend_json())
            info = xgr.TokenizerInfo(
                vocab,
                vocab_type=meta["vocab_type"],
                vocab_size=self.vocab_size,
                stop_token_ids=list(tok.eos_token_ids),
                add_prefix_space=bool(meta["add_prefix_space"]),
            )
            self._fingerprint = _fingerprint(vocab, tok.eos_token_ids, self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar, or InvalidRequestError naming spec.param when it is invalid.
        Compiles outside the lock: a long compile never holds up a cache hit."""
        with self._lock:
            compiler = self._start()
            key = (self._fingerprint, spec.key)
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            compiled = _compile(compiler, spec)
        except (RuntimeError, ValueError) as exc:  # xgrammar's errors for a bad spec
            raise InvalidRequestError(
                f"{spec.param} is not a valid {_WHAT[spec.kind]}: {_reason(exc)}",
                param=spec.param,
            ) from None
        with self._lock:
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._cache)


_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regular expression",
    "choice": "list of choices",
    "grammar": "grammar (xgrammar's EBNF, or Lark where no rule uses ::=)",
}


def _compile(c: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    """As vLLM's xgrammar backend compiles each kind: without free whitespace, JSON's
    separators are compact too."""
    separators = None if spec.any_whitespace else (",", ":")
    if spec.kind in ("json", "json_object"):
        schema = '{"type": "object"}'  # json_object: any object
        if spec.kind == "json":
            schema = json.dumps(without_raw_controls(json.loads(spec.text)))
        return c.compile_json_schema(
            schema, any_whitespace=spec.any_whitespace, separators=separators
        )
    if spec.kind == "regex":
        return c.compile_regex(spec.text)
    if spec.kind == "choice":
        return c.compile_grammar(choice_ebnf(json.loads(spec.text)))
    if is_lark(spec.text):
        return c.compile_lark(spec.text)
    return c.compile_grammar(spec.text)


def is_lark(grammar: str) -> bool:
    """vLLM's rule: a grammar none of whose lines (comments removed) defines a rule with `::=`
    is Lark, else EBNF."""
    lines = (re.sub(r"(#|//).*$", "", line).strip() for line in grammar.split("\n"))
    return bool(grammar) and not any("::=" in line for line in lines)


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices` (JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its '[time] file:line:' prefix."""
    text = str(exc).strip()
    head, sep, rest = text.partition(": ")
    return rest.strip() if sep and ".cc:" in head else text


def _fingerprint(vocab: Sequence[str], eos: Sequence[int], vocab_size: int) -> str:
    h = hashlib.sha256(json.dumps([list(vocab), list(eos), vocab_size]).encode())
    return h.hexdigest()[:16]
