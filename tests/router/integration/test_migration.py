"""Request migration against real workers: kill -9 the worker serving a stream after 10 tokens
and the client still receives exactly the tokens and text of an uninterrupted greedy run; an
admin's migrate moves a live stream the same way (a structured output's too, regenerated from
its original request; an unseeded sampled one ends with a clear error instead); a worker that
refuses connections is taken out of routing at once and put back when it answers again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from loom_runtime.testing.processes import free_ports, post

MODEL = "tiny-router"
MAX_TOKENS = 24
NO_SESSIONS = {"sessionAffinity": {"enabled": False}}
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {"prompt": "The history of the old lighthouse " * 6}),
    "chat": (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "You are a storyteller."},
                {"role": "user", "content": "Tell me about the sea " * 4},
            ]
        },
    ),
}


def request_body(kind: str, **more: Any) -> tuple[str, dict[str, Any]]:
    path, extra = REQUESTS[kind]
    body = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
        **more,
    }
    return path, body


def reference(worker: Any, kind: str, **more: Any) -> tuple[list[int], str]:
    path, body = request_body(kind, **more)
    status, answer, _ = post(worker.url + path, body)
    assert status == 200, answer
    choice = answer["choices"][0]
    text = choice["text"] if kind == "completion" else choice["message"]["content"]
    return choice["token_ids"], text


@pytest.fixture(scope="module")
def survivor(launch_worker: Any) -> Iterator[Any]:
    with launch_worker("survivor") as worker:
        yield worker


@pytest.fixture(scope="module")
def mover(launch_worker: Any) -> Iterator[Any]:
    """A worker whose requests an admin moves away (it stays up)."""
    with launch_worker("mover") as worker:
        yield worker


def start_on(router: Any, victim: Any, kind: str, **more: Any) -> Any:
    """A stream that starts on `victim` (the survivor is drained while it is picked)."""
    assert router.admin("POST", "/admin/endpoints/survivor/drain")[0] == 200
    path, body = request_body(kind, stream_options={"include_usage": True}, **more)
    stream = router.stream(path, body)
    assert stream.status == 200 and stream.headers["x-loom-endpoint"] == victim.id
    assert router.admin("POST", "/admin/endpoints/survivor/undrain")[0] == 200
    return stream


def read(stream: Any, kind: str, after_10: Any) -> tuple[list[int], str, dict[str, Any], str]:
    tokens: list[int] = []
    text, usage, reason = "", {}, ""
    for event in stream.events():
        if not event["choices"]:
            usage = event["usage"]
            continue
        choice = event["choices"][0]
        before = len(tokens)
        tokens += choice["token_ids"]
        text += choice["text"] if kind == "completion" else choice["delta"].get("content", "")
        reason = choice["finish_reason"] or reason
        if before < 10 <= len(tokens):
            after_10()
    stream.close()
    return tokens, text, usage, reason


def migrated_after_3(router: Any, stream: Any) -> list[dict[str, Any]]:
    """A stream's events, the mover's requests migrated after the third."""
    events: list[dict[str, Any]] = []
    for event in stream.events():
        events.append(event)
        if len(events) == 3:
            router.admin("POST", "/admin/endpoints/mover/migrate")
    stream.close()
    return events


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_killing_the_worker_mid_stream_loses_and_repeats_no_token(
    kind: str, survivor: Any, launch_worker: Any, launch_router: Any
) -> None:
    want_tokens, want_text = reference(survivor, kind)
    assert len(want_tokens) == MAX_TOKENS
    with (
        launch_worker(f"victim-{kind}") as victim,
        launch_router([survivor, victim], router=NO_SESSIONS) as router,
    ):
        stream = start_on(router, victim, kind)
        tokens, text, usage, reason = read(stream, kind, victim.proc.kill)
        assert tokens == want_tokens
        assert text == want_text
        assert reason == "length"
        assert usage["completion_tokens"] == MAX_TOKENS
        assert usage["total_tokens"] == usage["prompt_tokens"] + MAX_TOKENS
        assert any(
            c.startswith(f"loom-migrated from={victim.id} to=survivor") for c in stream.comments
        )
        assert router.metric("loom_router:migrations_total", outcome="resumed") == 1
        router.wait(lambda: router.endpoints()[victim.id]["down"], "the victim marked down")
        assert router.endpoints()[victim.id]["down_by_router"]


def test_an_admin_migrate_moves_a_live_stream_exactly(
    survivor: Any, mover: Any, launch_router: Any
) -> None:
    want_tokens, want_text = reference(survivor, "completion")
    with launch_router([survivor, mover], router=NO_SESSIONS) as router:
        stream = start_on(router, mover, "completion")
        done: list[Any] = []

        def migrate() -> None:
            done.append(router.admin("POST", "/admin/endpoints/mover/migrate"))

        tokens, text, _, _ = read(stream, "completion", migrate)
        assert done[0][0] == 200 and done[0][1]["migrated"] == 1
        assert tokens == want_tokens and text == want_text
        assert router.metric("loom_router:migrations_total", outcome="resumed") == 1
        assert not router.endpoints()["mover"]["down"]  # moved away, not failed
    # With failover.migrationLimit 0 the same move ends the stream with a clear error.
    with launch_router(
        [survivor, mover], router=NO_SESSIONS, failover={"migrationLimit": 0}
    ) as router:
        events = migrated_after_3(router, start_on(router, mover, "completion"))
        assert events[-1]["error"]["code"] == "migration_failed"
        assert "migrationLimit 0" in events[-1]["error"]["message"]


LETTERS = {"structured_outputs": {"regex": "[a-z ]{60,120}"}}


def test_an_admin_migrate_regenerates_a_greedy_structured_stream_exactly(
    survivor: Any, mover: Any, launch_router: Any
) -> None:
    want_tokens, want_text = reference(survivor, "completion", **LETTERS)
    assert len(want_tokens) > 10 and set(want_text) <= set("abcdefghijklmnopqrstuvwxyz ")
    with launch_router([survivor, mover], router=NO_SESSIONS) as router:
        stream = start_on(router, mover, "completion", **LETTERS)
        moved: list[Any] = []
        tokens, text, _, _ = read(stream, "completion", lambda: moved.append(
            router.admin("POST", "/admin/endpoints/mover/migrate")))  # fmt: skip
        assert moved[0][1]["migrated"] == 1
        assert tokens == want_tokens and text == want_text
        assert router.metric("loom_router:migrations_total", outcome="restarted") == 1
        # sampled without a seed, the regenerated output would differ: a clear error instead
        stream = start_on(router, mover, "completion", temperature=1.0, **LETTERS)
        events = migrated_after_3(router, stream)
        assert events[-1]["error"]["code"] == "migration_failed"
        assert "structured output sampled without a seed" in events[-1]["error"]["message"]


def test_a_non_streamed_request_moved_away_is_answered_whole(
    survivor: Any, mover: Any, launch_router: Any
) -> None:
    path, body = request_body("completion", max_tokens=80)
    status, want, _ = post(survivor.url + path, body)
    assert status == 200
    with launch_router([survivor, mover], router=NO_SESSIONS) as router:
        assert router.admin("POST", "/admin/endpoints/survivor/drain")[0] == 200
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(router.post(path, body)))
        thread.start()
        router.wait(lambda: router.endpoints()["mover"]["in_flight"] == 1, "the request on mover")
        assert router.admin("POST", "/admin/endpoints/survivor/undrain")[0] == 200
        assert router.admin("POST", "/admin/endpoints/mover/migrate")[1]["migrated"] == 1
        thread.join(120)
        status, answer, headers = result[0]
        assert status == 200 and headers["x-loom-endpoint"] == "survivor"
        assert headers["x-loom-migrated"].startswith("from mover")
        assert answer["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
        assert router.metric("loom_router:migrations_total", outcome="restarted") == 1


def test_a_refusing_worker_is_marked_down_at_once_and_back_up_when_it_answers(
    survivor: Any, launch_worker: Any, launch_router: Any
) -> None:
    (port,) = free_ports(1)
    late = {
        "id": "late",
        "url": f"http://127.0.0.1:{port}",
        "role": "aggregated",
        "weights_version": "v1",
        "kv_events": None,
        "kv_replay": None,
    }
    with launch_router([survivor], router=NO_SESSIONS) as router:
        status, doc = router.admin(
            "PUT", "/admin/endpoints/late", {k: v for k, v in late.items() if k != "id"}
        )
        assert status == 201 and not doc["down"]
        router.wait(lambda: router.endpoints()["late"]["down_by_router"], "late marked down")
        for _ in range(4):  # nothing goes to it while it is down
            status, _, headers = router.post(*request_body("completion", max_tokens=2))
            assert status == 200 and headers["x-loom-endpoint"] == "survivor"
        with launch_worker("late", http_port=port):
            router.wait(lambda: not router.endpoints()["late"]["down"], "late back up", 60)
            assert (
                router.metric("loom_router:marked_down_total", endpoint="late", cause="refused")
                == 1
            )


def test_an_admin_migrate_continues_a_sampled_streams_behaviour_record_exactly(
    survivor: Any, mover: Any, launch_router: Any
) -> None:
    """Sampled without a seed: the worker's reported seed lets the replay regenerate the tokens
    and log-probs the client has, so the record the client assembles is the one an
    uninterrupted request with that seed answers."""
    record = {"temperature": 1.0, "return_behaviour": True, "return_token_ids": False}
    with launch_router([survivor, mover], router=NO_SESSIONS) as router:
        stream = start_on(router, mover, "completion", **record)
        moved: list[Any] = []
        tokens: list[int] = []
        logprobs: list[float] = []
        seeds: set[int] = set()
        spans: list[Any] = []
        for event in stream.events():
            for choice in event["choices"]:
                before = len(tokens)
                tokens += choice["token_ids"]
                logprobs += choice["behaviour"]["logprobs"]
                seeds.add(choice["behaviour"]["seed"])
                spans = choice.get("weight_versions", spans)
                if before < 10 <= len(tokens):
                    moved.append(router.admin("POST", "/admin/endpoints/mover/migrate"))
        stream.close()
        assert moved[0][1]["migrated"] == 1
        assert router.metric("loom_router:migrations_total", outcome="restarted") == 1
    (seed,) = seeds
    path, body = request_body("completion", **record, seed=seed)
    status, answer, _ = post(survivor.url + path, body)
    assert status == 200, answer
    want = answer["choices"][0]
    assert tokens == want["token_ids"] and len(tokens) == MAX_TOKENS
    assert logprobs == want["behaviour"]["logprobs"]
    assert spans == want["weight_versions"] == [{"version": "v1", "start": 0, "end": MAX_TOKENS}]
