"""What the planner reads of a role's workers: from /metrics the TTFT and ITL histograms over a
sliding window (the 90th percentile of what finished inside it, as Prometheus'
`histogram_quantile` over `increase(...[window])` computes it), the prefill backlog gauge and
the arrived prompt and generated tokens counters (their rates over a shorter window: the offered
prefill and decode load); from Status the queue, the sequences in flight (decode's load when it
is saturated) and KV usage; from the router the requests it holds.

Pure functions over Prometheus text and plain records; the shell scrapes and keeps the samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import RoleSignals
from loom_operator.fleet.observed import WorkerState
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.wire.metric_names import (
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY,
    PREFILL_BACKLOG_TOKENS,
    PROMPT_TOKENS_ARRIVED,
    TIME_TO_FIRST_TOKEN,
    total,
)

Buckets = tuple[tuple[float, float], ...]
"""A histogram's cumulative counts by upper bound (`le`), ascending, +Inf last."""


@dataclass(frozen=True)
class WorkerSample:
    """One scrape of one worker."""

    at: float
    ttft: Buckets
    itl: Buckets
    prefill_backlog_tokens: float
    prompt_tokens_arrived: float = 0.0
    """The worker's counter of prompt tokens arrived (since it started)."""
    generation_tokens: float = 0.0
    """The worker's counter of tokens generated (since it started)."""


def parse_sample(text: str, at: float) -> WorkerSample:
    """The histograms, the backlog gauge and the arrived prompt and generated tokens from a
    worker's /metrics text (summed over label sets; one the worker does not export is empty or
    0)."""
    counts: dict[str, dict[float, float]] = {TIME_TO_FIRST_TOKEN: {}, INTER_TOKEN_LATENCY: {}}
    backlog = arrived = generated = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == PREFILL_BACKLOG_TOKENS:
                backlog += s.value
            elif s.name == total(PROMPT_TOKENS_ARRIVED):
                arrived += s.value
            elif s.name == total(GENERATION_TOKENS):
                generated += s.value
            base = s.name.removesuffix("_bucket")
            if s.name.endswith("_bucket") and base in counts:
                le = float(s.labels["le"])
                counts[base][le] = counts[base].get(le, 0.0) + s.value
    ttft, itl = (
        tuple(sorted(counts[n].items())) for n in (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY)
    )
    return WorkerSample(at, ttft, itl, backlog, arrived, generated)


def increase(old: Buckets, new: Buckets) -> Buckets:
    """What the histogram counted between two scrapes; a counter that went down (or bounds that
    changed) means the worker restarted, and everything it holds counts as new (as Prometheus'
    `increase` does)."""
    same = [le for le, _ in old] == [le for le, _ in new]
    if not same or any(n < o for (_, o), (_, n) in zip(old, new, strict=True)):
        return new
    return tuple((le, n - o) for (le, o), (_, n) in zip(old, new, strict=True))


def merge(histograms: Iterable[Buckets]) -> Buckets:
    """Bucket-wise sum (workers of one role share their bucket bounds)."""
    total: dict[float, float] = {}
    for h in histograms:
        for le, n in h:
            total[le] = total.get(le, 0.0) + n
    return tuple(sorted(total.items()))


def quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile, interpolated linearly inside its bucket (`histogram_quantile`); None with
    no observations. An answer in the +Inf bucket is the highest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if math.isinf(le):
                return lower_le
            if n == lower_n:
                return le
            return lower_le + (le - lower_le) * (rank - lower_n) / (n - lower_n)
        lower_le, lower_n = le, n
    return lower_le


def window_p90(
    samples: Mapping[str, Sequence[WorkerSample]], now: float, window_s: float
) -> tuple[float | None, float | None]:
    """TTFT and ITL p90 over the last `window_s` of every worker's samples (each worker: its
    newest sample against its oldest inside the window)."""
    ttft: list[Buckets] = []
    itl: list[Buckets] = []
    for kept in samples.values():
        inside = [s for s in kept if s.at >= now - window_s]
        if len(inside) < 2:
            continue  # one scrape says nothing about the window
        first, last = inside[0], inside[-1]
        ttft.append(increase(first.ttft, last.ttft))
        itl.append(increase(first.itl, last.itl))
    return quantile(0.9, merge(ttft)), quantile(0.9, merge(itl))


Counter = Callable[[WorkerSample], float]
"""Which counter of a sample a rate reads."""


def read_arrived(s: WorkerSample) -> float:
    """The prompt tokens arrived counter (the offered prefill load)."""
    return s.prompt_tokens_arrived


def read_generated(s: WorkerSample) -> float:
    """The generated tokens counter (the decode load)."""
    return s.generation_tokens


def counter_rate(
    kept: Sequence[WorkerSample],
    started_at: float | None,
    now: float,
    window_s: float,
    counter: Counter,
) -> float | None:
    """A counter's rate per second on one worker over the last `window_s`: its newest count less
    its count at the window's start (the newest sample at or before it, else its oldest); a
    worker started inside the window counted all it holds inside it. None: one scrape of a
    worker older than the window says nothing yet."""
    if not kept:
        return None
    last = kept[-1]
    before = [s for s in kept if s.at <= now - window_s]
    if not before and started_at is not None and started_at > now - window_s:
        return counter(last) / window_s
    base = before[-1] if before else kept[0]
    if last.at <= base.at:
        return None
    grew = counter(last) - counter(base)
    if grew < 0:  # the worker restarted: its counter began again at 0
        grew = counter(last)
    return grew / (last.at - base.at)


def role_rate(
    workers: Sequence[WorkerState],
    samples: Mapping[str, Sequence[WorkerSample]],
    now: float,
    window_s: float,
    counter: Counter,
) -> float | None:
    """A counter's rate summed over the role's workers (None when no worker's is known)."""
    rates = [
        r
        for w in workers
        if (r := counter_rate(samples.get(w.name, ()), w.started_at, now, window_s, counter))
        is not None
    ]
    return sum(rates) if rates else None


def queued(status: WorkerStatus) -> int:
    """Requests a worker holds but does not run: its queue, and on decode those waiting for a
    KV pull or a slot to pull into (in flight minus running)."""
    return max(status.num_waiting, status.in_flight - status.num_running)


def role_signals(
    role: RoleName,
    replicas: int,
    workers: Sequence[WorkerState],
    statuses: Mapping[str, WorkerStatus | None],
    samples: Mapping[str, Sequence[WorkerSample]],
    held: int,
    now: float,
    window_s: float,
    rate_window_s: float,
) -> RoleSignals:
    """One role's signals from its workers' observations, last Status and scrapes, and the
    requests the router holds (counted against the serving role: decode or aggregated): the
    latencies over `window_s`, the arrival rate over `rate_window_s`."""
    mine = [w for w in workers if w.role == role]
    ready = [w for w in mine if w.routable]
    known = [s for w in mine if (s := statuses.get(w.name)) is not None]
    held_here = held if role != "prefill" else 0
    kept = {w.name: samples[w.name] for w in mine if w.name in samples}
    ttft, itl = window_p90(kept, now, window_s)
    return RoleSignals(
        role=role,
        replicas=replicas,
        ready=len(ready),
        waiting=float(sum(queued(s) for s in known) + held_here),
        held=held_here if not ready else 0,
        kv_usage=max((s.kv_usage for w in ready if (s := statuses.get(w.name))), default=0.0),
        prefill_tokens=sum(s[-1].prefill_backlog_tokens for s in kept.values() if s),
        ttft_p90_s=ttft,
        itl_p90_s=itl,
        prompt_tokens_s=role_rate(mine, kept, now, rate_window_s, read_arrived),
        generated_tokens_s=role_rate(mine, kept, now, rate_window_s, read_generated),
        sequences=float(sum(s.in_flight for s in known) + held_here),
    )
