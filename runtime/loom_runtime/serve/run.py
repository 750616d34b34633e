"""One engine request of an HTTP response as it runs: its outputs accumulated, its metrics
counted when it finishes, and the errors a finished output means (aborted, transfer failed).

Owns that bookkeeping for every text route (openai_api.py, responses_api.py), and compiling a
request's grammar off the event loop before it is submitted; never writes a response body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from loom_runtime.engine.types import EngineRequest, RequestOutput
from loom_runtime.errors import TransferError
from loom_runtime.serve.api_context import ApiContext, ServingEngine
from loom_runtime.serve.bridge import OutputStream
from loom_runtime.serve.echo import PromptEcho
from loom_runtime.serve.errors import RequestAbortedError
from loom_runtime.serve.responses import Accumulated
from loom_runtime.wire.openai.behaviour import NO_RECORD, RecordAsk, record_fields
from loom_runtime.wire.openai.chat.output import OutputPlan
from loom_runtime.wire.openai.logprobs import chat_logprobs, completion_logprobs
from loom_runtime.wire.openai.response import ResponseKind


class Run:
    """One request in flight: its accumulated result, logprob rendering and metrics."""

    def __init__(
        self,
        ctx: ApiContext,
        kind: ResponseKind,
        num_logprobs: int | None,
        prompt_ids: tuple[int, ...] | None = None,
        echo: PromptEcho | None = None,
        plan: OutputPlan | None = None,
        record: RecordAsk = NO_RECORD,
    ) -> None:
        self.ctx = ctx
        self.record = record  # what the client asked of the behaviour record
        self.kind = kind
        self.plan = plan  # a chat's: how its output is read (reasoning, tool calls)
        self.prompt_ids = prompt_ids  # set when the client asked for return_token_ids
        self.echo = echo  # completions: what the choice shows of its prompt
        self.want_logprobs = num_logprobs is not None
        self.acc = Accumulated()
        self.text_len = 0
        self.kv_transfer_params: dict[str, Any] | None = None  # a P/D prefill's answer

    def take(self, out: RequestOutput) -> None:
        self.acc.add(out)
        if out.kv_transfer_params is not None:
            self.kv_transfer_params = out.kv_transfer_params.to_dict()
        if out.finished:
            self.ctx.metrics.observe_finished(out.finish_reason or "abort", out.metrics)
            if out.transfer_error is not None:
                raise TransferError(out.transfer_error)
            if out.finish_reason == "abort":
                raise RequestAbortedError(
                    f"request {out.request_id} was aborted by the worker (paused or stopping); "
                    "retry it on another worker"
                )

    def logprobs(self, out: RequestOutput | None) -> dict[str, Any] | None:
        """The logprobs of `out` (or of the whole request when None), if they were asked for."""
        if not self.want_logprobs:
            return None
        entries = self.acc.logprobs if out is None else out.logprobs
        token_text = self.token_text
        if self.kind == "chat":
            return chat_logprobs(entries, token_text)
        offset = 0 if out is None else self.text_len
        return completion_logprobs(entries, token_text, offset)

    def record_fields(self, out: RequestOutput | None) -> dict[str, Any]:
        """The behaviour record's choice fields for the chunk of `out` (its new tokens; the
        weight_versions on the last) or, when None, for the whole request."""
        if not self.record.any:
            return {}
        if out is None:
            acc = self.acc
            if self.echo is not None and self.echo.alone:  # its one token is not returned
                return record_fields(self.record, acc.seed, [], [])
            return record_fields(self.record, acc.seed, acc.behaviour_logprobs, acc.version_spans)
        spans = self.acc.version_spans if out.finished else None
        return record_fields(self.record, out.seed, out.behaviour_logprobs, spans)

    def token_text(self, token_id: int) -> str:
        return self.ctx.engine.tokenizer.decode([token_id])


async def collect(run: Run, outputs: OutputStream, first: RequestOutput) -> None:
    out = first
    while True:
        run.take(out)
        if out.finished:
            return
        out = await outputs.next(run.ctx.stall_timeout_s)


async def compile_grammars(engine: ServingEngine, ereqs: Sequence[EngineRequest]) -> None:
    """Compile the requests' grammars off the event loop (a large schema takes a while; a bad
    one raises its 400 here): the engine's admission then finds them in its cache."""
    for spec in {e.sampling.grammar for e in ereqs if e.sampling.grammar is not None}:
        await asyncio.to_thread(engine.grammars.compile, spec)
