"""A behaviour record on a choice: vLLM's `weight_versions` spans and Loom's `behaviour` object
(the seed and each output token's log-prob under the distribution it was drawn from).

Owns those JSON shapes and the request fields that ask for them; never computes a log-prob (the
engine's sampler does) and never decides which chunk carries what (the server and the router's
stream tracker do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REQUEST_FIELD = "return_behaviour"
"""Loom's request field: true asks for the whole record (implies return_token_ids and
return_weight_versions)."""
CHOICE_FIELD = "behaviour"
"""Loom's choice field: {"seed": int | null, "logprobs": [float, ...]}."""
VERSIONS_FIELD = "weight_versions"
"""vLLM's choice field (return_weight_versions): [{"version", "start", "end"}] over the output."""


@dataclass(frozen=True)
class RecordAsk:
    """What a request asked of the record: vLLM's weight-version spans, Loom's behaviour."""

    versions: bool = False
    behaviour: bool = False

    @staticmethod
    def of(body: Mapping[str, Any]) -> RecordAsk:
        """From a client body (the router's view): return_behaviour, return_weight_versions."""
        behaviour = body.get(REQUEST_FIELD) is True
        return RecordAsk(behaviour or body.get("return_weight_versions") is True, behaviour)

    @property
    def any(self) -> bool:
        return self.versions or self.behaviour


NO_RECORD = RecordAsk()
"""A request that asked for no part of the record."""


def add_span(spans: list[dict[str, Any]], version: str, count: int) -> None:
    """Extend vLLM's `weight_versions` by `count` output tokens sampled by `version` (joined to
    the last span when it is the same version)."""
    if count <= 0:
        return
    if spans and spans[-1]["version"] == version:
        spans[-1]["end"] += count
        return
    start = spans[-1]["end"] if spans else 0
    spans.append({"version": version, "start": start, "end": start + count})


def behaviour_object(seed: int | None, logprobs: Sequence[float]) -> dict[str, Any]:
    """Loom's `behaviour` of a choice (whole) or of a chunk (its new tokens' log-probs)."""
    return {"seed": seed, "logprobs": list(logprobs)}


def record_fields(
    ask: RecordAsk,
    seed: int | None,
    logprobs: Sequence[float],
    spans: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """The record's fields of a choice: `behaviour` when asked, `weight_versions` when asked and
    `spans` is given (a stream gives them on its last chunk only, as vLLM does)."""
    out: dict[str, Any] = {}
    if ask.behaviour:
        out[CHOICE_FIELD] = behaviour_object(seed, logprobs)
    if ask.versions and spans is not None:
        out[VERSIONS_FIELD] = [dict(s) for s in spans]
    return out
