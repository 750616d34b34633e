"""Behaviour records under MTP speculation (float64 tiny sparse-mla): every emitted token —
an accepted draft or the verify's own — carries the log-prob of the distribution it was drawn
from, so the record with MTP on (drafts accepted at every length) has MTP off's tokens and seeds
and its log-probs within 1e-6 — not within the C2 gate's 1e-9: a verify runs k + 1 rows in one
forward, and this family routes its experts in float32, which rounds k + 1 rows and one row
differently (~1e-7 on the 130-token prompt here, ~1e-15 on the short ones)."""

from __future__ import annotations

from dataclasses import replace

from tests.runtime.engine.conftest import random_prompt
from tests.runtime.engine.spec.test_mtp_engine import (
    K,
    OracleDrafter,
    config,
    full_tokens,
    requests,
)

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.types import EngineRequest
from loom_runtime.models.loader import LoadedModel


def run(
    loaded: LoadedModel, mtp: int, reqs: list[EngineRequest], drafter: Drafter | None = None
) -> tuple[Engine, dict[str, CompletedRequest]]:
    engine = Engine(loaded, config(mtp), drafter=drafter)
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    for _ in range(10_000):
        if all(c.done.is_set() for c in got.values()):
            return engine, {k: c.result() for k, c in got.items()}
        engine.step()
    raise AssertionError("requests did not finish within 10000 steps")


def test_mtp_records_equal_mtp_offs_with_drafts_accepted_at_every_length(
    sparse64: LoadedModel,
) -> None:
    reqs = [replace(r, sampling=replace(r.sampling, behaviour=True))
            for r in requests(random_prompt)]  # fmt: skip
    _, plain = run(sparse64, 0, reqs)
    truth = full_tokens(reqs, {k: v.output_token_ids for k, v in plain.items()})
    engine, spec = run(sparse64, K, reqs, OracleDrafter(truth, sparse64.config.vocab_size))
    stats = engine.stats().spec
    assert stats is not None and all(n > 0 for n in stats.accepted_per_pos)
    for rid, want in plain.items():
        got = spec[rid]
        assert got.output_token_ids == want.output_token_ids
        assert len(got.behaviour_logprobs) == len(got.output_token_ids)
        gaps = [abs(a - b) for a, b in zip(got.behaviour_logprobs, want.behaviour_logprobs,
                                            strict=True)]  # fmt: skip
        assert max(gaps) <= 1e-6
        assert got.seed == want.seed
