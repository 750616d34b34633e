"""Fuzzing the OpenAI routes of a live worker and a live P/D router with generated bodies (valid,
boundary, wrong-typed, nested junk, raw bytes): never a 5xx, every 4xx an OpenAI error object,
and afterwards the KV pools whole, nothing in flight, and both still answering.

LOOM_FUZZ_EXAMPLES sets the examples per test (CI: the default; `make fuzz`: ten times more).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loom_runtime.testing.processes import poll

MODEL = "tiny-router"
VOCAB = 4142  # the tiny checkpoint's vocabulary
EXAMPLES = int(os.environ.get("LOOM_FUZZ_EXAMPLES", "30"))  # `make fuzz`: 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PATHS = ("/v1/completions", "/v1/chat/completions")

# --- strategies --------------------------------------------------------------------------------

BIG_INTS = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**23, -(10**23)])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), BIG_INTS,
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)  # fmt: skip
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
TEXT = st.text(max_size=40)
TOKEN_IDS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)
BOUNDARY_IDS = st.lists(st.one_of(st.integers(-2, VOCAB + 2), BIG_INTS), min_size=0, max_size=6)
PROMPT = st.one_of(
    TEXT, TOKEN_IDS, BOUNDARY_IDS, st.lists(TEXT, max_size=3), st.lists(TOKEN_IDS, max_size=2),
    st.builds(lambda ids: [ids], TOKEN_IDS), st.just(""), st.just([]), st.just(5), JUNK,
)  # fmt: skip
TEXT_PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": TEXT})
GOOD_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
     "content": st.one_of(TEXT, st.lists(TEXT_PART, max_size=3))},
    optional={"name": TEXT, "tool_calls": JUNK},
)  # fmt: skip
MESSAGE = st.one_of(
    GOOD_MESSAGE,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "tool"]),
         "content": st.one_of(TEXT, st.lists(PART, max_size=3))},
        optional={"name": st.one_of(TEXT, JUNK)},
    ),
    st.fixed_dictionaries({"role": JUNK, "content": JUNK}),
    JUNK,
)  # fmt: skip
MESSAGES = st.one_of(st.lists(MESSAGE, min_size=1, max_size=4), st.just([]), JUNK)


SMALL_MAX = st.integers(1, 6)  # valid outputs stay short: the fuzz is about inputs
STREAM_OPTIONS = st.fixed_dictionaries(
    {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
)
VALID: dict[str, st.SearchStrategy[Any]] = {
    # field -> values Loom serves (the wild ones come from BIG_INTS and JUNK)
    "max_tokens": SMALL_MAX,
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, VOCAB + 2),
    "min_p": st.just(0.0),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "stop": st.one_of(st.none(), st.text(min_size=1, max_size=4), st.lists(TEXT, max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=4),
    "ignore_eos": st.booleans(),
    "min_tokens": st.just(0),
    "repetition_penalty": st.just(1.0),
    "skip_special_tokens": st.just(True),
    "spaces_between_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.just(False),
    "stream": st.booleans(),
    "stream_options": STREAM_OPTIONS,
    "n": st.just(1),
    "presence_penalty": st.just(0.0),
    "logit_bias": st.none(),
    "logprobs": st.one_of(st.none(), st.integers(0, 5)),
    "return_token_ids": st.booleans(),
    "user": TEXT,
    "kv_transfer_params": st.none(),  # wild values only: never a live lease
    "frobnicate": JUNK,  # a field no one defines: ignored and named
}
WILD = st.one_of(BIG_INTS, JUNK)


@st.composite
def bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A valid body, one with a single field off (boundary or junk), or one where anything
    goes, in equal measure."""
    mode = draw(st.sampled_from(["valid", "one_off", "anything"]))
    names = sorted(draw(st.sets(st.sampled_from(sorted(VALID)), max_size=6)))
    prompt_key = "prompt" if path == PATHS[0] else "messages"
    bad = draw(st.sampled_from(["model", prompt_key, *names])) if mode == "one_off" else None

    def value(name: str, valid: st.SearchStrategy[Any]) -> Any:
        wild = mode == "anything" or name == bad
        return draw(st.one_of(valid, WILD) if wild else valid)

    body: dict[str, Any] = {"model": value("model", st.just(MODEL))}
    if path == PATHS[0]:
        body["prompt"] = value("prompt", st.one_of(TEXT.filter(bool), TOKEN_IDS))
        if mode == "anything":
            body["prompt"] = draw(PROMPT)
    else:
        body["messages"] = value("messages", st.lists(GOOD_MESSAGE, min_size=1, max_size=3))
        if mode == "anything":
            body["messages"] = draw(MESSAGES)
        body["max_tokens"] = draw(SMALL_MAX)  # without it a chat runs to the context's end
    for name in names:
        body[name] = value(name, VALID[name])
    if path == PATHS[1] and not (isinstance(body["max_tokens"], int) and body["max_tokens"] < 8):
        body["max_completion_tokens"] = draw(SMALL_MAX)
    return body


RAW = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"null", b"[1]", b'"x"', b"{", b'{"prompt": "\\ud800"}',
                     b'{"model": "tiny-router", "prompt": "\xff\xfe"}', b"\xef\xbb\xbf{}"]),
)  # fmt: skip


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


# --- the live fleet ----------------------------------------------------------------------------

PD = {"disaggregation": {"minUncachedTokens": 8}, "sessionAffinity": {"enabled": False}}


@pytest.fixture(scope="module")
def fleet(launch_worker: Any, launch_router: Any) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        tcp = ("--kv-connector", "tcp", "--num-blocks", "128")
        prefill = stack.enter_context(launch_worker("prefill", "prefill", *tcp))
        decode = stack.enter_context(launch_worker("decode", "decode", *tcp))
        router = stack.enter_context(launch_router([prefill, decode], router=PD))
        router.wait_fresh(["prefill", "decode"])
        yield {"prefill": prefill, "decode": decode, "router": router}


def _settled(fleet: dict[str, Any], base_url: str) -> None:
    """Nothing in flight, every KV block back (no lease, no pull), and `base_url` answers."""
    for worker in (fleet["prefill"], fleet["decode"]):
        idle = lambda w=worker: w.counter("loom:in_flight_requests") == 0  # noqa: E731
        poll(idle, 60, f"{worker.id} to have nothing in flight")
        poll(worker.proc.pool_whole, 60, f"{worker.id}'s KV pool to be whole")
    data = _encode({"model": MODEL, "prompt": "still there?", "max_tokens": 2})
    status, raw, _ = _send(base_url, PATHS[0], data)
    assert status == 200, raw


def _send(base_url: str, path: str, data: bytes) -> tuple[int, bytes, str]:
    req = urllib.request.Request(base_url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("content-type", "")


def _check(status: int, raw: bytes, kind: str, sent: bytes) -> None:
    """The invariants of one answer (`sent` is shown when one breaks)."""
    event(f"HTTP {status}")  # --hypothesis-show-statistics: how often each answer came
    assert status < 500, (status, raw[:500], sent[:500])
    if status >= 400:
        body = json.loads(raw)
        assert set(body) == {"error"}, (status, body, sent[:500])
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, (error, sent[:500])
        assert isinstance(error["message"], str) and error["message"], (error, sent[:500])
        assert error["param"] is None or isinstance(error["param"], str), (error, sent[:500])
        return
    assert status == 200, (status, raw[:500], sent[:500])
    if kind.startswith("text/event-stream"):
        events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
        assert events and events[-1] == b"[DONE]", (raw[-300:], sent[:500])
        for data in events[:-1]:
            assert "error" not in json.loads(data), (data, sent[:500])
    else:
        assert "choices" in json.loads(raw), (raw[:500], sent[:500])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("target", ["router", "decode"])
def test_generated_bodies_never_get_a_5xx(fleet: dict[str, Any], target: str, path: str) -> None:
    base_url = fleet[target].url

    @FUZZ
    @given(body=bodies(path))
    def run(body: dict[str, Any]) -> None:
        data = _encode(body)
        _check(*_send(base_url, path, data), data)

    run()
    _settled(fleet, base_url)


@pytest.mark.parametrize("target", ["router", "decode"])
def test_raw_bytes_never_get_a_5xx(fleet: dict[str, Any], target: str) -> None:
    base_url = fleet[target].url

    @FUZZ
    @given(data=RAW, path=st.sampled_from(PATHS))
    def run(data: bytes, path: str) -> None:
        _check(*_send(base_url, path, data), data)

    run()
    _settled(fleet, base_url)
