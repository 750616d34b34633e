"""Serving batches of requests one after another on one engine and keeping each request's
(token, log-prob) record: what the batch-invariance tests compare, bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, RequestOutput

Records = dict[str, list[tuple[int, float]]]


def serve_waves(engine: Engine, batches: Sequence[Sequence[EngineRequest]]) -> list[Records]:
    """Each batch added at once and stepped to the end, one batch after another; then the
    engine shut down. Per batch, each request's (token, log-prob) pairs."""
    records: list[Records] = []
    try:
        for batch in batches:
            outs: dict[str, list[RequestOutput]] = {}
            for req in batch:
                engine.add_request(
                    req, lambda o, outs=outs: outs.setdefault(o.request_id, []).append(o)
                )
            while engine.step():
                pass
            records.append({
                rid: [(lp.token_id, lp.logprob) for o in got for lp in o.logprobs]
                for rid, got in outs.items()
            })  # fmt: skip
    finally:
        engine.shutdown()
    return records
