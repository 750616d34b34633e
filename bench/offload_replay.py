"""The CPU KV offload phase of bench/long_context.py: the agentic trace replayed, one turn at a
time, through an in-process engine whose device KV pool cannot hold every conversation's prefix.

Owns one replay (an engine, offload off or on) and its summary; never prints results or writes
files (progress lines on stderr only).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from agentic_trace import Session, turn_order

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.models.loader import LoadedModel


@dataclass(frozen=True)
class PoolShape:
    num_blocks: int  # device KV blocks: too few for every conversation's prefix
    block_size: int
    max_model_len: int
    host_gib: float  # the host tier when offload is on
    output_tokens: int  # greedy tokens per turn


@dataclass(frozen=True)
class Replay:
    """One pass over the trace with offload off or on."""

    offload: bool
    ttft_s: tuple[float, ...]  # per turn, in replay order
    outputs: tuple[tuple[int, ...], ...]  # greedy tokens per turn, in replay order
    prompt_tokens: int
    device_hit_tokens: int  # prompt tokens found in the device prefix cache
    host_hit_tokens: int  # prompt tokens reloaded from the host tier
    tokens_run: int  # tokens run through the model (prefill + decode)
    offloaded_blocks: int


def percentile(values: tuple[float, ...] | list[float], q: float) -> float:
    """The nearest-rank q-quantile (what bench/routing.py reports)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def replay(
    loaded: LoadedModel,
    systems: list[tuple[int, ...]],
    sessions: list[Session],
    pool: PoolShape,
    offload: bool,
) -> Replay:
    """The trace's turns in arrival order, each run to the end before the next starts; every
    turn's prompt is its session's context so far (earlier prompts and answers) + its message."""
    config = EngineConfig(
        block_size=pool.block_size,
        num_blocks=pool.num_blocks,
        max_model_len=pool.max_model_len,
        max_num_seqs=4,
        dtype=loaded.model.dtype,
        kv_offload_gib=pool.host_gib if offload else 0.0,
    )
    engine = Engine(loaded, config)
    greedy = SamplingParams(max_tokens=pool.output_tokens, temperature=0.0, ignore_eos=True)
    # Warm up (first-call costs out of the first TTFT) on this thread, whose steps leave the
    # stats current; then the step thread.
    engine.generate((5, 6, 7), greedy)
    warm = engine.stats()
    engine.start()
    try:
        contexts = [list(systems[s.group]) for s in sessions]
        ttfts, outputs, cached, prompts = [], [], 0, 0
        for index, turn in turn_order(sessions):
            prompt = contexts[index] + list(sessions[index].messages[turn])
            done = engine.generate(prompt, greedy)
            m = done.metrics
            assert m.first_token_time is not None
            ttfts.append(m.first_token_time - m.arrival_time)
            outputs.append(done.output_token_ids)
            cached += done.num_cached_tokens
            prompts += len(prompt)
            contexts[index] = prompt + list(done.output_token_ids)
    finally:
        engine.shutdown()
    stats = engine.stats()  # the step thread has stopped: taken after its last step
    host = stats.kv_reload_tokens - warm.kv_reload_tokens
    return Replay(
        offload, tuple(ttfts), tuple(outputs), prompts, cached - host, host,
        stats.num_tokens_computed - warm.num_tokens_computed,
        stats.kv_offloaded_blocks - warm.kv_offloaded_blocks,
    )  # fmt: skip


def offload_phase(
    loaded: LoadedModel,
    systems: list[tuple[int, ...]],
    sessions: list[Session],
    pool: PoolShape,
    rounds: int,
) -> list[tuple[Replay, Replay]]:
    """`rounds` (off, on) pairs; the order alternates each round, so a slow spell of a shared
    machine does not always land on the same side."""
    out = []
    for r in range(rounds):
        sides = (False, True) if r % 2 == 0 else (True, False)
        runs = {side: replay(loaded, systems, sessions, pool, side) for side in sides}
        for side in sides:
            x = runs[side]
            print(
                f"  offload {'on ' if side else 'off'} round {r + 1}: TTFT p50 "
                f"{1e3 * statistics.median(x.ttft_s):.1f} ms, p90 "
                f"{1e3 * percentile(x.ttft_s, 0.9):.1f} ms, host hits {x.host_hit_tokens} tokens",
                file=sys.stderr,
            )
        out.append((runs[False], runs[True]))
    return out


def summarize(pairs: list[tuple[Replay, Replay]]) -> dict[str, object]:
    """Medians over the rounds of each side's TTFT p50/p90, the ratios, the hit tokens, and
    whether every turn's greedy tokens were the same with and without offload."""

    def side(runs: list[Replay]) -> dict[str, float]:
        return {
            "ttft_p50_s": statistics.median(statistics.median(x.ttft_s) for x in runs),
            "ttft_p90_s": statistics.median(percentile(x.ttft_s, 0.9) for x in runs),
            "prompt_tokens": statistics.median(x.prompt_tokens for x in runs),
            "device_hit_tokens": statistics.median(x.device_hit_tokens for x in runs),
            "host_hit_tokens": statistics.median(x.host_hit_tokens for x in runs),
            "tokens_run": statistics.median(x.tokens_run for x in runs),
            "offloaded_blocks": statistics.median(x.offloaded_blocks for x in runs),
        }

    off, on = side([p[0] for p in pairs]), side([p[1] for p in pairs])
    return {
        "rounds": len(pairs),
        "turns": len(pairs[0][0].ttft_s),
        "off": off,
        "on": on,
        "ttft_p50_ratio_on_vs_off": on["ttft_p50_s"] / off["ttft_p50_s"],
        "ttft_p90_ratio_on_vs_off": on["ttft_p90_s"] / off["ttft_p90_s"],
        "greedy_outputs_equal": all(a.outputs == b.outputs for a, b in pairs),
        "per_round_ttft_p50_p90_s": [
            {name: (statistics.median(x.ttft_s), percentile(x.ttft_s, 0.9))
             for name, x in (("off", a), ("on", b))}
            for a, b in pairs
        ],
    }  # fmt: skip
