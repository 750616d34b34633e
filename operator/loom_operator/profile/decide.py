"""The profile's decisions: which concurrencies to sweep, how a phase's samples become one
figure, which decode level is the capacity, and the `autoscaling.capacity` section they make.

Pure functions over plain measurements; never sends a request or starts a process.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import yaml

from loom_operator.api.autoscaling import ScaleCapacity
from loom_operator.api.roles import RoleName

PREFILL_CHUNKS = 4
"""A prefill prompt is this many scheduler chunks (`maxNumBatchedTokens`) long, at most."""


@dataclass(frozen=True)
class Plan:
    """How long and how hard each phase runs."""

    prefill_rounds: int
    prefill_seconds: float
    """Each round's length."""
    decode_seconds: float
    """Each concurrency level's length."""
    decode_prompt_tokens: int
    decode_output_tokens: int
    """Wanted per request (a quarter of the context caps it: `decode_output_tokens`)."""


FULL = Plan(prefill_rounds=3, prefill_seconds=10.0, decode_seconds=10.0,
            decode_prompt_tokens=16, decode_output_tokens=256)  # fmt: skip
QUICK = Plan(prefill_rounds=3, prefill_seconds=0.5, decode_seconds=0.5,
             decode_prompt_tokens=8, decode_output_tokens=16)  # fmt: skip
"""`--quick`: seconds in all on a small model, for tests and a first look."""


@dataclass(frozen=True)
class Window:
    """Requests kept `concurrency` deep for `seconds`: how many were answered and the tokens
    they carried (prompt tokens for prefill, generated tokens for decode)."""

    concurrency: int
    requests: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class PrefillRound(Window):
    """One round of long prompts answered with one token each; `tokens` are prompt tokens."""


@dataclass(frozen=True)
class DecodeLevel(Window):
    """Streaming greedy requests held at one concurrency; `tokens` are the generated ones, and
    their inter-token latency p90 is the level's verdict."""

    itl_p90_ms: float


@dataclass(frozen=True)
class Profile:
    """Everything one `loom profile` measured, and the ITL target it judged decode by."""

    card: str
    prefill_role: str
    decode_role: str
    itl_target_ms: float
    utilization: float
    prefill: tuple[PrefillRound, ...]
    decode: tuple[DecodeLevel, ...]


def phase_roles(roles: Collection[RoleName]) -> tuple[RoleName, RoleName]:
    """Whose engine settings each phase is measured with: (prefill's, decode's). A P/D card's
    prefill role for prefill and decode role for decode; an aggregated card's one role for both;
    a decode-only card's decode role (it prefills its own prompts) for both."""
    decode: RoleName = "decode" if "decode" in roles else "aggregated"
    prefill: RoleName = "prefill" if "prefill" in roles else decode
    return prefill, decode


def sweep_levels(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, … up to `max_num_seqs`, which is always the last level."""
    levels = [1]
    while levels[-1] * 2 < max_num_seqs:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_num_seqs:
        levels.append(max_num_seqs)
    return tuple(levels)


def prefill_prompt_tokens(max_model_len: int, max_num_batched_tokens: int) -> int:
    """A long prompt that still fits the context with one token to generate: several chunks."""
    return max(1, min(max_model_len - 1, PREFILL_CHUNKS * max_num_batched_tokens))


def prefill_concurrency(prompt_tokens: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Enough prompts in flight to fill every step's token budget twice over (so the queue
    never runs dry between answers), within the engine's sequences."""
    chunks = math.ceil(2 * max_num_batched_tokens / max(prompt_tokens, 1))
    return max(1, min(max_num_seqs, max(2, chunks)))


def decode_output_tokens(max_model_len: int, prompt_tokens: int, wanted: int) -> int:
    """`wanted` output tokens, or as many as fit a quarter of the context after the prompt
    (the native runtime sizes its KV pool for `maxNumSeqs` sequences that long, so the
    largest level runs without preemption)."""
    return max(1, min(wanted, max_model_len // 4 - prompt_tokens))


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `samples`, interpolated between closest ranks; 0 for none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def prefill_capacity(rounds: Sequence[PrefillRound]) -> float:
    """Prompt tokens per second, saturated: the median of the rounds' rates."""
    return median([r.tokens_per_second for r in rounds])


def within_target(levels: Sequence[DecodeLevel], itl_target_ms: float) -> DecodeLevel | None:
    """The decode capacity: the largest concurrency whose ITL p90 is within the target (None:
    not even one sequence is)."""
    fits = [lvl for lvl in levels if lvl.itl_p90_ms <= itl_target_ms and lvl.tokens]
    return max(fits, key=lambda lvl: lvl.concurrency, default=None)


def capacity(profile: Profile) -> ScaleCapacity:
    """The section the measurements support; a figure that was not measured stays unset."""
    best = within_target(profile.decode, profile.itl_target_ms)
    prefill = prefill_capacity(profile.prefill)
    return ScaleCapacity(
        prefill_tokens_per_second=_figure(prefill) if prefill > 0 else None,
        decode_tokens_per_second=None if best is None else _figure(best.tokens_per_second),
        decode_sequences=None if best is None else float(best.concurrency),
        utilization=profile.utilization,
    )


def _figure(x: float) -> float:
    """Whole numbers where they are large enough to need no decimals; never rounded to 0."""
    return float(round(x)) if x >= 10 else max(round(x, 2), 0.01)


def _number(x: float) -> str:
    return f"{x:g}" if x < 10 else f"{round(x)}"


def snippet(profile: Profile) -> str:
    """`capacity:` as YAML to paste under the card's `autoscaling:`, each figure with the
    measurement behind it; loaded back into ScaleCapacity, so it is never an invalid section."""
    cap = capacity(profile)
    best = within_target(profile.decode, profile.itl_target_ms)
    lines = [f"capacity:  # one worker of {profile.card}, measured by `loom profile`"]
    if cap.prefill_tokens_per_second is not None:
        rate = _number(cap.prefill_tokens_per_second)
        n, role = len(profile.prefill), profile.prefill_role
        lines.append(
            f"  prefillTokensPerSecond: {rate}  # median of {n} saturated rounds ({role} engine)"
        )
    if best is not None and cap.decode_tokens_per_second is not None:
        why = f"ITL p90 {best.itl_p90_ms:.1f} ms <= {profile.itl_target_ms:g} ms"
        rate, role = _number(cap.decode_tokens_per_second), profile.decode_role
        lines.append(
            f"  decodeTokensPerSecond: {rate}  # at {best.concurrency} sequences ({role} engine)"
        )
        lines.append(f"  decodeSequences: {best.concurrency}  # the most with {why}")
    lines.append(f"  utilization: {cap.utilization:g}")
    text = "\n".join(lines) + "\n"
    ScaleCapacity.model_validate(yaml.safe_load(text)["capacity"])  # as a card loads it
    return text


def profile_json(profile: Profile) -> dict[str, object]:
    """The raw measurements and the section chosen from them, as plain JSON data."""
    best = within_target(profile.decode, profile.itl_target_ms)
    cap = capacity(profile)
    return {
        "card": profile.card,
        "roles": {"prefill": profile.prefill_role, "decode": profile.decode_role},
        "itl_target_ms": profile.itl_target_ms,
        "prefill": [_window(r) for r in profile.prefill],
        "decode": [_window(lvl) for lvl in profile.decode],
        "decode_capacity_concurrency": None if best is None else best.concurrency,
        "capacity": cap.model_dump(mode="json", by_alias=True),
    }


def _window(w: Window) -> dict[str, object]:
    return {**dataclasses.asdict(w), "tokens_per_second": w.tokens_per_second}
