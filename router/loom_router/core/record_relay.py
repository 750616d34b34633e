"""How a behaviour record (loom_runtime.wire.openai.behaviour) survives request migration: the
record fields of a relayed chunk, cut and shifted onto the client's stream, and the seed a
replay must carry so that it regenerates exactly what the client has.

Owns those rules (pure functions over chunk JSON); never sends a request and never decides
where a stream resumes (migration.StreamTracker does).

A stream with a behaviour record is never continued from a token boundary: the continuation
would draw from a fresh generator, so the record's `seed` would no longer say how its tokens
were drawn. It restarts the original request on the same weights version (the router's rule)
with the record's seed (the client's own, or the one the worker chose and reported on the first
chunk), which regenerates every token and log-prob the client has; the tracker drops them and
checks they are the same ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loom_runtime.wire.openai.behaviour import (
    CHOICE_FIELD,
    VERSIONS_FIELD,
    RecordAsk,
    add_span,
    behaviour_object,
)


def reported_seed(choice: Mapping[str, Any]) -> int | None:
    """The seed a chunk's behaviour object reports (None: none, or a greedy request)."""
    record = choice.get(CHOICE_FIELD)
    seed = record.get("seed") if isinstance(record, Mapping) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def seeded_replay(body: Mapping[str, Any], ask: RecordAsk, seed: int | None) -> dict[str, Any]:
    """The original body a behaviour-record stream restarts with: its own seed, or the one the
    worker reported, so that the replay draws the same tokens."""
    out = dict(body)
    if ask.behaviour and out.get("seed") is None and seed is not None:
        out["seed"] = seed
    return out


def relayed_fields(
    choice: Mapping[str, Any], ask: RecordAsk, skipped: int, token_base: int
) -> dict[str, Any]:
    """The record fields of the client's chunk for an upstream `choice` whose first `skipped`
    tokens the client already has, from an upstream whose output starts at client token
    `token_base` (its weight_versions shifted there; the tokens before it were sampled by the
    same version, as the router continues a stream only on the version it began with)."""
    out: dict[str, Any] = {}
    record = choice.get(CHOICE_FIELD)
    if ask.behaviour and isinstance(record, Mapping):
        logprobs = record.get("logprobs")
        kept = list(logprobs)[skipped:] if isinstance(logprobs, list) else []
        out[CHOICE_FIELD] = behaviour_object(reported_seed(choice), kept)
    spans = choice.get(VERSIONS_FIELD)
    if ask.versions and isinstance(spans, list):
        out[VERSIONS_FIELD] = shifted_spans(spans, token_base)
    return out


def shifted_spans(spans: list[Any], token_base: int) -> list[dict[str, Any]]:
    """An upstream's weight_versions moved to start at client token `token_base`, the tokens
    before it given the first span's version."""
    good = [s for s in spans if isinstance(s, Mapping) and isinstance(s.get("version"), str)]
    out: list[dict[str, Any]] = []
    if good and token_base:
        add_span(out, good[0]["version"], token_base)
    for s in good:
        add_span(out, s["version"], int(s.get("end", 0)) - int(s.get("start", 0)))
    return out
