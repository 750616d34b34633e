"""One constrained request's grammar state: an xgrammar matcher advanced by every token the
request gets, and asked which tokens may come next.

Owns a request's matcher (held in its loop state, freed with it); never samples and never
compiles.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import xgrammar as xgr

from loom_runtime.engine.types import EngineRequest
from loom_runtime.wire.openai.structured import GrammarSpec

CompileGrammar = Callable[[GrammarSpec], xgr.CompiledGrammar]


class GrammarState:
    """The matcher of one request: `allowed` fills its bitmask row, `accept` folds in the
    token the request got, `terminated` once the grammar has ended (its stop token taken)."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the ids that may come next into `bitmask[row]` (xgrammar's int32 layout)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        if not self._matcher.accept_token(token_id):
            raise ValueError(f"token {token_id} was sampled outside its grammar's mask")

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


def request_grammar(req: EngineRequest, compile: CompileGrammar | None) -> GrammarState | None:
    """A request's matcher at the start of its output (None without a grammar)."""
    spec = req.sampling.grammar
    if spec is None:
        return None
    if compile is None:
        raise ValueError(f"request {req.request_id!r} has a grammar; this loop compiles none")
    return GrammarState(compile(spec))
