"""The AR-decode loop on the production step (a batcher driving it, the TokenForward
executor running its plans): its plans, chunked prefill, stop rules and streaming text, with
every bit of per-request state in its state object; and the text rules (stop strings and ids,
min_tokens, include_stop_str_in_output, skip_special_tokens) on a one-character-per-token
decoder."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState, CompletedRequest
from loom_runtime.engine.sampler import SampledToken
from loom_runtime.engine.token_forward import TokenResult
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.loop.contract import Done, LoopContext
from loom_runtime.models.loader import LoadedModel
from loom_runtime.wire.prefix_hash import PrefixHasher

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]
Plain = Callable[[EngineRequest], CompletedRequest]
MakeLoop = Callable[..., Any]  # conftest.build_loop -> LoopRig


def test_plans_are_one_prefill_then_one_decode_per_token(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy
) -> None:
    rig = make_loop(tiny64, num_blocks=8)
    req = EngineRequest("r", prompt(20, 1), greedy(5))
    first = rig.run_alone(req)
    plans = [plan for plan, _ in rig.executed]
    second = rig.run_alone(req)
    assert [p.kind for p in plans] == ["prefill_chunk"] + ["decode_token"] * 4
    assert [p.resources.compute_tokens for p in plans] == [20, 1, 1, 1, 1]
    assert len(first.output_token_ids) == 5 and first.finish_reason == "length"
    assert first.output_token_ids == second.output_token_ids  # greedy is deterministic
    assert rig.loop.kv.pool.is_whole()


def test_prefill_split_into_chunks_gives_the_same_tokens(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    req = EngineRequest("r", prompt(45, 2), greedy(6))
    rig = make_loop(tiny64, num_blocks=4)
    out = rig.run_alone(req, token_budget=16)
    chunk_sizes = [plan.resources.compute_tokens for plan, _ in rig.executed]
    assert chunk_sizes == [16, 16, 13, 1, 1, 1, 1, 1]
    # only a chunk that reaches the end of the sequence (not narrower than its plan) samples
    assert [result.sampled is None for _, result in rig.executed] == [True, True] + [False] * 6
    assert out.output_token_ids == plain(req).output_token_ids


def test_eos_stops_unless_ignored_and_the_token_is_kept(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    p = prompt(12, 3)
    ref = plain(EngineRequest("r", p, greedy(12))).output_token_ids
    eos = ref[4]
    stop_at = ref.index(eos)
    rig = make_loop(tiny64, num_blocks=4, eos_token_ids=(eos,))
    sampling = SamplingParams(max_tokens=12, temperature=0.0)
    stopped = rig.run_alone(EngineRequest("r", p, sampling))
    assert stopped.finish_reason == "stop"
    assert stopped.output_token_ids == ref[: stop_at + 1]
    ignoring = rig.run_alone(EngineRequest("r", p, greedy(12)))
    assert ignoring.output_token_ids == ref and ignoring.finish_reason == "length"
    via_stop_ids = rig.run_alone(EngineRequest("r", p, greedy(12, stop_token_ids=(eos,))))
    assert via_stop_ids.output_token_ids == ref[: stop_at + 1]


def test_stop_string_is_trimmed_and_never_streamed(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy
) -> None:
    rig = make_loop(tiny64, num_blocks=4)
    p = prompt(10, 4)
    _, outs = rig.drive(EngineRequest("r", p, greedy(24)))
    pieces = [o.new_text for o in outs]
    text = "".join(pieces)
    # a stop string straddling a token boundary b: 2 chars before it, 2 after
    bounds = [len("".join(pieces[: i + 1])) for i in range(len(pieces))]
    b = next(
        b for b in bounds[3:] if b + 2 <= len(text) and text.find(text[b - 2 : b + 2]) == b - 2
    )
    stop = text[b - 2 : b + 2]
    state, outs = rig.drive(EngineRequest("r", p, greedy(24, stop=(stop,))))
    assert state.finish_reason == "stop" and outs[-1].finish_reason == "stop"
    assert "".join(o.new_text for o in outs) == text[: b - 2]
    assert state.num_output_tokens < 24
    emitted = [len("".join(o.new_text for o in outs[: i + 1])) for i in range(len(outs))]
    assert all(e <= b - 2 for e in emitted)  # the stop string's start was held back


def test_outputs_stream_every_token_once_with_counts(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy
) -> None:
    rig = make_loop(tiny64, num_blocks=4)
    req = EngineRequest("r", prompt(8, 5), greedy(6, logprobs=2))
    state, outs = rig.drive(req, LoopContext(weights_version="v1"))
    # the scheduler sends the last token with the final output (no empty last increment)
    assert [len(o.new_token_ids) for o in outs] == [1] * 6
    assert [o.num_output_tokens for o in outs] == [1, 2, 3, 4, 5, 6]
    assert [o.finished for o in outs] == [False] * 5 + [True]
    assert sum(len(o.logprobs) for o in outs) == 6
    final = outs[-1]
    assert final.finished and final.finish_reason == "length" and final.weights_version == "v1"
    m = final.metrics
    assert m is not None and m.first_token_time is not None and m.last_token_time is not None
    assert m.arrival_time <= m.scheduled_time <= m.first_token_time <= m.last_token_time  # type: ignore[operator]
    assert m.last_token_time <= m.finished_time and len(m.inter_token_latencies) == 5
    assert state.table.block_ids == [] and rig.loop.kv.pool.is_whole()


def test_two_states_interleaved_by_hand_match_each_alone(
    tiny64: LoadedModel, make_loop: MakeLoop, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    # The loop object holds no per-request state: alternating steps of two requests is safe.
    # The alternation is by hand; the KV steps and the executor are the production ones.
    rig = make_loop(tiny64, num_blocks=8)
    loop = rig.loop
    reqs = [
        EngineRequest("a", prompt(9, 6), greedy(5)),
        EngineRequest("b", prompt(17, 7), greedy(7)),
    ]
    states = [loop.init(r, LoopContext()) for r in reqs]
    assert all(loop.admit(s) for s in states)
    live = list(states)
    while live:
        for s in list(live):
            plan = loop.next(s)
            if isinstance(plan, Done):
                live.remove(s)
            else:
                assert loop.grow(s, plan.resources.compute_tokens)
                (result,) = rig.execute([plan])
                loop.advance(s, result)
    outs = [loop.finalize(s) for s in states]
    assert [o.output_token_ids for o in outs] == [plain(r).output_token_ids for r in reqs]


# --- the text rules, on a decoder that renders token t as chr(t) ---------------------------------

EOS = 1  # ids below 32 are special: rendered as <t> only when not skipped


class CharDecoder:
    def __init__(self, context: Sequence[int], skip_special_tokens: bool) -> None:
        self.skip = skip_special_tokens

    def step(self, token_id: int) -> str:
        if token_id < 32:
            return "" if self.skip else f"<{token_id}>"
        return chr(token_id)

    def flush(self) -> str:
        return ""


def feed(sampling: SamplingParams, ids: Sequence[int]) -> tuple[ARDecodeState, list[str]]:
    """Fold `ids` in as the sampled tokens of a one-token prompt, as the step would, until the
    request finishes; its state and every streamed text increment."""
    loop = ARDecodeLoop(
        KVAllocator(BlockPool(8, 16), PrefixHasher(16)), CharDecoder, (EOS,), prefix_caching=False
    )
    state = loop.init(EngineRequest("r", (65,), sampling), LoopContext())
    assert loop.admit(state)
    streamed: list[str] = []
    for t in ids:
        loop.advance(state, TokenResult(len(state.tokens) - state.num_computed, SampledToken(t)))
        out = loop.take_output(state)
        streamed.append(out.new_text if out else "")
        if state.finished:
            break
    return state, streamed


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


TEXT_RULES = [
    # (sampling, fed ids, final text, finish reason)
    (SamplingParams(stop=("cd",)), _ids("abcdef"), "ab", "stop"),
    (SamplingParams(stop=("cd",), include_stop_str_in_output=True), _ids("abcdef"), "abcd", "stop"),
    # min_tokens 4: "cd" ends in the 4th token's text, never searched; the next "cd" stops it
    (SamplingParams(stop=("cd",), min_tokens=4), _ids("abcdefcdx"), "abcdef", "stop"),
    # min_tokens 3: "cd" ends in the 4th token's text, searched back across the boundary
    (SamplingParams(stop=("cd",), min_tokens=3), _ids("abcdef"), "ab", "stop"),
    (SamplingParams(stop=("cd",), min_tokens=6, max_tokens=6), _ids("abcdef"), "abcdef", "length"),
    # a stop token's text is kept only with include_stop_str_in_output, special only unskipped
    (SamplingParams(), [*_ids("ab"), EOS], "ab", "stop"),
    (SamplingParams(include_stop_str_in_output=True), [*_ids("ab"), EOS], "ab", "stop"),
    (SamplingParams(include_stop_str_in_output=True, skip_special_tokens=False),
     [*_ids("ab"), EOS], "ab<1>", "stop"),
    (SamplingParams(skip_special_tokens=False, max_tokens=3), [*_ids("a"), 7, *_ids("b")],
     "a<7>b", "length"),
    (SamplingParams(max_tokens=3), [*_ids("a"), 7, *_ids("b")], "ab", "length"),
    (SamplingParams(stop_token_ids=(ord("c"),)), _ids("abcd"), "ab", "stop"),
    (SamplingParams(stop_token_ids=(ord("c"),), include_stop_str_in_output=True),
     _ids("abcd"), "abc", "stop"),
    # before min_tokens no stop id ends the request (the sampler masks them; the loop agrees)
    (SamplingParams(min_tokens=3, max_tokens=4), [*_ids("a"), EOS, *_ids("bc")], "abc", "length"),
]  # fmt: skip


@pytest.mark.parametrize(("sampling", "ids", "text", "reason"), TEXT_RULES)
def test_stop_rules_and_kept_text(
    sampling: SamplingParams, ids: list[int], text: str, reason: str
) -> None:
    state, streamed = feed(sampling, ids)
    assert (state.text, state.finish_reason) == (text, reason)
    assert "".join(streamed) == text  # streamed exactly once, nothing past the cut


def test_an_included_stop_string_is_not_held_back_while_streaming() -> None:
    _, held = feed(SamplingParams(stop=("cd",)), _ids("abc"))
    _, sent = feed(SamplingParams(stop=("cd",), include_stop_str_in_output=True), _ids("abc"))
    assert held == ["a", "b", ""] and sent == ["a", "b", "c"]  # "c" may start "cd": kept anyway
