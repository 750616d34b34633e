"""MTP speculation on a parallel engine's ranks against the same ranks without it, side by side
in one run.

A DP2×EP2 engine (the reference decode's DP × EP shape on 2 gloo ranks) of the tiny sparse-mla
checkpoint (fp32, one intra-op thread per rank) serves N concurrent greedy requests with MTP
off, and with k = 3 drafts per decode step proposed, verified and settled on the ranks: drafted
by the MTP layer (random weights, so almost never accepted: the cost of drafting in vain, one
more exchange per step) and by bench/mtp_engine.py's replay drafter, right with probability
`alpha` per draft (a test double of a trained MTP head; the ranks still write the MTP rows).
Every speculative run's tokens are checked equal to MTP off. Reports the mean acceptance length,
output tokens per wall-clock second of serving (the ranks are other processes; prefill
included) and the ratio to MTP off, medians of `--rounds` (the cases alternate). Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/ranked_mtp.py [--quick] [--json P]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mtp_engine import main_with
from side_by_side import serve_together

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.types import EngineRequest
from loom_runtime.parallel.layout import ParallelLayout

LAYOUT = ParallelLayout(dp=2, ep=2)


def serve(
    checkpoint: Path, reqs: list[EngineRequest], mtp: int, drafter: Drafter | None
) -> tuple[dict[str, tuple[int, ...]], float, float]:
    """Outputs, mean acceptance length and wall seconds of serving `reqs` together on ranks."""
    config = EngineConfig(num_blocks=512, max_model_len=1024, max_num_seqs=16,
                          mtp_draft_tokens=mtp, parallel=LAYOUT,
                          collective_timeout_s=120.0)  # fmt: skip
    engine = Engine.from_checkpoint(checkpoint, config, drafter=drafter)
    try:
        start = time.perf_counter()
        outputs = serve_together(engine, reqs)
        seconds = time.perf_counter() - start
        spec = engine.stats().spec
    finally:
        engine.shutdown()
    return outputs, 1.0 if spec is None else spec.mean_acceptance_length, seconds


if __name__ == "__main__":
    sys.exit(
        main_with(__doc__ or "", serve, (40, 8, [2], [0.8]), (128, 32, [2, 8], [0.5, 0.8, 1.0]))
    )
