"""The proxy shell against a real worker: request ids, API keys, errors passed through with
their status, /v1/models, /health, /ready, /metrics, and a client that leaves cancelling the
worker's work."""

from __future__ import annotations

from typing import Any

import pytest

MODEL = "tiny-router"


def body(**more: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, **more}


def test_request_ids_are_kept_forwarded_and_made_up_when_absent(router: Any) -> None:
    status, answer, headers = router.post("/v1/completions", body(), {"x-request-id": "trace-42"})
    assert status == 200 and headers["x-request-id"] == "trace-42"
    assert "trace-42" in answer["id"]  # the worker saw the same id
    status, _, headers = router.post("/v1/completions", body())
    assert status == 200 and headers["x-request-id"].startswith("rtr-")
    assert headers["x-loom-endpoint"] == "w0" and headers["x-loom-weights-version"] == "v1"


def test_worker_errors_pass_through_with_their_status(router: Any) -> None:
    status, answer, _ = router.post("/v1/completions", body(model="nope"))
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    status, answer, _ = router.post(
        "/v1/chat/completions", {"model": MODEL, "messages": [], "stream": True}
    )
    assert status == 400 and "at least one message" in answer["error"]["message"]
    status, answer, _ = router.post("/v1/completions", body(n=0))
    assert status == 400 and answer["error"]["param"] == "n"


def test_the_router_refuses_what_it_cannot_route(router: Any, launch_router: Any) -> None:
    status, answer, headers = router.post("/v1/completions", "not json")
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert headers["x-request-id"]
    status, answer, _ = router.get("/v1/nothing")
    assert status == 404 and "error" in answer
    with launch_router([]) as empty:
        assert empty.get("/ready")[0] == 503
        status, answer, _ = empty.post("/v1/completions", body())
        assert status == 503 and answer["error"]["code"] == "no_endpoint"
        assert "no decode or aggregated endpoint" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("path", "sent", "param", "words"),
    [
        ("/v1/completions", {"prompt": 5}, "prompt", "string or a list of token ids"),
        ("/v1/completions", {"prompt": [-5]}, "prompt", "non-negative integers"),
        ("/v1/completions", {"prompt": [[1], [-2]]}, "prompt", "(prompt 1)"),
        ("/v1/chat/completions", {"messages": [5]}, "messages[0]", "an object"),
        ("/v1/chat/completions", {"messages": None}, "messages", "array"),
    ],
)
def test_unroutable_prompts_get_a_400_naming_the_field(
    router: Any, path: str, sent: dict[str, Any], param: str, words: str
) -> None:
    """Finding 2: `prompt: 5` and `prompt: [-5]` were 500s (the router crashed reading them);
    `messages: [5]` said the body was not a JSON object."""
    status, answer, _ = router.post(path, {"model": MODEL, "max_tokens": 2, **sent})
    assert status == 400, answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"]
    assert answer["error"]["type"] == "invalid_request_error"
    assert "JSON object" not in answer["error"]["message"]


def test_vllm_fields_pass_through_and_ignored_ones_are_named(router: Any) -> None:
    status, _, headers = router.post("/v1/completions", body(frobnicate=1, top_k=3, seed=7))
    assert status == 200 and headers["x-loom-ignored-fields"] == "frobnicate"
    options = {"include_usage": True, "continuous_usage_stats": True}
    stream = router.stream("/v1/completions", body(stream_options=options, ignore_eos=True))
    events = list(stream.events())
    stream.close()
    assert stream.status == 200 and events
    assert all(isinstance(e.get("usage"), dict) for e in events), events
    assert events[-1]["usage"]["completion_tokens"] == 3


def test_models_health_ready_and_metrics(router: Any) -> None:
    status, models, _ = router.get("/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [MODEL]
    assert router.get("/health")[0] == 200
    status, ready, _ = router.get("/ready")
    assert status == 200 and ready["endpoints"] == 1
    router.post("/v1/completions", body())
    metrics = router.metrics()
    assert metrics['loom_router:requests_total{code="200",route="completions"}'] >= 1
    assert any(k.startswith('loom_router:routed_total{endpoint="w0"') for k in metrics)
    assert 'loom_router:index_entries{index="precise"}' in metrics
    assert 'loom_router:index_entries{index="in_flight"}' in metrics  # one router: the record is on
    assert "loom_router:session_evictions_total" in metrics  # every bounded table is counted
    router.wait_fresh(["w0"])
    assert metrics.get("loom_router:time_to_first_token_seconds_count", 0) >= 1


def test_a_router_that_scales_from_zero_is_ready_with_no_worker_and_holds_then_503s(
    launch_router: Any,
) -> None:
    hold = {"hold": {"maxRequests": 4, "timeoutSeconds": 1}}
    with launch_router([], router=hold, config={"scale_from_zero": True}) as empty:
        status, ready, _ = empty.get("/ready")
        assert status == 200 and ready["endpoints"] == 0 and "scale from zero" in ready["holding"]
        status, answer, headers = empty.post("/v1/completions", body())
        assert status == 503 and "retry-after" in headers, answer  # held 1 s, then refused
    with launch_router([], router=hold) as plain:
        assert plain.get("/ready")[0] == 503  # nothing to hold for: not ready


def test_api_keys_guard_the_openai_routes_only(worker: Any, launch_router: Any) -> None:
    with launch_router([worker], flags=("--api-key", "k1", "--api-key", "k2")) as keyed:
        status, answer, _ = keyed.post("/v1/completions", body())
        assert status == 401 and answer["error"]["type"] == "authentication_error"
        assert keyed.post("/v1/completions", body(), {"Authorization": "Bearer k3"})[0] == 401
        assert keyed.post("/v1/completions", body(), {"Authorization": "Bearer k2"})[0] == 200
        assert keyed.get("/v1/models")[0] == 401
        assert keyed.get("/health")[0] == 200 and keyed.get("/metrics")[0] == 200


def test_a_body_over_max_body_bytes_gets_413(worker: Any, launch_router: Any) -> None:
    with launch_router([worker], flags=("--max-body-bytes", "4096")) as small:
        status, answer, _ = small.post("/v1/completions", body(prompt="x" * 8192))
        assert status == 413 and "error" in answer
        assert small.post("/v1/completions", body())[0] == 200  # under the limit: served


def test_a_client_that_leaves_cancels_the_workers_work(worker: Any, router: Any) -> None:
    aborted = worker.counter("vllm:request_success_total")
    before = worker.counter("vllm:generation_tokens_total")
    stream = router.stream("/v1/completions", body(max_tokens=1500, ignore_eos=True))
    for i, _ in enumerate(stream.events()):
        if i == 3:
            break
    stream.close()
    router.wait(
        lambda: worker.counter("loom:in_flight_requests") == 0, "the worker to drop the request"
    )
    assert worker.counter("vllm:generation_tokens_total") - before < 1500
    done = worker.proc.metrics()
    abort_key = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'
    assert done.get(abort_key, 0) >= 1 and worker.counter("vllm:request_success_total") > aborted
    router.wait(
        lambda: router.metric("loom_router:client_disconnects_total") >= 1,
        "the router to count the disconnect",
    )
