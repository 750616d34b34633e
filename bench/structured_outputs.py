"""Structured outputs in the engine's batched step: 16 concurrent JSON-schema-constrained
requests against the same 16 unconstrained (the baseline), side by side in one run.

The tiny checkpoint (random weights, fp32) serves N concurrent sampled requests through `Engine`
twice per round: free (the baseline) and under a JSON schema (response_format json_schema, as
`engine/grammar/` compiles it with xgrammar). Two workloads:
  - steps: a schema whose output cannot end within max_tokens (an array of at least 400
    integers), so every decode step has N constrained rows; reports the median decode step
    (ms) of each side, their difference, and the mask alone (one bitmask for the N rows filled
    by their matchers and applied to the logits, `apply_grammar_masks`) timed on the same rows;
  - requests: a small object schema (a string of at most 8 characters, an integer 1..99, a
    boolean; no free whitespace, vLLM's disable_any_whitespace: a random model's whitespace
    runs would otherwise outlast any budget) that ends by itself; reports output tokens/s and
    requests/s of the whole run (the free side runs all 96 tokens of its budget), and checks
    every constrained output parses and matches its schema (`identical` in the JSON: all
    valid).
Medians of `--rounds`. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/structured_outputs.py [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from side_by_side import bench_args, median_rows, report, serve_timed

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.grammar.mask import apply_grammar_masks
from loom_runtime.engine.grammar.matcher import GrammarState
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.wire.openai.structured import GrammarSpec

STEP_SCHEMA = {
    "type": "object",
    "properties": {"values": {"type": "array", "minItems": 400,
                              "items": {"type": "integer", "minimum": 0, "maximum": 999}}},
    "required": ["values"],
}  # fmt: skip
ANSWER_PROPERTIES = {
    "city": {"type": "string", "maxLength": 8},
    "rank": {"type": "integer", "minimum": 1, "maximum": 99},
    "open": {"type": "boolean"},
}
ANSWER_SCHEMA = {"type": "object", "properties": ANSWER_PROPERTIES,
                 "required": list(ANSWER_PROPERTIES), "additionalProperties": False}  # fmt: skip
PARAM = "response_format.json_schema.schema"
ANSWER_TOKENS = 96  # each request's budget in the requests workload (an answer needs ~30)


@dataclass(frozen=True)
class Row:
    workload: str  # steps | requests
    side: str  # free (baseline) | json_schema
    concurrency: int
    step_ms: float  # median decode step with every row running (steps workload; else 0)
    mask_ms: float  # the mask alone per step, N rows (json_schema side of steps; else 0)
    tokens_per_s: float
    requests_per_s: float
    identical: bool  # every constrained output parsed and matched its schema (free: True)


def _valid_answer(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(doc, dict) and set(doc) == set(ANSWER_PROPERTIES)
        and isinstance(doc["city"], str) and len(doc["city"]) <= 8
        and type(doc["rank"]) is int and 1 <= doc["rank"] <= 99 and type(doc["open"]) is bool
    )  # fmt: skip


def _requests(tag: str, n: int, sampling: SamplingParams) -> list[EngineRequest]:
    gen = torch.Generator().manual_seed(zlib.crc32(tag.encode()))
    return [
        EngineRequest(f"{tag}-{i}", tuple(int(t) for t in torch.randint(10, 4000, (24,),
                                                                         generator=gen)),
                      replace(sampling, seed=i))
        for i in range(n)
    ]  # fmt: skip


def _run(engine: Engine, reqs: list[EngineRequest]) -> tuple[list[str], list[float], float, int]:
    """Serve `reqs` together: their texts, the wall time of each step in which all of them were
    decoding, the whole run's seconds and its output tokens."""
    served = serve_timed(engine, reqs, clock=time.perf_counter)
    return [d.text for d in served.done], served.steps[1:], served.wall, served.tokens


def _mask_ms(engine: Engine, n: int, vocab: int, repeats: int) -> float:
    """The mask alone for n rows midway through STEP_SCHEMA's output (one bitmask, applied)."""
    compiled = engine.grammars.compile(GrammarSpec("json", json.dumps(STEP_SCHEMA), PARAM))
    states = [GrammarState(compiled) for _ in range(n)]
    for state in states:
        for token in engine.tokenizer.encode('{"values": [1, 22, 333, ', add_special_tokens=False):
            state.accept(token)
    logits = torch.randn(n, vocab)
    times = []
    for _ in range(repeats):
        x = logits.clone()
        t = time.perf_counter()
        apply_grammar_masks(x, list(states))
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def _round(engine: Engine, n: int, max_tokens: int, vocab: int, k: int) -> list[Row]:
    free = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    steps_spec = GrammarSpec("json", json.dumps(STEP_SCHEMA), PARAM, any_whitespace=False)
    answer_spec = GrammarSpec("json", json.dumps(ANSWER_SCHEMA), PARAM, any_whitespace=False)
    rows = []
    for side, spec in (("free (baseline)", None), ("json_schema", steps_spec)):
        reqs = _requests(f"s{k}{side}", n, replace(free, grammar=spec))
        _, steps, wall, tokens = _run(engine, reqs)
        mask = _mask_ms(engine, n, vocab, 50) if spec is not None else 0.0
        rows.append(Row("steps", side, n, 1000 * statistics.median(steps), mask, tokens / wall,
                        n / wall, True))  # fmt: skip
    answers = replace(free, max_tokens=ANSWER_TOKENS)  # room for the whole answer
    for side, spec in (("free (baseline)", None), ("json_schema", answer_spec)):
        sampling = replace(answers, grammar=spec, ignore_eos=spec is None)
        texts, _, wall, tokens = _run(engine, _requests(f"r{k}{side}", n, sampling))
        valid = spec is None or all(_valid_answer(t) for t in texts)
        rows.append(Row("requests", side, n, 0.0, 0.0, tokens / wall, n / wall, valid))
    return rows


def main() -> int:
    args = bench_args(__doc__ or "")
    n, max_tokens, rounds = (4, 12, 1) if args.quick else (16, 64, args.rounds)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(init_tiny(Path(tmp) / "tiny"), dtype=torch.float32)
        config = EngineConfig(dtype=torch.float32, max_model_len=512, num_blocks=n * 8 + 16,
                              max_num_seqs=max(16, n))  # fmt: skip
        engine = Engine(loaded, config)
        vocab = loaded.config.vocab_size
        _round(engine, n, max_tokens, vocab, -1)  # warm-up: compiled grammars, first forwards
        rows = median_rows(
            [_round(engine, n, max_tokens, vocab, k) for k in range(rounds)],
            ("step_ms", "mask_ms", "tokens_per_s", "requests_per_s"),
        )
    columns = [("workload", "---"), ("side", "---"), ("concurrent", "--:"),
               ("step ms", "--:"), ("mask ms", "--:"), ("tok/s", "--:"), ("req/s", "--:"),
               ("valid", "---")]  # fmt: skip
    return report(columns, rows, lambda r: [
        r.workload, r.side, str(r.concurrency), f"{r.step_ms:.2f}", f"{r.mask_ms:.3f}",
        f"{r.tokens_per_s:.0f}", f"{r.requests_per_s:.2f}", "yes" if r.identical else "NO",
    ], args.json)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
