"""Compiles a request's GrammarSpec for this engine's tokenizer (xgrammar), with a bounded cache
keyed by the spec and the tokenizer's fingerprint.

Owns the xgrammar compiler and the cache; never holds a request's matcher (matcher.py does) and
never touches logits.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import xgrammar as xgr

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
        vocab = tokenizer.vocabulary()
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.backend_json())
        self.info = xgr.TokenizerInfo(
            vocab,
            vocab_type=meta["vocab_type"],
            vocab_size=vocab_size,
            stop_token_ids=list(tokenizer.eos_token_ids),
            add_prefix_space=bool(meta["add_prefix_space"]),
        )
        self.vocab_size = vocab_size
        self.fingerprint = _fingerprint(vocab, tokenizer.eos_token_ids, vocab_size)
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, tuple[str, str, bool]], xgr.CompiledGrammar] = (
            OrderedDict()
        )
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar, or InvalidRequestError naming spec.param when it is invalid."""
        key = (self.fingerprint, spec.key)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            try:
                compiled = self._compile(spec)
            except RuntimeError as exc:  # xgrammar raises RuntimeError for a bad spec
                raise InvalidRequestError(
                    f"{spec.param} is not a valid {_WHAT[spec.kind]}: {_reason(exc)}",
                    param=spec.param,
                ) from None
            self._cache[key] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return compiled

    def __len__(self) -> int:
        return len(self._cache)

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        c = self._compiler
        if spec.kind == "json":
            return c.compile_json_schema(spec.text, any_whitespace=spec.any_whitespace)
        if spec.kind == "json_object":
            return c.compile_builtin_json_grammar()
        if spec.kind == "regex":
            return c.compile_regex(spec.text)
        if spec.kind == "choice":
            return c.compile_grammar(choice_ebnf(json.loads(spec.text)))
        return c.compile_grammar(spec.text)


_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON grammar",
    "regex": "regular expression",
    "choice": "list of choices",
    "grammar": "EBNF grammar (GBNF, as xgrammar reads it)",
}


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices` (JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _reason(exc: RuntimeError) -> str:
    """xgrammar's message without its '[time] file:line:' prefix."""
    text = str(exc).strip()
    head, sep, rest = text.partition(": ")
    return rest.strip() if sep and ".cc:" in head else text


def _fingerprint(vocab: Sequence[str], eos: Sequence[int], vocab_size: int) -> str:
    h = hashlib.sha256(json.dumps([list(vocab), list(eos), vocab_size]).encode())
    return h.hexdigest()[:16]
