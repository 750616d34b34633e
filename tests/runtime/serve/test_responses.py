"""Response shapes: usage with cached_tokens, version as system_fingerprint, logprobs forms."""

from __future__ import annotations

from loom_runtime.engine.types import RequestOutput
from loom_runtime.serve.responses import Accumulated
from loom_runtime.wire.openai.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from loom_runtime.wire.openai.response import ResponseMeta, chunk, usage_chunk

META = ResponseMeta(id="cmpl-1", created=1, model="tiny", weights_version="v2")


def _outputs() -> list[RequestOutput]:
    return [
        RequestOutput("r", (5,), "he", num_prompt_tokens=40, num_cached_tokens=32,
                      num_output_tokens=1, weights_version="v2"),
        RequestOutput("r", (6,), "llo", finished=True, finish_reason="length",
                      num_prompt_tokens=40, num_cached_tokens=32, num_output_tokens=2,
                      weights_version="v2"),
    ]  # fmt: skip


def test_full_bodies_carry_text_usage_cached_tokens_and_version() -> None:
    acc = Accumulated()
    for out in _outputs():
        acc.add(out)
    chat = acc.body("chat", META, None)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["system_fingerprint"] == "v2"
    assert chat["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    text = acc.body("completion", META, None)
    assert text["object"] == "text_completion"
    assert text["choices"][0]["text"] == "hello"


def test_chunks_have_deltas_and_the_usage_chunk_has_no_choices() -> None:
    first = chunk("chat", META.chunk_head("chat"), "", None, None, True, role=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] is None
    last = chunk("chat", META.chunk_head("chat"), "x", None, "stop", False)
    assert last["choices"][0] == {"index": 0, "logprobs": None, "finish_reason": "stop",
                                  "delta": {"content": "x"}}  # fmt: skip
    assert "usage" not in last
    acc = Accumulated()
    acc.add(_outputs()[1])
    tail = usage_chunk(META.chunk_head("completion"), acc.usage())
    assert tail["choices"] == []
    assert tail["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


def test_logprobs_in_both_openai_forms() -> None:
    entries = [TokenLogprob(5, -0.5, ((5, -0.5), (7, -1.0))), TokenLogprob(6, -0.25)]
    text = {5: "he", 6: "llo", 7: "ha"}.__getitem__
    legacy = completion_logprobs(entries, text, offset=3)
    assert legacy == {
        "tokens": ["he", "llo"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"he": -0.5, "ha": -1.0}, {}],
        "text_offset": [3, 5],
    }
    chat = chat_logprobs(entries, text)
    assert chat["content"][0]["token"] == "he"
    assert chat["content"][0]["bytes"] == list(b"he")
    assert [t["token"] for t in chat["content"][0]["top_logprobs"]] == ["he", "ha"]
