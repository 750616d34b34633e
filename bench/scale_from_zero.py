"""Time to first token from zero (issue #38): a `loom up` fleet of the tiny model whose one
aggregated role scales between 0 and 1, against the same fleet with one worker always serving.

Each round of the cold fleet waits until it idles at zero (Ready `ScaledToZero`, no worker), then
streams one completion through the router and times its first token (the router holds the request
while the planner starts a worker, which loads its weights) and its end; the warm fleet runs the
same request with its worker up. Reported: per round and the median, cold and warm. Usage
(writes bench/results/scale_from_zero.json):

    .venv/bin/python bench/scale_from_zero.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

REPO = Path(__file__).resolve().parents[1]
for sub in ("runtime", "operator", "router", "trainer", "."):
    sys.path.insert(0, str(REPO / sub))

from loom_operator.local.ports import free_ports  # noqa: E402
from loom_operator.local.snapshot import FleetStatus  # noqa: E402
from loom_operator.local.state import StatePaths  # noqa: E402
from loom_operator.testing.cards import card_text  # noqa: E402
from loom_operator.testing.fleet import FleetProcess, wait_for  # noqa: E402
from loom_runtime.models.tiny import init_tiny  # noqa: E402

WAIT_S = 300.0
ZERO = "    aggregated: {min: 0, max: 1}\n    scaleUpSeconds: 0\n    scaleDownSeconds: 5\n"


def first_token(endpoint: str) -> tuple[float, float]:
    """Seconds to the first streamed token and to the end of one 16-token completion."""
    client = OpenAI(base_url=endpoint, api_key="unused", max_retries=0, timeout=WAIT_S)
    started = time.monotonic()
    first = None
    stream = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=16, temperature=0.0, stream=True
    )
    for event in stream:
        if first is None and any(c.text for c in event.choices):
            first = time.monotonic() - started
    client.close()
    end = time.monotonic() - started
    return (end if first is None else first), end


def at_zero(status: FleetStatus) -> bool:
    ready = status.condition("Ready")
    return not status.workers and ready is not None and ready.reason == "ScaledToZero"


def run(
    card: Path, root: Path, env: dict[str, str], rounds: int, cold: bool
) -> list[dict[str, Any]]:
    fleet = FleetProcess(card, StatePaths(root), free_ports(1)[0], env)
    out = []
    try:
        fleet.start()
        wait_for(lambda: "OpenAI endpoint:" in fleet.output(), WAIT_S, "the endpoint")
        for i in range(rounds):
            if cold:
                fleet.wait(at_zero, WAIT_S, "the fleet idle at zero")
            else:
                fleet.wait(lambda s: any(w.ready and w.routed for w in s.workers), WAIT_S,
                           "the worker serving")  # fmt: skip
            ttft, total = first_token(fleet.endpoint)
            out.append({"round": i, "ttft_s": round(ttft, 3), "e2e_s": round(total, 3)})
            print(f"{'cold' if cold else 'warm'} round {i}: first token {ttft:.2f} s, "
                  f"end {total:.2f} s", flush=True)  # fmt: skip
    finally:
        fleet.cleanup()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO / "bench/results/scale_from_zero.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-bench-zero-") as tmp:
        result = measure(Path(tmp), args.rounds)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"median first token: cold {result['cold']['median_ttft_s']:.2f} s, "
        f"warm {result['warm']['median_ttft_s']:.3f} s"
    )
    return 0


def measure(work: Path, rounds: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", LOOM_CACHE=str(work / "cache"))
    ckpt = init_tiny(work / "tiny", seed=0)
    cards = {}
    for name, roles, section in (("cold", 0, ZERO), ("warm", 1, "")):
        cards[name] = work / f"{name}.yaml"
        text = card_text(f"file://{ckpt}", name=f"zero-{name}", roles={"aggregated": roles},
                         autoscaling=section)  # fmt: skip
        cards[name].write_text(text)
    result: dict[str, Any] = {"rounds": rounds}
    for name in ("warm", "cold"):
        rows = run(cards[name], work / f"state-{name}", env, rounds, name == "cold")
        result[name] = {"rows": rows,
                        "median_ttft_s": statistics.median(r["ttft_s"] for r in rows),
                        "median_e2e_s": statistics.median(r["e2e_s"] for r in rows)}  # fmt: skip
    result["cold_over_warm_ttft"] = round(
        result["cold"]["median_ttft_s"] / result["warm"]["median_ttft_s"], 1
    )
    return result


if __name__ == "__main__":
    raise SystemExit(main())
