"""One client request's trip through the router: features, pick, the P/D two-step, the relay.

Owns turning an OpenAI body into RequestFeatures (off the event loop: tokenizing and hashing a
long prompt takes milliseconds), the pick (scored, or a random / round-robin baseline for
benchmarks), re-picks for migration, and the P/D fallback policy; never parses a worker's
stream (relay.py) and never maps errors to statuses (http_errors.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.filters import SERVING_ROLES, filter_endpoints, rejection
from loom_router.core.migration import Kind
from loom_router.core.pipeline import EndpointPicker
from loom_router.core.request import RequestFeatures, features_from_text, features_from_tokens
from loom_router.core.state import RouterState
from loom_router.errors import (
    BadRequestError,
    NoEndpointError,
    PrefillFailedError,
    UpstreamRefusedError,
)
from loom_router.shell.config import POLICIES, Policy
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.pd_flow import PrefillOutcome, run_prefill
from loom_router.shell.prober import Prober
from loom_router.shell.relay import Relay, Trip
from loom_router.shell.upstream import Upstream
from loom_runtime.wire.headers import PD_FALLBACK_HEADER, PD_HEADER, REQUEST_ID_HEADER
from loom_runtime.wire.pd import decode_body
from loom_runtime.wire.prompt import chat_ids, completion_ids
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

CAPACITY_WAIT_S = 60.0
"""How long a new request waits for capacity while every worker that could take it is draining
or not ready but none is down (a Barrier weight sync, a one-worker-per-role capacity gap):
it is held, not refused, and routed as soon as one serves again."""
CAPACITY_POLL_S = 0.05


@dataclass(frozen=True)
class Choice:
    """Where a request goes, and the bounded label saying why (for metrics)."""

    endpoint: Endpoint
    prefill: Endpoint | None
    why: str
    reason: str = ""


class Dispatcher:
    def __init__(
        self,
        *,
        source: StaticEndpoints,
        state: RouterState,
        upstream: Upstream,
        metrics: RouterMetrics,
        prober: Prober,
        tokenizer: Tokenizer | None,
        policy: Policy = "scored",
        seed: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.source = source
        self.state = state
        self.settings = state.settings
        self.picker = EndpointPicker(state.settings)
        self.upstream = upstream
        self.metrics = metrics
        self.prober = prober
        self.tokenizer = tokenizer
        self.policy = policy
        self.rng = random.Random(seed)
        self._turn = 0
        self._max_model_len: int | None = None
        limit = state.settings.migration_limit
        self.relay = Relay(upstream, prober, metrics, state.load, self, limit)

    async def handle(self, request: web.Request, kind: Kind, request_id: str) -> web.StreamResponse:
        started = time.perf_counter()
        body = await _json_body(request)
        session = request.headers.get(self.settings.session_header)
        if _short(kind, body):  # a few blocks: cheaper than a hop to a thread
            features = self.features(request_id, kind, body, session)
        else:
            features = await asyncio.to_thread(self.features, request_id, kind, body, session)
        choice = await self.pick_waiting(features)
        self.metrics.overhead.observe(time.perf_counter() - started)
        up_headers = {REQUEST_ID_HEADER: request_id}
        decode, out_headers = await self._prefill(choice, request.path, body, up_headers)
        trip = Trip(
            request_id, kind, request.path, body, up_headers, out_headers, started, features
        )
        logger.debug("routed", extra={"request_id": request_id, "reason": choice.reason})
        if body.get("stream") is True:
            return await self.relay.stream(request, trip, choice.endpoint, decode)
        return await self.relay.once(request, trip, choice.endpoint, decode)

    # --- features and picks -------------------------------------------------------------------

    def features(
        self, request_id: str, kind: Kind, body: Mapping[str, Any], session: str | None
    ) -> RequestFeatures:
        """CPU-bound (tokenizing, hashing): call it in a thread."""
        ids: list[int] | None = None
        if self.tokenizer is not None:
            if kind == "completion":
                ids = completion_ids(self.tokenizer, body.get("prompt"))
            else:
                ids = chat_ids(self.tokenizer, body.get("messages"))
        approximate = self.settings.prefix_scorer == "approximate"
        text = _prompt_text(kind, body, ids) if approximate or ids is None else None
        if ids is not None and not approximate:
            return features_from_tokens(request_id, ids, self.state.hasher, session_token=session)
        features = features_from_text(request_id, text or "", session_token=session)
        if ids is not None:
            features = replace(features, prompt_tokens=len(ids))
        return features

    def pick(self, features: RequestFeatures) -> Choice:
        choice = self._choose(features)
        self.metrics.inc("routed", choice.endpoint.id, choice.why)
        return choice

    async def pick_waiting(self, features: RequestFeatures) -> Choice:
        """`pick`, but while capacity is only paused (see CAPACITY_WAIT_S) wait for it."""
        deadline = time.monotonic() + CAPACITY_WAIT_S
        while True:
            try:
                return self.pick(features)
            except NoEndpointError:
                if time.monotonic() >= deadline or not self._capacity_paused():
                    raise
            await asyncio.sleep(CAPACITY_POLL_S)

    def _capacity_paused(self) -> bool:
        """Some serving worker is held back only for now (draining, not ready, admission
        closed, mid weight sync), not marked down."""
        load = self.state.load.view(time.monotonic())
        return any(
            e.role in SERVING_ROLES and not e.down and rejection(e, load) is not None
            for e in self.source.snapshot().endpoints
        )

    def repick(self, trip: Trip, exclude: set[str], version: str | None) -> Endpoint:
        """Another serving endpoint for a request that failed (on `version` if given)."""
        base = trip.features or RequestFeatures(trip.request_id, 0)
        features = replace(base, exclude=frozenset(exclude), weights_version=version)
        choice = self._choose(features, remember=False)
        self.metrics.inc("routed", choice.endpoint.id, "migration")
        return choice.endpoint

    def _choose(self, features: RequestFeatures, remember: bool = True) -> Choice:
        snapshot = self.source.snapshot()
        if self.policy != "scored":
            load = self.state.load.view(time.monotonic())
            kept = filter_endpoints(
                snapshot.endpoints, SERVING_ROLES, load, features.weights_version,
                features.exclude,
            ).kept  # fmt: skip
            if not kept:
                raise NoEndpointError(f"request {features.request_id}: no endpoint can take it")
            if self.policy == "random":
                return Choice(self.rng.choice(kept), None, "random")
            self._turn += 1
            return Choice(kept[self._turn % len(kept)], None, "round-robin")
        now = time.monotonic()
        inputs = self.state.inputs(snapshot, now)
        # Ties break by the request's own id: replicas that saw the same events pick the same.
        decision = self.picker.pick(features, inputs, random.Random(features.request_id))
        if remember:
            self.state.remember(decision, features, now)
        if decision.spilled_from:
            why = "spill"
        elif decision.cached_blocks > 0:
            why = "prefix"
        elif dict(decision.scores[0].parts).get("session", 0.0) > 0:
            why = "session"
        else:
            why = "load"
        return Choice(decision.endpoint, decision.prefill, why, decision.reason)

    async def max_model_len(self, endpoint: Endpoint) -> int | None:
        """The served context length (learned once from a worker's /v1/models)."""
        if self._max_model_len is None:
            try:
                status, text = await self.upstream.get(endpoint.url + "/v1/models", 5.0)
                data = json.loads(text)["data"][0]["max_model_len"] if status == 200 else None
            except Exception:  # any failure: unknown, and the relay restarts instead
                data = None
            self._max_model_len = data if isinstance(data, int) else None
        return self._max_model_len

    # --- P/D ----------------------------------------------------------------------------------

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


def _short(kind: Kind, body: Mapping[str, Any]) -> bool:
    if kind == "completion":
        prompt = body.get("prompt")
        return isinstance(prompt, str | list) and len(prompt) < INLINE_PROMPT_CHARS // 4
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) > 64:
        return False
    size = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, Mapping))
    return size < INLINE_PROMPT_CHARS


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    return body


def _prompt_text(kind: Kind, body: Mapping[str, Any], ids: list[int] | None = None) -> str:
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
