"""The behaviour record's JSON: vLLM's weight_versions spans, Loom's behaviour object, and what a
body asks for."""

from __future__ import annotations

from typing import Any

from loom_runtime.wire.openai.behaviour import RecordAsk, add_span, record_fields


def test_spans_join_the_same_version_and_start_where_the_last_ended() -> None:
    spans: list[dict[str, Any]] = []
    for version, count in [("v1", 2), ("v1", 3), ("v2", 1), ("v2", 0), ("v1", 4)]:
        add_span(spans, version, count)
    assert spans == [
        {"version": "v1", "start": 0, "end": 5},
        {"version": "v2", "start": 5, "end": 6},
        {"version": "v1", "start": 6, "end": 10},
    ]


def test_return_behaviour_asks_for_everything_and_weight_versions_alone_for_spans() -> None:
    assert RecordAsk.of({"return_behaviour": True}) == RecordAsk(True, True)
    assert RecordAsk.of({"return_weight_versions": True}) == RecordAsk(True, False)
    assert not RecordAsk.of({"return_behaviour": "yes"}).any
    assert not RecordAsk.of({}).any


def test_record_fields_hold_only_what_was_asked_and_spans_when_given() -> None:
    spans = [{"version": "v1", "start": 0, "end": 2}]
    both = record_fields(RecordAsk(True, True), 7, [-1.0, -2.0], spans)
    assert both == {"behaviour": {"seed": 7, "logprobs": [-1.0, -2.0]}, "weight_versions": spans}
    assert record_fields(RecordAsk(True, True), 7, [-1.0], None) == {
        "behaviour": {"seed": 7, "logprobs": [-1.0]}
    }
    assert record_fields(RecordAsk(True, False), None, [], spans) == {"weight_versions": spans}
    assert record_fields(RecordAsk(), 7, [-1.0], spans) == {}
