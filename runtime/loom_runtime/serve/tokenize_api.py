"""vLLM's POST /tokenize and POST /detokenize on a worker: the very token ids the OpenAI routes
would run for a prompt or chat, and text for token ids, in vLLM's shapes.

Owns those two routes; never touches the engine's queue (only its tokenizer and limits).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from loom_runtime.errors import InvalidRequestError
from loom_runtime.serve.api_context import API_CONTEXT, ApiContext
from loom_runtime.serve.prepare import chat_messages, check_model
from loom_runtime.wire.openai.request import parse_request
from loom_runtime.wire.openai.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from loom_runtime.wire.prompt import template_tools


def _is_chat(raw: bytes) -> bool:
    """vLLM's union: a body with `messages` is a chat (a bad body is judged as a prompt)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    return isinstance(body, dict) and "messages" in body


def tokenize_body(ctx: ApiContext, raw: bytes) -> dict[str, Any]:
    """The /tokenize answer for a raw body: count, max_model_len, tokens, token_strs."""
    tokenizer = ctx.engine.tokenizer
    req: TokenizeChatRequest | TokenizeCompletionRequest
    if _is_chat(raw):
        req = parse_request(TokenizeChatRequest, raw, ctx.strict_fields)
        tools = None if req.tools is None else template_tools([t.model_dump() for t in req.tools])
        text = tokenizer.apply_chat_template(
            chat_messages(req.messages), req.add_generation_prompt, tools, req.chat_template_kwargs
        )
        ids = list(tokenizer.encode(text, add_special_tokens=req.add_special_tokens))
    else:
        req = parse_request(TokenizeCompletionRequest, raw, ctx.strict_fields)
        ids = list(tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens))
    if req.model is not None:
        check_model(req.model, ctx.limits)
    return {
        "count": len(ids),
        "max_model_len": ctx.limits.max_model_len,
        "tokens": ids,
        "token_strs": tokenizer.token_strings(ids) if req.return_token_strs else None,
    }


def detokenize_body(ctx: ApiContext, raw: bytes) -> dict[str, Any]:
    """The /detokenize answer: the text of the ids, special tokens kept (as vLLM)."""
    req = parse_request(DetokenizeRequest, raw, ctx.strict_fields)
    if req.model is not None:
        check_model(req.model, ctx.limits)
    bad = [t for t in req.tokens if t >= ctx.limits.vocab_size]
    if bad:
        raise InvalidRequestError(
            f"token id {bad[0]} is outside the vocabulary (size {ctx.limits.vocab_size})",
            param="tokens",
        )
    return {"prompt": ctx.engine.tokenizer.decode(req.tokens, skip_special_tokens=False)}


async def tokenize(request: web.Request) -> web.Response:
    body = tokenize_body(request.app[API_CONTEXT], await request.read())
    return web.json_response(body)


async def detokenize(request: web.Request) -> web.Response:
    body = detokenize_body(request.app[API_CONTEXT], await request.read())
    return web.json_response(body)


def add_routes(app: web.Application) -> None:
    """The two routes, on an app that already holds the OpenAI routes' API_CONTEXT."""
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
