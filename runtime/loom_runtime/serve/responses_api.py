"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API, each response run as
a chat request (its input and instructions rendered by the chat template, its output read back
by the chat reader), whole or as the Responses streaming events; a stored response is continued
by `previous_response_id`.

Owns the route, the store's use and the event writing; never renders a prompt or reads model
output itself (wire/openai/responses and wire/openai/chat do), never blocks the event loop.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp import web

from loom_runtime.engine.types import RequestOutput
from loom_runtime.errors import InvalidRequestError, LoomError
from loom_runtime.serve.api_context import API_CONTEXT
from loom_runtime.serve.bridge import OutputStream, submitted
from loom_runtime.serve.errors import classify
from loom_runtime.serve.prepare import prepare_chat
from loom_runtime.serve.response_store import ResponseStore, StoredResponse
from loom_runtime.serve.run import Run, collect, compile_grammars
from loom_runtime.wire.headers import IGNORED_FIELDS_HEADER, REQUEST_ID_HEADER, WEIGHTS_HEADER
from loom_runtime.wire.openai.chat.output import DeltaStream, OutputPlan, output_plan, read_message
from loom_runtime.wire.openai.request import (
    ChatCompletionRequest,
    parse_request,
    unknown_fields,
)
from loom_runtime.wire.openai.request_id import worker_request_id
from loom_runtime.wire.openai.responses.events import Event, EventStream
from loom_runtime.wire.openai.responses.output import (
    ResponseHead,
    Usage,
    continued,
    final_status,
    output_items,
)
from loom_runtime.wire.openai.responses.request import (
    CHAT_PARAMS,
    ResponsesRequest,
    chat_body,
    conversation,
    responses_param,
)

logger = logging.getLogger(__name__)
RESPONSE_STORE = web.AppKey("response_store", ResponseStore)


def _as_chat(body: dict[str, Any], strict: bool) -> ChatCompletionRequest:
    """The chat request, its errors named as the Responses request names the fields."""
    try:
        return parse_request(ChatCompletionRequest, json.dumps(body).encode(), strict)
    except InvalidRequestError as exc:
        message = str(exc)
        for chat_name, name in CHAT_PARAMS.items():
            message = message.replace(chat_name, name)
        raise InvalidRequestError(message, param=responses_param(exc.param)) from None


def _usage(run: Run) -> Usage:
    acc = run.acc
    return Usage(acc.prompt_tokens, acc.cached_tokens, acc.completion_tokens)


def _keep(
    store: ResponseStore,
    req: ResponsesRequest,
    body: dict[str, Any],
    turns: list[dict[str, Any]],
) -> None:
    if req.store:
        store.put(body["id"], StoredResponse(body, tuple(continued(turns, body["output"]))))


async def create_response(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    ctx = request.app[API_CONTEXT]
    store = request.app[RESPONSE_STORE]
    parsed = parse_request(ResponsesRequest, await request.read(), ctx.strict_fields)
    history = store.get(parsed.previous_response_id).conversation if (
        parsed.previous_response_id is not None
    ) else ()  # fmt: skip
    turns = conversation(parsed, history)
    chat = _as_chat(chat_body(parsed, turns), ctx.strict_fields)
    rid = worker_request_id(request.headers.get(REQUEST_ID_HEADER, ""), "resp")
    (ereq,) = prepare_chat(chat, ctx.engine.tokenizer, ctx.limits, rid, arrival)
    parsers = ctx.chat_parsers
    plan = output_plan(chat.tool_plan, parsers.tool_call_parser,
                       parsers.reasoning_parser is not None, chat.output_grammar is not None,
                       chat.include_reasoning)  # fmt: skip
    await compile_grammars(ctx.engine, (ereq,))
    head = ResponseHead(rid, ctx.limits.model_name, parsed)
    ignored = unknown_fields(parsed)
    async with submitted(ctx.engine, ereq, ctx.mailbox) as outputs:
        run = Run(ctx, "chat", None, plan=plan)
        first = await outputs.next(ctx.stall_timeout_s)
        if first.finished and first.finish_reason == "abort":
            run.take(first)  # raises RequestAbortedError before any header is sent
        headers = {WEIGHTS_HEADER: first.weights_version, REQUEST_ID_HEADER: rid}
        if ignored:
            headers[IGNORED_FIELDS_HEADER] = ", ".join(ignored)[:1024]
        if parsed.stream:
            return await _stream(request, run, outputs, first, head, plan, headers, turns)
        await collect(run, outputs, first)
    parts = read_message(plan, "".join(run.acc.text))
    status, incomplete = final_status(run.acc.finish_reason)
    items = output_items(parts, plan.include_reasoning)
    body = head.body(status, items, _usage(run), incomplete)
    _keep(store, parsed, body, turns)
    return web.json_response(body, headers=headers)


async def _stream(
    request: web.Request,
    run: Run,
    outputs: OutputStream,
    first: RequestOutput,
    head: ResponseHead,
    plan: OutputPlan,
    headers: dict[str, str],
    turns: list[dict[str, Any]],
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    events = EventStream(head)
    try:
        await _write(resp, events.start())
        reader, out = DeltaStream(plan), first
        while True:
            run.take(out)
            await _write(resp, events.step(reader.step(out.new_text, out.finished)))
            if out.finished:
                break
            out = await outputs.next(run.ctx.stall_timeout_s)
        status, incomplete = final_status(run.acc.finish_reason)
        last = events.finish(status, _usage(run), incomplete)
        await _write(resp, last)
        _keep(request.app[RESPONSE_STORE], head.request, last[-1]["response"], turns)
    except LoomError as exc:  # headers are sent: the error travels as an event
        logger.warning("response stream ended by error: %s", exc, extra={"request_id": head.id})
        reply = classify(exc, head.id)
        await _write(resp, events.error(reply.code, reply.message, reply.param))
    except ConnectionResetError:  # the `submitted` block aborts the request
        logger.info("client left mid-stream", extra={"request_id": head.id})
        return resp
    await resp.write_eof()
    return resp


async def _write(resp: web.StreamResponse, events: list[Event]) -> None:
    for event in events:
        data = json.dumps(event, separators=(",", ":"))
        await resp.write(f"event: {event['type']}\ndata: {data}\n\n".encode())


async def get_response(request: web.Request) -> web.Response:
    stored = request.app[RESPONSE_STORE].get(request.match_info["response_id"])
    return web.json_response(stored.body)


def add_routes(app: web.Application, store: ResponseStore | None = None) -> None:
    """The Responses routes (after openai_api.add_routes, whose context they use)."""
    app[RESPONSE_STORE] = store or ResponseStore()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
