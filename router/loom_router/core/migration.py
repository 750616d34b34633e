"""Request migration's pure core: what a client has received, where a stream can resume, and how
a replacement worker's chunks continue the client's stream without a repeated or lost token.

Owns `StreamTracker` (per in-flight stream, one owner: its relay) and the replay request it
builds; never does I/O, never tokenizes (it replays the worker's own token ids), never writes a
chunk's JSON itself (loom_runtime.wire.openai encodes it, as the worker does) and never decides
which worker to use.

How a resume stays exact (greedy sampling): the router asks the worker for `return_token_ids`,
so it knows the prompt ids P and every generated id G. A *clean boundary* is a point after
which the worker had emitted all text of the tokens so far: a chunk of exactly one token whose
text is non-empty (the detokenizer emits only whole characters, and all of them), and, when stop
strings are set, whose next text does not begin like a stop string (else text may have been
held back). The replacement replays P + G[:k] for the last clean boundary k as a
/v1/completions request with max_tokens reduced by k; it regenerates G[k:], whose tokens and
text the tracker skips (the client has them), and the rest is forwarded in the client's format
under the original id. Without a boundary (or without P) it resends the original request and
skips everything already sent: slower, equally exact.

A chat output the worker reads back (tool calls, with `tools` and a tool_choice other than
none; reasoning, seen as `reasoning` in a delta) streams as deltas that are not its text, and the
reader's state stays on the worker: its chunks pass through as the worker wrote them, and such a
stream moves only before it has sent anything (the original request again); after that the
client gets `migration_failed` saying why.

A structured output (response_format / structured_outputs) keeps its grammar's state on the
worker that generated it, so it is never continued from a boundary: the original request is
resent and regenerates the tokens sent so far through a fresh matcher, which is exact only when
the request is deterministic (greedy or seeded); a sampled unseeded one is not moved (a clear
error instead of a corrupted output). A stream with a behaviour record restarts the same way,
with the seed its record reported (record_relay.py), so the record continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loom_router.core.record_relay import relayed_fields, reported_seed, seeded_replay
from loom_router.errors import MigrationFailedError
from loom_runtime.wire.context_length import COMPLETIONS_DEFAULT_MAX_TOKENS
from loom_runtime.wire.kv_transfer import FIELD as KV_TRANSFER_FIELD
from loom_runtime.wire.openai.behaviour import RecordAsk
from loom_runtime.wire.openai.logprobs import COMPLETION_FIELDS, chat_entry
from loom_runtime.wire.openai.response import (
    HEAD_FIELDS,
    ResponseKind,
    chunk,
    chunk_object,
    usage_chunk,
)
from loom_runtime.wire.openai.structured import is_constrained
from loom_runtime.wire.openai.tools import calls_are_read

COMPLETIONS_PATH = "/v1/completions"
_NOT_FOR_COMPLETIONS = frozenset(
    {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
     "response_format", "parallel_tool_calls", "functions", "function_call", "echo",
     "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
     "documents", KV_TRANSFER_FIELD, "prompt", "max_tokens"}
)  # fmt: skip


@dataclass(frozen=True)
class Boundary:
    """`tokens` generated ids whose text is exactly the first `chars` characters sent."""

    tokens: int
    chars: int


@dataclass(frozen=True)
class Attempt:
    """One upstream request of a stream and how its chunks map onto the client's stream.

    The upstream's output starts at client position (`token_base`, `char_base`); its first
    `skip_tokens` ids and `skip_chars` characters were already sent and are dropped.
    """

    path: str
    body: dict[str, Any]
    source_kind: ResponseKind
    token_base: int = 0
    char_base: int = 0
    skip_tokens: int = 0
    skip_chars: int = 0
    expected: tuple[int, ...] = ()
    """The ids being regenerated (skipped); a greedy replay reproduces them exactly."""

    @property
    def resumes(self) -> bool:
        return self.token_base > 0 or self.skip_tokens > 0 or self.skip_chars > 0


def stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str) and s)
    return ()


def first_attempt(path: str, body: Mapping[str, Any], kind: ResponseKind) -> Attempt:
    """The original request, streamed with token ids (the tracker needs them)."""
    return Attempt(path, {**body, "stream": True, "return_token_ids": True}, kind)


class StreamTracker:
    """One client stream: its head (id, created, …), the ids and text sent, clean boundaries."""

    def __init__(self, kind: ResponseKind, body: Mapping[str, Any]) -> None:
        self.kind = kind
        self.record = RecordAsk.of(body)
        self.want_ids = body.get("return_token_ids") is True or self.record.behaviour
        self.seed: int | None = None  # a behaviour record's, as the worker reported it
        self.read_back = kind == "chat" and calls_are_read(body)  # deltas are not the text
        self.stops = stop_strings(body)
        self.prompt_ids: tuple[int, ...] | None = None
        self.tokens: list[int] = []
        self.text_len = 0
        self.head: dict[str, Any] | None = None
        self.role_sent = False
        self.prompt_sent = False
        self.finished = False
        self.diverged = False
        self._clean: list[Boundary] = [Boundary(0, 0)]
        self._candidate: Boundary | None = None
        self._attempt: Attempt | None = None
        self._skip_tokens = 0
        self._skip_chars = 0

    # --- resuming ---------------------------------------------------------------------------

    def begin(self, attempt: Attempt) -> None:
        """Chunks from now on come from `attempt`'s upstream."""
        self._attempt = attempt
        self._skip_tokens = attempt.skip_tokens
        self._skip_chars = attempt.skip_chars
        self._candidate = None  # a boundary needs the next text of the same upstream

    def boundary(self, below_tokens: int | None = None) -> Boundary:
        """The last clean boundary (with fewer than `below_tokens` tokens, if given)."""
        for b in reversed(self._clean):
            if below_tokens is None or b.tokens < below_tokens:
                return b
        return self._clean[0]

    def replay(
        self, path: str, body: Mapping[str, Any], max_model_len: int | None = None
    ) -> Attempt:
        """The next attempt after a failure: prompt + tokens so far, or the original again."""
        original = {k: v for k, v in body.items() if k != KV_TRANSFER_FIELD}
        original = seeded_replay(original, self.record, self.seed)
        restart = Attempt(
            path,
            {**original, "stream": True, "return_token_ids": True},
            self.kind,
            skip_tokens=len(self.tokens),
            skip_chars=self.text_len,
            expected=tuple(self.tokens),
        )
        if self.read_back:
            return _unread(restart)
        if is_constrained(original) or self.record.behaviour:
            return _regenerated(restart, original)
        if self.prompt_ids is None:
            return restart
        total = max_tokens_of(self.kind, body, len(self.prompt_ids), max_model_len)
        if total is None:
            return restart
        point = self.boundary(below_tokens=total)
        if point.tokens == 0:
            return restart
        prompt = [*self.prompt_ids, *self.tokens[: point.tokens]]
        return Attempt(
            COMPLETIONS_PATH,
            completions_body(self.kind, body, prompt, total - point.tokens, point.tokens),
            "completion",
            token_base=point.tokens,
            char_base=point.chars,
            skip_tokens=len(self.tokens) - point.tokens,
            skip_chars=self.text_len - point.chars,
            expected=tuple(self.tokens[point.tokens :]),
        )

    # --- chunks -----------------------------------------------------------------------------

    def take(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """The client's chunk for an upstream chunk (None: nothing left to send)."""
        attempt = self._attempt
        if attempt is None:
            raise RuntimeError("StreamTracker.take before begin")
        if self.head is None:
            self.head = {k: event[k] for k in HEAD_FIELDS if k in event}
            if self.kind == "chat":
                self.head["object"] = chunk_object("chat")
        choices = event.get("choices")
        if not choices:
            return self._usage(event, attempt) if "usage" in event else None
        choice = choices[0]
        if not attempt.resumes and self.prompt_ids is None:
            ids = event.get("prompt_token_ids", choice.get("prompt_token_ids"))
            if isinstance(ids, list):
                self.prompt_ids = tuple(ids)
        role = attempt.source_kind == "chat" and "role" in (choice.get("delta") or {})
        read = _read_fields(attempt.source_kind, choice)
        self.read_back = self.read_back or bool(read)
        raw_ids = choice.get("token_ids")
        ids = list(raw_ids) if isinstance(raw_ids, list) else []
        text = _text(attempt.source_kind, choice)
        skipped = min(len(ids), self._skip_tokens)
        at = attempt.skip_tokens - self._skip_tokens
        if skipped and list(attempt.expected[at : at + skipped]) != ids[:skipped]:
            self.diverged = True
        self._skip_tokens -= skipped
        cut = min(len(text), self._skip_chars)
        self._skip_chars -= cut
        self._track(ids, text, skipped, cut)
        reason = choice.get("finish_reason")
        if reason is not None:
            self.finished = True
        logprobs = _logprobs(attempt, choice.get("logprobs"), skipped, self.kind)
        if self.seed is None:
            self.seed = reported_seed(choice)
        record = relayed_fields(choice, self.record, skipped, attempt.token_base)
        out_ids = ids[skipped:]
        out_text = text[cut:]
        if role and self.role_sent:
            role = False
        if not (role or out_ids or out_text or read or reason is not None
                or _has_entries(logprobs)):  # fmt: skip
            return None
        self.role_sent = self.role_sent or role
        fields = None if not read else ({"content": out_text} if out_text else {}) | read
        out = self._chunk(event, role, out_text, out_ids, logprobs, reason, fields)
        out["choices"][0] |= record
        return out

    def _track(self, ids: list[int], text: str, skipped: int, cut: int) -> None:
        new_text = text[cut:]
        if self._candidate is not None and new_text:
            if not any(new_text.startswith(s[0]) for s in self.stops):
                self._clean.append(self._candidate)
            self._candidate = None
        self.tokens.extend(ids[skipped:])
        self.text_len += len(new_text)
        if len(ids) == 1 and text and not self._skip_tokens and not self._skip_chars:
            point = Boundary(len(self.tokens), self.text_len)
            if self.stops:
                self._candidate = point
            elif point != self._clean[-1]:
                self._clean.append(point)
            del self._clean[:-64]  # only the last few boundaries are ever used
            if self._clean[0] != Boundary(0, 0):
                self._clean.insert(0, Boundary(0, 0))

    def _chunk(
        self,
        event: Mapping[str, Any],
        role: bool,
        text: str,
        ids: list[int],
        logprobs: Any,
        reason: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The client's chunk, encoded as the worker encodes one (the prompt's ids once); a
        read-back delta's `fields` (reasoning, tool_calls) as the worker wrote them."""
        prompt_ids: tuple[int, ...] | None = None
        if self.want_ids and not self.prompt_sent and self.prompt_ids is not None:
            self.prompt_sent = True
            prompt_ids = self.prompt_ids
        token_ids = ids if self.want_ids else None
        return chunk(self.kind, self.head or {}, text, logprobs, reason, "usage" in event, role,
                     token_ids, prompt_ids, event.get("usage"), fields)  # fmt: skip

    def _usage(self, event: Mapping[str, Any], attempt: Attempt) -> dict[str, Any]:
        """The usage chunk, counting the whole request: a replay's prompt held k output ids."""
        usage = dict(event.get("usage") or {})
        k = attempt.token_base
        if k and isinstance(usage.get("prompt_tokens"), int):
            usage["prompt_tokens"] -= k
            usage["completion_tokens"] = int(usage.get("completion_tokens") or 0) + k
            details = dict(usage.get("prompt_tokens_details") or {})
            if isinstance(details.get("cached_tokens"), int):
                details["cached_tokens"] = min(details["cached_tokens"], usage["prompt_tokens"])
                usage["prompt_tokens_details"] = details
        return usage_chunk(self.head or {}, usage)


def max_tokens_of(
    kind: ResponseKind, body: Mapping[str, Any], prompt_len: int, max_model_len: int | None
) -> int | None:
    """The output budget the original request ran with (None when it cannot be known)."""
    if kind == "completion":
        value = body.get("max_tokens")
        return value if isinstance(value, int) else COMPLETIONS_DEFAULT_MAX_TOKENS
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int):
            return value
    return None if max_model_len is None else max_model_len - prompt_len


def _regenerated(restart: Attempt, body: Mapping[str, Any]) -> Attempt:
    """A structured output's replay: the original request again (its grammar restarts with
    it), when it regenerates the same tokens; MigrationFailedError when it would not."""
    if not restart.skip_tokens or _deterministic(body):
        return restart
    raise MigrationFailedError(
        f"a structured output sampled without a seed cannot continue on another worker after "
        f"{restart.skip_tokens} tokens: its grammar state stays on the failed worker and a "
        "regenerated output would differ; retry the request (send a seed or temperature 0 to "
        "make it resumable)"
    )


def _unread(restart: Attempt) -> Attempt:
    """A read-back chat stream's replay: the original request, only while nothing was sent."""
    if not restart.skip_tokens and not restart.skip_chars:
        return restart
    raise MigrationFailedError(
        f"a chat stream whose output the worker reads back (tool calls or reasoning) cannot "
        f"continue on another worker after {restart.skip_tokens} tokens: the reader's state "
        "stays on the failed worker and its deltas are not the output's text; retry the request"
    )


def _read_fields(kind: ResponseKind, choice: Mapping[str, Any]) -> dict[str, Any]:
    """A chat delta's fields beside role and content (reasoning, tool_calls), as written."""
    delta = choice.get("delta") if kind == "chat" else None
    if not isinstance(delta, Mapping):
        return {}
    return {k: v for k, v in delta.items() if k not in ("role", "content")}


def _deterministic(body: Mapping[str, Any]) -> bool:
    """Whether resending `body` regenerates the same tokens: greedy, or a seeded draw."""
    return body.get("temperature") == 0 or body.get("top_k") == 1 or body.get("seed") is not None


def completions_body(
    kind: ResponseKind,
    body: Mapping[str, Any],
    prompt: Sequence[int],
    max_tokens: int,
    generated: int,
) -> dict[str, Any]:
    """A /v1/completions request continuing `body` from token-id `prompt`, which ends with the
    `generated` tokens already sent (so `min_tokens` shrinks by them, as `max_tokens` did)."""
    out = {k: v for k, v in body.items() if k not in _NOT_FOR_COMPLETIONS}
    out.update(prompt=list(prompt), max_tokens=max_tokens, stream=True, return_token_ids=True)
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool):
        out["min_tokens"] = max(0, min_tokens - generated)
    if kind == "chat":
        if body.get("logprobs") is True:
            out["logprobs"] = int(body.get("top_logprobs") or 0)
    elif body.get("logprobs") is not None:
        out["logprobs"] = body["logprobs"]
    return out


def _text(kind: ResponseKind, choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta") or {}
    content = delta.get("content") if kind == "chat" else choice.get("text")
    return content if isinstance(content, str) else ""


def _has_entries(logprobs: Any) -> bool:
    if not isinstance(logprobs, Mapping):
        return False
    return bool(logprobs.get("content") or logprobs.get("tokens"))


def _logprobs(attempt: Attempt, raw: Any, skipped: int, client_kind: ResponseKind) -> Any:
    """The chunk's logprobs without the skipped tokens, in the client's format."""
    if not isinstance(raw, Mapping):
        return None
    if attempt.source_kind == "chat":
        return {"content": list(raw.get("content") or [])[skipped:]}
    cut = {k: list(raw.get(k) or [])[skipped:] for k in COMPLETION_FIELDS}
    cut["text_offset"] = [o + attempt.char_base for o in cut["text_offset"]]
    if client_kind == "completion":
        return cut
    entries = zip(cut["tokens"], cut["token_logprobs"], cut["top_logprobs"], strict=False)
    return {"content": [chat_entry(t, lp, _alternatives(top)) for t, lp, top in entries]}


def _alternatives(top: Any) -> Iterable[tuple[str, float]]:
    return top.items() if isinstance(top, Mapping) else ()
