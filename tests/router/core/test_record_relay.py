"""A behaviour record across request migration: a record stream restarts its original request
with the seed its record reported (never from a token boundary), the tokens and log-probs the
client has are dropped from the replay's chunks, and weight_versions land on the client's token
positions."""

from __future__ import annotations

from typing import Any

from loom_router.core.migration import StreamTracker, first_attempt
from loom_router.core.record_relay import relayed_fields, seeded_replay, shifted_spans
from loom_runtime.wire.openai.behaviour import RecordAsk

HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
        "system_fingerprint": "v1"}  # fmt: skip
PROMPT = [1, 2, 3]
RECORD = {"model": "m", "prompt": "p", "max_tokens": 4, "temperature": 1.0,
          "return_behaviour": True}  # fmt: skip


def cmpl(
    text: str,
    ids: list[int],
    lps: list[float],
    seed: int | None = 77,
    reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
              "token_ids": ids, "behaviour": {"seed": seed, "logprobs": lps}, **extra}  # fmt: skip
    return {**HEAD, "choices": [choice]}


def feed(tracker: StreamTracker, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [out for e in events if (out := tracker.take(e)) is not None]


def started(body: dict[str, Any]) -> StreamTracker:
    tracker = StreamTracker("completion", body)
    tracker.begin(first_attempt("/v1/completions", body, "completion"))
    return tracker


def test_a_record_stream_restarts_its_original_with_the_reported_seed() -> None:
    t = started(RECORD)
    sent = feed(t, [cmpl("A", [10], [-1.0], prompt_token_ids=PROMPT), cmpl("B", [11], [-2.0])])
    assert [c["choices"][0]["behaviour"]["logprobs"] for c in sent] == [[-1.0], [-2.0]]
    assert sent[0]["choices"][0]["prompt_token_ids"] == PROMPT  # the record implies the ids
    attempt = t.replay("/v1/completions", RECORD)
    assert attempt.body["prompt"] == "p" and attempt.body["seed"] == 77
    assert attempt.token_base == 0 and (attempt.skip_tokens, attempt.expected) == (2, (10, 11))
    t.begin(attempt)
    spans = [{"version": "v1", "start": 0, "end": 4}]
    out = feed(t, [cmpl("AB", [10, 11], [-1.0, -2.0]), cmpl("C", [12], [-3.0]),
                   cmpl("D", [13], [-4.0], reason="length", weight_versions=spans)])  # fmt: skip
    choices = [c["choices"][0] for c in out]
    assert [c["token_ids"] for c in choices] == [[12], [13]]
    assert [c["behaviour"] for c in choices] == [{"seed": 77, "logprobs": [-3.0]},
                                                {"seed": 77, "logprobs": [-4.0]}]  # fmt: skip
    assert choices[-1]["weight_versions"] == spans and not t.diverged
    assert t.tokens == [10, 11, 12, 13]


def test_a_client_seed_is_kept_and_a_greedy_record_needs_none() -> None:
    assert seeded_replay({**RECORD, "seed": 5}, RecordAsk(True, True), 77)["seed"] == 5
    assert "seed" not in seeded_replay(RECORD, RecordAsk(True, False), 77)
    t = started({**RECORD, "temperature": 0})
    feed(t, [cmpl("A", [10], [0.0], seed=None, prompt_token_ids=PROMPT)])
    attempt = t.replay("/v1/completions", {**RECORD, "temperature": 0})
    assert "seed" not in attempt.body and attempt.token_base == 0


def test_weight_versions_alone_resume_from_a_boundary_at_the_clients_positions() -> None:
    body = {**RECORD, "return_behaviour": False, "return_weight_versions": True}
    t = started(body)
    feed(t, [cmpl("A", [10], [], prompt_token_ids=PROMPT), cmpl("B", [11], [])])
    attempt = t.replay("/v1/completions", body)
    assert attempt.token_base == 2  # prompt + tokens so far, as without a record
    t.begin(attempt)
    one = [{"version": "v1", "start": 0, "end": 1}]
    (last,) = feed(t, [cmpl("C", [12], [], reason="length", weight_versions=one)])
    assert last["choices"][0]["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]
    assert "behaviour" not in last["choices"][0]


def test_spans_shift_to_the_client_and_the_skipped_log_probs_go() -> None:
    spans = [{"version": "v1", "start": 0, "end": 2}, {"version": "v2", "start": 2, "end": 3}]
    assert shifted_spans(spans, 0) == spans
    assert shifted_spans(spans, 4) == [{"version": "v1", "start": 0, "end": 6},
                                       {"version": "v2", "start": 6, "end": 7}]  # fmt: skip
    choice = {"behaviour": {"seed": 3, "logprobs": [-1.0, -2.0, -3.0]}, "weight_versions": spans}
    fields = relayed_fields(choice, RecordAsk(True, True), 2, 0)
    assert fields == {"behaviour": {"seed": 3, "logprobs": [-3.0]}, "weight_versions": spans}
    assert relayed_fields(choice, RecordAsk(), 2, 0) == {}
