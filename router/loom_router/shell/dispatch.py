"""One client request's trip through the router: features, pick, the P/D two-step, then the
attempt loop.

Owns turning an OpenAI body into RequestFeatures (off the event loop: tokenizing and hashing a
long prompt takes milliseconds) and the P/D fallback policy; never picks by itself (picking.py),
never retries (attempt_loop.py) and never maps errors to statuses (loom_router.errors).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from aiohttp import web

from loom_router.core.body_check import (
    check_body,
    check_context,
    check_rewritten_fields,
    parse_body,
    prefilled_where_decoded,
)
from loom_router.core.request import RequestFeatures, features_from_text, features_from_tokens
from loom_router.core.state import RouterState
from loom_router.errors import PrefillFailedError, UpstreamRefusedError
from loom_router.shell.attempt_loop import AttemptLoop
from loom_router.shell.client_reply import Trip
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.pd_flow import PrefillOutcome, run_prefill
from loom_router.shell.picking import Choice, Picking
from loom_router.shell.prober import Prober
from loom_router.shell.transport import Transport
from loom_router.shell.upstream import Upstream
from loom_runtime.wire.headers import PD_FALLBACK_HEADER, PD_HEADER, REQUEST_ID_HEADER
from loom_runtime.wire.openai.response import ResponseKind
from loom_runtime.wire.pd import decode_body
from loom_runtime.wire.prompt import chat_ids, completion_ids
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        *,
        state: RouterState,
        picking: Picking,
        upstream: Upstream,
        transport: Transport,
        metrics: RouterMetrics,
        prober: Prober,
        tokenizer: Tokenizer | None,
    ) -> None:
        self.state = state
        self.settings = state.settings
        self.picking = picking
        self.upstream = upstream
        self.metrics = metrics
        self.prober = prober
        self.tokenizer = tokenizer
        self.attempts = AttemptLoop(transport, picking, metrics, state.settings.migration_limit)

    async def handle(
        self, request: web.Request, kind: ResponseKind, request_id: str
    ) -> web.StreamResponse:
        started = time.perf_counter()
        body = await _json_body(request)
        check_body(kind, body)
        session = request.headers.get(self.settings.session_header)
        if _short(kind, body):  # a few blocks: cheaper than a hop to a thread
            features, ids = self.features(request_id, kind, body, session)
        else:
            features, ids = await asyncio.to_thread(self.features, request_id, kind, body, session)
        choice = await self.picking.pick_waiting(features)
        if choice.prefill is not None and prefilled_where_decoded(kind, body):
            choice = replace(choice, prefill=None)  # several prompts or prompt log-probs
        self.metrics.overhead.observe(time.perf_counter() - started)
        up_headers = {REQUEST_ID_HEADER: request_id}
        if choice.prefill is not None:  # a client's error is decided here, not as a P/D fault
            await self._check_before_prefill(choice, kind, body, ids)
        decode, out_headers = await self._prefill(choice, request.path, body, up_headers)
        trip = Trip(
            request_id, kind, request.path, body, up_headers, out_headers, started, features
        )
        logger.debug("routed", extra={"request_id": request_id, "reason": choice.reason})
        return await self.attempts.run(request, trip, choice.endpoint, decode)

    # --- features -----------------------------------------------------------------------------

    def features(
        self, request_id: str, kind: ResponseKind, body: Mapping[str, Any], session: str | None
    ) -> tuple[RequestFeatures, list[int] | None]:
        """The request's features and its prompt ids when the router tokenized it. CPU-bound
        (tokenizing, hashing): call it in a thread."""
        ids: list[int] | None = None
        if self.tokenizer is not None:
            if kind == "completion":
                ids = completion_ids(self.tokenizer, body.get("prompt"))
            else:
                ids = chat_ids(self.tokenizer, body.get("messages"), body.get("tools"),
                               body.get("chat_template_kwargs"))  # fmt: skip
        approximate = self.settings.prefix_scorer == "approximate"
        text = _prompt_text(kind, body, ids) if approximate or ids is None else None
        if ids is not None and not approximate:
            hasher = self.state.hasher
            return features_from_tokens(request_id, ids, hasher, session_token=session), ids
        features = features_from_text(request_id, text or "", session_token=session)
        if ids is not None:
            features = replace(features, prompt_tokens=len(ids))
        return features, ids

    # --- P/D ----------------------------------------------------------------------------------

    async def _check_before_prefill(
        self, choice: Choice, kind: ResponseKind, body: Mapping[str, Any], ids: list[int] | None
    ) -> None:
        """What the decode would refuse and the prefill cannot see: the fields the prefill body
        rewrites, and a prompt too long for the decode's context."""
        check_rewritten_fields(body)
        if ids is not None:
            max_len = await self.picking.max_model_len(choice.endpoint)
            if max_len is not None:
                check_context(kind, body, len(ids), max_len)

    async def _prefill(
        self, choice: Choice, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The decode's body and the response headers that say how the prompt was prefilled."""
        if choice.endpoint.role != "decode":
            return body, {}
        prefill = choice.prefill
        if prefill is None:
            self.metrics.inc("pd", "local-prefill")
            return body, {PD_HEADER: "local-prefill"}
        self.state.load.begin(prefill.id)
        try:
            outcome = await run_prefill(
                self.upstream, prefill, choice.endpoint, path, body, headers,
                self.upstream.timeouts.read_s,
            )  # fmt: skip
        except UpstreamRefusedError as exc:
            self.prober.refused(prefill.id, str(exc))
            outcome = PrefillOutcome(None, "refused", str(exc))
        finally:
            self.state.load.end(prefill.id)
        out: dict[str, str] = {PD_HEADER: outcome.mode}
        note = outcome.header(prefill.id)
        if note is not None:
            self.metrics.inc("pd_fallbacks", outcome.fallback or "unknown")
            if self.settings.on_transfer_failure == "fail":
                raise PrefillFailedError(
                    f"remote prefill failed ({note}) and failover.onTransferFailure is fail"
                )
            out[PD_FALLBACK_HEADER] = note
        self.metrics.inc("pd", outcome.mode)
        return decode_body(body, outcome.params), out


INLINE_PROMPT_CHARS = 2048
"""Chat prompts shorter than this many characters (completions: a quarter as many characters or
token ids) are tokenized and hashed on the event loop (well under 1 ms); longer ones in a
thread."""


def _short(kind: ResponseKind, body: Mapping[str, Any]) -> bool:
    if kind == "completion":
        prompt = body.get("prompt")
        return isinstance(prompt, str | list) and len(prompt) < INLINE_PROMPT_CHARS // 4
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) > 64:
        return False
    size = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, Mapping))
    return size < INLINE_PROMPT_CHARS


async def _json_body(request: web.Request) -> dict[str, Any]:
    return parse_body(await request.read())


def _prompt_text(kind: ResponseKind, body: Mapping[str, Any], ids: list[int] | None = None) -> str:
    """Text whose prefix grows with the prompt's (for the approximate index)."""
    if ids is not None and kind == "completion" and not isinstance(body.get("prompt"), str):
        return " ".join(map(str, ids))
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt or []))
    parts = []
    for message in body.get("messages") or []:
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            parts.append(f"{message.get('role')}: {content}")
    return "\n".join(parts)
