"""The profile's decisions as tables: the sweep's levels, each phase's engine, prompt and output
lengths, the quantiles, which decode level is the capacity, and the section they print."""

from __future__ import annotations

import pytest
import yaml

from loom_operator.api.autoscaling import ScaleCapacity
from loom_operator.profile.decide import (
    DecodeLevel,
    PrefillRound,
    Profile,
    capacity,
    decode_output_tokens,
    median,
    percentile,
    phase_roles,
    prefill_capacity,
    prefill_concurrency,
    prefill_prompt_tokens,
    profile_json,
    snippet,
    sweep_levels,
    within_target,
)


@pytest.mark.parametrize(
    ("max_num_seqs", "levels"),
    [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (8, (1, 2, 4, 8)), (12, (1, 2, 4, 8, 12)),
     (64, (1, 2, 4, 8, 16, 32, 64))],
)  # fmt: skip
def test_the_sweep_doubles_up_to_max_num_seqs(max_num_seqs: int, levels: tuple[int, ...]) -> None:
    assert sweep_levels(max_num_seqs) == levels


@pytest.mark.parametrize(
    ("roles", "expected"),
    [(("aggregated",), ("aggregated", "aggregated")),
     (("prefill", "decode"), ("prefill", "decode")), (("decode",), ("decode", "decode"))],
)  # fmt: skip
def test_each_phase_is_measured_on_its_roles_engine(
    roles: tuple[str, ...], expected: tuple[str, str]
) -> None:
    assert phase_roles(roles) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("max_model_len", "batched", "tokens"),
    [(4096, 512, 2048), (512, 256, 511), (1_048_576, 8192, 32768), (1, 256, 1)],
)
def test_a_prefill_prompt_is_several_chunks_within_the_context(
    max_model_len: int, batched: int, tokens: int
) -> None:
    assert prefill_prompt_tokens(max_model_len, batched) == tokens


@pytest.mark.parametrize(
    ("prompt", "batched", "seqs", "depth"),
    [(2048, 512, 16, 2), (100, 512, 16, 11), (100, 512, 4, 4), (10, 2048, 1, 1)],
)
def test_prefill_keeps_the_step_budget_full_within_max_num_seqs(
    prompt: int, batched: int, seqs: int, depth: int
) -> None:
    assert prefill_concurrency(prompt, batched, seqs) == depth


@pytest.mark.parametrize(
    ("max_model_len", "prompt", "wanted", "tokens"),
    [(4096, 16, 256, 256), (512, 8, 256, 120), (16, 8, 256, 1)],
)
def test_decode_outputs_fit_a_quarter_of_the_context(
    max_model_len: int, prompt: int, wanted: int, tokens: int
) -> None:
    assert decode_output_tokens(max_model_len, prompt, wanted) == tokens


@pytest.mark.parametrize(
    ("samples", "q", "value"),
    [([], 0.9, 0.0), ([5.0], 0.9, 5.0), ([float(i) for i in range(1, 11)], 0.9, 9.1),
     ([3.0, 1.0, 2.0], 0.5, 2.0), ([1.0, 2.0], 1.0, 2.0)],
)  # fmt: skip
def test_percentile_interpolates_between_ranks(
    samples: list[float], q: float, value: float
) -> None:
    assert percentile(samples, q) == pytest.approx(value)


def test_prefill_capacity_is_the_median_round() -> None:
    rounds = [PrefillRound(2, 4, tokens, 1.0) for tokens in (900, 1000, 5000)]
    assert prefill_capacity(rounds) == 1000
    assert median([]) == 0.0


def level(concurrency: int, itl_ms: float, tokens: int = 100, seconds: float = 1.0) -> DecodeLevel:
    return DecodeLevel(concurrency, concurrency, tokens, seconds, itl_ms)


SWEEP = (level(1, 10.0), level(2, 12.0), level(4, 30.0), level(8, 55.0))


@pytest.mark.parametrize(
    ("levels", "target", "chosen"),
    [(SWEEP, 50.0, 4), (SWEEP, 30.0, 4), (SWEEP, 29.9, 2), (SWEEP, 100.0, 8), (SWEEP, 5.0, None),
     ((level(1, 10.0), level(2, 60.0), level(4, 40.0)), 50.0, 4),
     ((level(1, 10.0), level(2, 10.0, tokens=0)), 50.0, 1), ((), 50.0, None)],
)  # fmt: skip
def test_the_capacity_is_the_largest_level_within_the_itl_target(
    levels: tuple[DecodeLevel, ...], target: float, chosen: int | None
) -> None:
    best = within_target(levels, target)
    assert (None if best is None else best.concurrency) == chosen


def profile(
    decode: tuple[DecodeLevel, ...] = SWEEP, target: float = 50.0, rate: float = 6800.4
) -> Profile:
    tokens = 1_000_000 if rate else 0
    rounds = (PrefillRound(2, 3, tokens, tokens / rate if rate else 1.0),) * 3
    return Profile("tiny", "prefill", "decode", target, 0.6, rounds, decode)


@pytest.mark.parametrize(
    ("prof", "prefill", "decode_tps", "sequences"),
    [(profile(), 6800.0, 100.0, 4.0), (profile(target=5.0), 6800.0, None, None),
     (profile(decode=(level(1, 10.0, tokens=7, seconds=2.0),)), 6800.0, 3.5, 1.0),
     (profile(rate=3.14159), 3.14, 100.0, 4.0), (profile(rate=0.001), 0.01, 100.0, 4.0),
     (profile(rate=0.0), None, 100.0, 4.0)],
)  # fmt: skip
def test_the_section_holds_what_was_measured(
    prof: Profile, prefill: float | None, decode_tps: float | None, sequences: float | None
) -> None:
    cap = capacity(prof)
    assert (cap.prefill_tokens_per_second, cap.decode_tokens_per_second) == (prefill, decode_tps)
    assert cap.decode_sequences == sequences
    assert cap.utilization == 0.6
    printed = ScaleCapacity.model_validate(yaml.safe_load(snippet(prof))["capacity"])
    assert printed == cap


def test_the_snippet_says_what_each_figure_rests_on() -> None:
    text = snippet(profile())
    assert "prefillTokensPerSecond: 6800  # median of 3 saturated rounds (prefill engine)" in text
    assert "decodeTokensPerSecond: 100  # at 4 sequences (decode engine)" in text
    assert "decodeSequences: 4  # the most with ITL p90 30.0 ms <= 50 ms" in text
    assert "decodeSequences" not in snippet(profile(target=5.0))


def test_the_json_carries_every_measurement_and_the_choice() -> None:
    data = profile_json(profile())
    assert [lvl["concurrency"] for lvl in data["decode"]] == [1, 2, 4, 8]  # type: ignore[attr-defined]
    assert data["decode_capacity_concurrency"] == 4
    assert data["capacity"] == {"prefillTokensPerSecond": 6800.0, "decodeTokensPerSecond": 100.0,
                                "decodeSequences": 4.0, "utilization": 0.6}  # fmt: skip
