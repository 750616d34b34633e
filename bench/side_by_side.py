"""What the side-by-side bench scripts share: their command line (--quick, --rounds, --json),
their report (a Markdown table on stdout, the rows as JSON, exit 1 unless every run's tokens
were identical to the baseline's), the medians of their rounds, and serving requests together on
an engine's own thread (timing each step in which all of them decode, or not)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom_runtime.engine.ar_state import CompletedRequest
    from loom_runtime.engine.engine import Engine
    from loom_runtime.engine.types import EngineRequest


def bench_args(doc: str) -> argparse.Namespace:
    """--quick (a short run, tests use it), --rounds (3), --json PATH."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (tests use it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the rows here")
    return parser.parse_args()


def report(
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Any],
    cells: Callable[[Any], Sequence[str]],
    json_path: Path | None,
) -> int:
    """Print the table (`columns`: header and Markdown alignment; `cells(row)`: its cells),
    write the rows (dataclasses with an `identical` field) to `json_path`; the exit status."""
    print("| " + " | ".join(name for name, _ in columns) + " |")
    print("|" + "|".join(align for _, align in columns) + "|")
    for row in rows:
        print("| " + " | ".join(cells(row)) + " |")
    if json_path is not None:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0 if all(r.identical for r in rows) else 1


def median_rows(rounds: Sequence[Sequence[Any]], fields: Sequence[str]) -> list[Any]:
    """Per row position, the first round's row with each of `fields` the median over the rounds
    and `identical` true only if it was in every round (rows: dataclasses)."""
    out = []
    for i, first in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        medians = {f: statistics.median(getattr(r, f) for r in same) for f in fields}
        out.append(replace(first, **medians, identical=all(r.identical for r in same)))
    return out


def serve_together(engine: Engine, reqs: Sequence[EngineRequest]) -> dict[str, tuple[int, ...]]:
    """Add every request at once, step the engine on this thread until all are done; each
    request's output tokens."""
    from loom_runtime.engine.collector import OutputCollector

    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    while not all(c.done.is_set() for c in got.values()):
        engine.step()
    return {k: c.result().output_token_ids for k, c in got.items()}


@dataclass(frozen=True)
class Served:
    """Requests served together: each one's result, the seconds of every step in which all of
    them were decoding (by the clock asked for), the whole run's wall seconds, and the first
    step's seconds (their prompts' prefill, where the step budget holds them)."""

    done: list[CompletedRequest]
    steps: list[float]
    wall: float
    first_step: float

    @property
    def tokens(self) -> int:
        return sum(len(d.output_token_ids) for d in self.done)


def serve_timed(
    engine: Engine, reqs: Sequence[EngineRequest], clock: Callable[[], float] = time.thread_time
) -> Served:
    """Add every request at once and step the engine on this thread until all are done, timing
    each step with `clock` (thread CPU time by default: the step runs on this thread)."""
    from loom_runtime.engine.collector import OutputCollector

    got = [OutputCollector(r) for r in reqs]
    for r, c in zip(reqs, got, strict=True):
        engine.add_request(r, c)
    steps: list[float] = []
    first: float | None = None
    start = time.perf_counter()
    while not all(c.done.is_set() for c in got):
        before = clock()
        engine.step()
        took = clock() - before
        first = took if first is None else first
        stats = engine.stats()
        if stats.num_running == len(reqs) and stats.prefill_backlog_tokens == 0:
            steps.append(took)
    wall = time.perf_counter() - start
    return Served([c.result() for c in got], steps, wall, first or 0.0)
