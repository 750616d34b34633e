"""One request's result so far, as the engine reported it, and its OpenAI body.

Owns accumulating a request's outputs (the handler owns the object; the engine never sees it);
never writes JSON shapes itself (loom_runtime.wire.openai encodes them) and never does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loom_runtime.engine.types import RequestOutput
from loom_runtime.wire.openai.behaviour import add_span
from loom_runtime.wire.openai.chat.output import OutputPlan, finish_reason, read_message
from loom_runtime.wire.openai.logprobs import TokenLogprob
from loom_runtime.wire.openai.response import ResponseKind, ResponseMeta, full_body
from loom_runtime.wire.openai.usage import usage


@dataclass
class Accumulated:
    """One request's result so far (the handler owns it; the engine never sees it)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # one per prompt token, when asked
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    behaviour_logprobs: list[float] = field(default_factory=list)  # with a behaviour record
    seed: int | None = None  # with a behaviour record: the generator's seed
    version_spans: list[dict[str, Any]] = field(default_factory=list)  # vLLM's weight_versions

    def add(self, out: RequestOutput) -> None:
        self.text.append(out.new_text)
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.logprobs)
        self.behaviour_logprobs.extend(out.behaviour_logprobs)
        self.seed = out.seed
        add_span(self.version_spans, out.weights_version, len(out.new_token_ids))
        if out.prompt_logprobs:
            self.prompt_logprobs = out.prompt_logprobs
        self.prompt_tokens = out.num_prompt_tokens
        self.cached_tokens = out.num_cached_tokens
        self.completion_tokens = out.num_output_tokens
        if out.finished:
            self.finish_reason = out.finish_reason

    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)

    def body(
        self,
        kind: ResponseKind,
        meta: ResponseMeta,
        logprobs: dict[str, Any] | None,
        prompt_token_ids: Sequence[int] | None = None,
        plan: OutputPlan | None = None,
    ) -> dict[str, Any]:
        """The non-streamed response; with `prompt_token_ids` (return_token_ids) every id; a
        chat's output read as `plan` says (reasoning, tool calls)."""
        text = "".join(self.text)
        reason, message = self.finish_reason, None
        if plan is not None and not plan.plain:
            parts = read_message(plan, text)
            message = parts.fields(plan)
            reason = finish_reason(plan, bool(parts.tool_calls), reason)
        return full_body(kind, meta, text, reason, self.usage(), logprobs, self.token_ids,
                         prompt_token_ids, message)  # fmt: skip
