"""Admission checks of a structured output: its grammar compiles, and nothing else the request
asks for could break its matcher.

Owns those refusals (a 400 naming the field and why); never keeps a matcher.
"""

from __future__ import annotations

from loom_runtime.engine.grammar.compiler import GrammarCompiler
from loom_runtime.engine.types import EngineRequest
from loom_runtime.errors import InvalidRequestError


def check_grammar(req: EngineRequest, compiler: GrammarCompiler, draft_tokens: int) -> None:
    """Compile `req`'s grammar (cached), or raise InvalidRequestError naming the field and
    why. `draft_tokens`: the engine's MTP drafts per step."""
    params = req.sampling
    spec = params.grammar
    if spec is None:
        return
    if draft_tokens:
        raise InvalidRequestError(
            f"{spec.param}: structured outputs are not served with MTP speculative decoding "
            f"({draft_tokens} drafts per step): a rejected draft would need the grammar's "
            "matcher rolled back, which Loom does not do; send it to a worker without "
            "speculation",
            param=spec.param,
        )
    if params.min_tokens:
        raise InvalidRequestError(
            "min_tokens cannot be honoured with a structured output: the grammar may end "
            "before it, where EOS is the only token allowed; leave min_tokens at 0",
            param="min_tokens",
        )
    compiler.compile(spec)
