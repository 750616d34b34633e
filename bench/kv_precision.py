"""The FP8 vs FP32 KV phase of bench/long_context.py: KV bytes per token the runtime allocates
against the capacity planner's prediction, and decode speed, for the tiny llama and sparse-mla.

Owns one engine per (model, precision) and the planner's view of the same model; never prints
results or writes files (progress lines on stderr only).
"""

from __future__ import annotations

import random
import statistics
import sys
from dataclasses import dataclass

from loom_operator.fleet.kv_layout import (
    GQAAttention,
    Indexer,
    KVDtype,
    MLAAttention,
    ModelShape,
    kv_bytes_per_token,
)
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.config import SparseMlaConfig

PRECISIONS: tuple[KVDtype, ...] = ("fp32", "fp8")
GROUP = 128  # a card's quantGroupSize when it has no architecture block
NUM_BLOCKS = 64
BLOCK = 16


@dataclass(frozen=True)
class PrecisionRun:
    model: str  # llama | sparse-mla
    kv: KVDtype  # fp32 | fp8
    allocated_bytes_per_token: int  # the engine's KV pool bytes / the tokens it holds
    reported_bytes_per_token: int  # what the engine reports (loom:kv_bytes_per_token)
    planner_bytes_per_token: int  # kv_bytes_per_token of the planner's shape of the model
    decode_tok_s: float  # output tokens after the first / their wall time; median of rounds
    decode_tok_s_itl_p50: float  # 1 / the median inter-token latency (robust to slow spells)
    outputs: tuple[tuple[int, ...], ...]  # greedy tokens per round (for the record)

    @property
    def matches_planner(self) -> bool:
        return self.allocated_bytes_per_token == self.planner_bytes_per_token


def planner_shape(loaded: LoadedModel, kv: KVDtype) -> ModelShape:
    """The planner's ModelShape of a loaded tiny model. MTP layers are left out: the runtime
    caches none yet (docs/fp8-kv.md)."""
    c = loaded.config
    if isinstance(c, SparseMlaConfig):
        indexer = Indexer(
            len(c.full_indexer_layers), c.index_head_dim, c.index_topk, c.index_n_heads
        )
        return ModelShape(
            c.num_hidden_layers, c.num_attention_heads,
            MLAAttention(c.kv_lora_rank, c.qk_rope_head_dim), kv, GROUP, indexer,
        )  # fmt: skip
    assert isinstance(c, ModelConfig)
    return ModelShape(
        c.num_hidden_layers, c.num_attention_heads,
        GQAAttention(c.num_key_value_heads, c.head_dim), kv, GROUP,
    )  # fmt: skip


def decode_tok_s(
    engine: Engine, prompt: tuple[int, ...], tokens: int
) -> tuple[float, float, tuple[int, ...]]:
    """Of one greedy request alone: output tokens per second after the first one, the same from
    the median inter-token latency, and the tokens."""
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    done = engine.generate(prompt, greedy)
    m = done.metrics
    assert m.first_token_time is not None and m.last_token_time is not None
    wall = (tokens - 1) / (m.last_token_time - m.first_token_time)
    return wall, 1 / statistics.median(m.inter_token_latencies), done.output_token_ids


def engine_for(loaded: LoadedModel, kv: KVDtype) -> Engine:
    config = EngineConfig(
        block_size=BLOCK,
        num_blocks=NUM_BLOCKS,
        max_model_len=NUM_BLOCKS * BLOCK,
        dtype=loaded.model.dtype,
        kv_fp8=Fp8Format(GROUP) if kv == "fp8" else None,
    )
    engine = Engine(loaded, config)
    engine.start()
    engine.generate((5, 6, 7), SamplingParams(max_tokens=2))  # warm up
    return engine


def measure(
    name: str, loaded: LoadedModel, prompt_tokens: int, tokens: int, rounds: int
) -> list[PrecisionRun]:
    """Both precisions of one model; each round one fresh prompt on each, the order alternated
    (a slow spell of a shared machine then lands on both)."""
    engines = {kv: engine_for(loaded, kv) for kv in PRECISIONS}
    speeds: dict[KVDtype, list[float]] = {kv: [] for kv in PRECISIONS}
    itl: dict[KVDtype, list[float]] = {kv: [] for kv in PRECISIONS}
    outputs: dict[KVDtype, list[tuple[int, ...]]] = {kv: [] for kv in PRECISIONS}
    try:
        for r in range(rounds):
            rng = random.Random(1000 + r)  # fresh prompts: no prefix hit between rounds
            prompt = tuple(rng.randrange(10, 4000) for _ in range(prompt_tokens))
            for kv in PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]:
                speed, steady, out = decode_tok_s(engines[kv], prompt, tokens)
                speeds[kv].append(speed)
                itl[kv].append(steady)
                outputs[kv].append(out)
    finally:
        for engine in engines.values():
            engine.shutdown()
    runs = []
    for kv, engine in engines.items():
        stats = engine.stats()
        run = PrecisionRun(
            name, kv, stats.kv_cache_bytes // (engine.num_blocks * BLOCK),
            stats.kv_bytes_per_token, kv_bytes_per_token(planner_shape(loaded, kv)),
            statistics.median(speeds[kv]), statistics.median(itl[kv]), tuple(outputs[kv]),
        )  # fmt: skip
        print(f"  {name} {kv}: {run.allocated_bytes_per_token} B/token (planner "
              f"{run.planner_bytes_per_token}), decode {run.decode_tok_s:.1f} tok/s "
              f"({run.decode_tok_s_itl_p50:.1f} from the median inter-token latency)",
              file=sys.stderr)  # fmt: skip
        runs.append(run)
    return runs


def precision_phase(
    models: dict[str, LoadedModel], prompt_tokens: int, tokens: int, rounds: int
) -> list[PrecisionRun]:
    return [
        run
        for name, loaded in models.items()
        for run in measure(name, loaded, prompt_tokens, tokens, rounds)
    ]
