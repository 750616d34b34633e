"""The OpenAI routes: /v1/completions (one prompt or a list of them, n choices each),
/v1/chat/completions (n choices; JSON or SSE) and /v1/models.

Owns turning one HTTP request into its engine requests (a sample each) and back; never maps
errors to statuses itself (errors.py does) and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from loom_runtime.engine.types import EngineRequest, RequestOutput
from loom_runtime.errors import LoomError
from loom_runtime.serve.api_context import API_CONTEXT, ApiContext, ServingTokenizer
from loom_runtime.serve.bridge import OutputStream, submitted
from loom_runtime.serve.echo import PromptEcho, echo_choice, echo_stream_fields, prompt_echo
from loom_runtime.serve.errors import classify
from loom_runtime.serve.prepare import choices_of, prepare_chat, prepare_completion
from loom_runtime.serve.responses import Accumulated
from loom_runtime.serve.run import Run, collect, compile_grammars
from loom_runtime.wire.headers import IGNORED_FIELDS_HEADER, REQUEST_ID_HEADER, WEIGHTS_HEADER
from loom_runtime.wire.kv_transfer import FIELD as KV_TRANSFER_FIELD
from loom_runtime.wire.openai.chat.output import DeltaStream, OutputPlan, finish_reason, output_plan
from loom_runtime.wire.openai.choices import Choices
from loom_runtime.wire.openai.logprobs import vllm_prompt_logprobs
from loom_runtime.wire.openai.request import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
    unknown_fields,
)
from loom_runtime.wire.openai.request_id import worker_request_id
from loom_runtime.wire.openai.response import ResponseKind, ResponseMeta, chunk, usage_chunk
from loom_runtime.wire.openai.sse import DONE
from loom_runtime.wire.openai.sse import encode as _sse
from loom_runtime.wire.openai.usage import usage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UsageMode:
    """Where a stream reports usage: a last usage-only chunk, and/or on every chunk (vLLM)."""

    final: bool = False
    every_chunk: bool = False


def _request_id(request: web.Request, prefix: str) -> str:
    return worker_request_id(request.headers.get(REQUEST_ID_HEADER, ""), prefix)


@dataclass
class _Flight:
    """One engine request of a response: its run, its outputs and the first of them;
    `prompt_counted` on the first sample of each prompt (usage counts a prompt once)."""

    run: Run
    outputs: OutputStream
    first: RequestOutput
    prompt_counted: bool = True


async def _stream(
    request: web.Request,
    flights: Sequence[_Flight],
    meta: ResponseMeta,
    usage: UsageMode,
    headers: dict[str, str],
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    try:
        await _write_events(resp, flights, meta, usage)
    except ConnectionResetError:  # the caller's `submitted` block aborts the request
        logger.info("client left mid-stream", extra={"request_id": meta.id})
    return resp


async def _events(
    flight: _Flight, meta: ResponseMeta, usage: UsageMode
) -> AsyncIterator[dict[str, Any]]:
    """The chunks of one engine request's stream, as they come (no usage-only chunk)."""
    run, out = flight.run, flight.first
    ids = run.prompt_ids is not None
    prompt_ids = run.prompt_ids  # sent once, on the first chunk
    if run.kind == "chat":
        start = Accumulated(prompt_tokens=out.num_prompt_tokens).usage()
        yield chunk("chat", meta.chunk_head("chat"), "", None, None, usage.final, True, None,
                    prompt_ids, start if usage.every_chunk else None)  # fmt: skip
        prompt_ids = None
    plan = run.plan
    reader = None if plan is None or plan.plain else DeltaStream(plan)
    echo = run.echo if run.echo is not None and run.echo.wanted else None
    while True:
        run.take(out)
        if echo is not None:  # the prompt (and its log-probs) first, once
            text, lp, extra = echo_stream_fields(echo, run.acc, run.token_text)
            so_far = run.acc.usage() if usage.every_chunk else None
            body = chunk(run.kind, meta.chunk_head(run.kind), text, lp, None, usage.final,
                         False, None, prompt_ids, so_far)  # fmt: skip
            body["choices"][0] |= extra
            yield body
            prompt_ids, run.text_len = None, len(text)
            if echo.alone:  # the token run after the prompt is not shown
                yield await _alone_end(flight, out, meta, usage)
                return
            echo = None
        fields = None if reader is None else reader.step(out.new_text, out.finished)
        said = bool(fields) if reader is not None else bool(out.new_text)
        if said or out.logprobs or out.finished or (ids and out.new_token_ids):
            lp = run.logprobs(out)
            reason = run.acc.finish_reason if out.finished else None
            if reader is not None and plan is not None:
                reason = finish_reason(plan, reader.called, reason)
            tokens = out.new_token_ids if ids else None
            so_far = run.acc.usage() if usage.every_chunk else None
            body = chunk(run.kind, meta.chunk_head(run.kind), out.new_text, lp, reason,
                         usage.final, False, tokens, prompt_ids, so_far, fields)  # fmt: skip
            body["choices"][0] |= run.record_fields(out)
            yield body
            prompt_ids = None
            run.text_len += len(out.new_text)
        if out.finished:
            return
        out = await flight.outputs.next(run.ctx.stall_timeout_s)


async def _alone_end(
    flight: _Flight, out: RequestOutput, meta: ResponseMeta, usage: UsageMode
) -> dict[str, Any]:
    """The last chunk of an echo of the prompt alone: the run's one token is not returned."""
    run = flight.run
    while not out.finished:
        out = await flight.outputs.next(run.ctx.stall_timeout_s)
        run.take(out)
    run.acc.completion_tokens = 0
    so_far = run.acc.usage() if usage.every_chunk else None
    return chunk(run.kind, meta.chunk_head(run.kind), "", None, run.acc.finish_reason,
                 usage.final, False, None, None, so_far)  # fmt: skip


async def _relay(
    resp: web.StreamResponse, flights: Sequence[_Flight], meta: ResponseMeta, usage: UsageMode
) -> None:
    """Every flight's chunks to the client as they come, each choice under its `index`."""
    lock = asyncio.Lock()

    async def one(index: int, flight: _Flight) -> None:
        async for body in _events(flight, meta, usage):
            body["choices"][0]["index"] = index
            async with lock:
                await resp.write(_sse(body))

    if len(flights) == 1:
        return await one(0, flights[0])
    try:
        async with asyncio.TaskGroup() as group:
            for index, flight in enumerate(flights):
                group.create_task(one(index, flight))
    except BaseExceptionGroup as failed:  # the first failure, as one request's would be
        raise failed.exceptions[0] from None


async def _write_events(
    resp: web.StreamResponse, flights: Sequence[_Flight], meta: ResponseMeta, usage: UsageMode
) -> None:
    kind = flights[0].run.kind
    try:
        await _relay(resp, flights, meta, usage)
        if usage.final:
            await resp.write(_sse(usage_chunk(meta.chunk_head(kind), _usage(flights))))
    except LoomError as exc:  # headers are sent: the error travels as an SSE event
        logger.warning("stream ended by error: %s", exc, extra={"request_id": meta.id})
        await resp.write(_sse(classify(exc, meta.id).body()))
    await resp.write(_sse(DONE))
    await resp.write_eof()


def _usage(flights: Sequence[_Flight]) -> dict[str, Any]:
    """The response's usage: each prompt once, every sample's output."""
    prompts = [f.run.acc for f in flights if f.prompt_counted]
    return usage(sum(a.prompt_tokens for a in prompts),
                 sum(f.run.acc.completion_tokens for f in flights),
                 sum(a.cached_tokens for a in prompts))  # fmt: skip


def _body(flights: Sequence[_Flight], meta: ResponseMeta, choices: Choices) -> dict[str, Any]:
    """The whole answer: the kept samples as choices, `index` in order, usage summed."""
    scores = [sum(e.logprob for e in f.run.acc.logprobs) if choices.ranked else 0.0
              for f in flights]  # fmt: skip
    out = []
    for index, k in enumerate(choices.kept(scores)):
        f = flights[k]
        echo = f.run.echo
        if echo is not None and echo.alone:  # the token run after the prompt is not returned
            f.run.acc.completion_tokens = 0
        body = f.run.acc.body(f.run.kind, meta, f.run.logprobs(None), f.run.prompt_ids,
                              f.run.plan)  # fmt: skip
        choice = body["choices"][0] | {"index": index} | f.run.record_fields(None)
        if echo is not None and echo.wanted:
            choice = echo_choice(choice, echo, f.run.acc, f.run.token_text)
        out.append(choice)
    body["choices"] = out
    body["usage"] = _usage(flights)
    first = flights[0].run
    if first.kind == "chat" and first.acc.prompt_logprobs:  # vLLM's: on the response, not a choice
        body["prompt_logprobs"] = vllm_prompt_logprobs(first.acc.prompt_logprobs, first.token_text)
    kv_params = flights[0].run.kv_transfer_params
    if kv_params is not None:
        body[KV_TRANSFER_FIELD] = kv_params
    return body


async def _serve(
    request: web.Request,
    kind: ResponseKind,
    parsed: CompletionRequest | ChatCompletionRequest,
    ereqs: Sequence[EngineRequest],
    rid: str,
    ignored: tuple[str, ...],
    plan: OutputPlan | None = None,
) -> web.StreamResponse:
    """Run `ereqs` (a sample each, in choice order) as one response, `rid`; a chat's output
    read as `plan`."""
    ctx = request.app[API_CONTEXT]
    choices = choices_of(parsed)
    echoes: list[PromptEcho | None] = [None] * len(ereqs)
    asked = parsed.num_logprobs if isinstance(parsed, ChatCompletionRequest) else parsed.logprobs
    if isinstance(parsed, CompletionRequest):
        decode = partial(_decode_one, ctx.engine.tokenizer)
        echoes = [prompt_echo(parsed, parsed.prompt[choices.prompt_of(k)], e.prompt_token_ids,
                              decode) for k, e in enumerate(ereqs)]  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(submitted(ctx.engine, e, ctx.mailbox))
                   for e in ereqs]  # fmt: skip
        try:
            flights = []
            for k, (ereq, outputs, echo) in enumerate(zip(ereqs, streams, echoes, strict=True)):
                ids = ereq.prompt_token_ids if parsed.wants_token_ids else None
                run = Run(ctx, kind, asked, ids, echo, plan, parsed.record)
                first = await outputs.next(ctx.stall_timeout_s)
                if first.finished and first.finish_reason == "abort":
                    run.take(first)  # raises RequestAbortedError before any header is sent
                flights.append(_Flight(run, outputs, first, choices.leader_of(k) is None))
            meta = ResponseMeta(rid, int(time.time()), ctx.limits.model_name,
                                flights[0].first.weights_version)  # fmt: skip
            headers = _headers(meta, ignored)
            if parsed.stream:
                usage_mode = UsageMode(parsed.include_usage_chunk, parsed.continuous_usage)
                return await _stream(request, flights, meta, usage_mode, headers)
            for f in flights:
                await collect(f.run, f.outputs, f.first)
        finally:
            for outputs in streams:  # the client left or the engine stalled: counted as aborted
                if not outputs.finished:
                    ctx.metrics.observe_finished("abort", None)
    return web.json_response(_body(flights, meta, choices), headers=headers)


def _decode_one(tokenizer: ServingTokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _headers(meta: ResponseMeta, ignored: tuple[str, ...]) -> dict[str, str]:
    out = {WEIGHTS_HEADER: meta.weights_version, REQUEST_ID_HEADER: meta.id}
    if ignored:
        out[IGNORED_FIELDS_HEADER] = ", ".join(ignored)[:1024]
    return out


def _ignored(parsed: CompletionRequest | ChatCompletionRequest, rid: str) -> tuple[str, ...]:
    """Fields the schema does not define: ignored, as vLLM does, and said so (log + header)."""
    ignored = unknown_fields(parsed)
    if ignored:
        logger.info(
            "ignored unknown request fields: %s", ", ".join(ignored), extra={"request_id": rid}
        )
    return ignored


async def completions(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    ctx = request.app[API_CONTEXT]
    parsed = parse_request(CompletionRequest, await request.read(), ctx.strict_fields)
    rid = _request_id(request, "cmpl")
    ereqs = prepare_completion(parsed, ctx.engine.tokenizer, ctx.limits, rid, arrival)
    await compile_grammars(ctx.engine, ereqs)
    return await _serve(request, "completion", parsed, ereqs, rid, _ignored(parsed, rid))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    ctx = request.app[API_CONTEXT]
    parsed = parse_request(ChatCompletionRequest, await request.read(), ctx.strict_fields)
    rid = _request_id(request, "chatcmpl")
    ereqs = prepare_chat(parsed, ctx.engine.tokenizer, ctx.limits, rid, arrival)
    parsers = ctx.chat_parsers
    plan = output_plan(parsed.tool_plan, parsers.tool_call_parser,
                       parsers.reasoning_parser is not None, parsed.output_grammar is not None,
                       parsed.include_reasoning)  # fmt: skip
    await compile_grammars(ctx.engine, ereqs)
    return await _serve(request, "chat", parsed, ereqs, rid, _ignored(parsed, rid), plan)


def model_card(ctx: ApiContext) -> dict[str, Any]:
    """The served model as /v1/models lists it."""
    return {
        "id": ctx.limits.model_name,
        "object": "model",
        "created": ctx.started,
        "owned_by": "loom",
        "root": ctx.limits.model_name,
        "max_model_len": ctx.limits.max_model_len,
    }


async def models(request: web.Request) -> web.Response:
    card = model_card(request.app[API_CONTEXT])
    return web.json_response({"object": "list", "data": [card]})


def add_routes(app: web.Application, ctx: ApiContext, with_models: bool = True) -> None:
    """The text routes; `with_models` False leaves /v1/models to a worker serving more."""
    app[API_CONTEXT] = ctx
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    if with_models:
        app.router.add_get("/v1/models", models)
