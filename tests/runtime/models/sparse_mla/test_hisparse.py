"""Hybrid HiSparse decode (float64, greedy, index_topk 64 < the contexts): with the latent rows
in a host tier and only the selected misses copied in through a hot buffer smaller than the
decode's working set, 64 decode steps give the all-on-device paged forward's tokens and logits,
on 2k-token contexts (two sequences batched, chunked prefill) and a 16k-token one; only the
misses' rows cross host -> device."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch
from tests.runtime.models.paged_batch import paged_batch

from loom_runtime.kv.cache import KVStore
from loom_runtime.kv.hisparse_cache import HiSparseKVCache, HiSparseSpec, default_hot_slots
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.models.tiny_tokenizer import corpus_text

BLOCK = 16
CHUNK = 1024  # prefill chunk tokens


@dataclass
class Driver:
    """Test double of the engine's KV manager + runner over any sparse-mla KV store: shuffled
    blocks per sequence, one ForwardBatch per step, greedy next tokens."""

    lm: SparseMlaCausalLM
    kv: KVStore
    free: list[int]
    tables: dict[str, list[int]] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)

    def step(self, chunks: Sequence[tuple[str, Sequence[int]]]) -> torch.Tensor:
        """One forward over (sequence, new tokens); the last token's logits per sequence."""
        batch = paged_batch(chunks, self.tables, self.lengths, self.free, BLOCK, True)
        return self.lm.forward(batch, self.kv)


def prompts(ours: LoadedSparseMla, lengths: Sequence[int]) -> list[list[int]]:
    """Prompts of the corpus's tokens (repeated as needed), each from its own offset."""
    ids = ours.tokenizer.encode(corpus_text())
    out = []
    for n, length in enumerate(lengths):
        need = length + 97 * n
        reps = ids * (need // len(ids) + 1)
        out.append(reps[97 * n : 97 * n + length])
    return out


def prefill(driver: Driver, seqs: dict[str, list[int]]) -> None:
    """Chunked prefill of every prompt but its last token."""
    for seq, prompt in seqs.items():
        for at in range(0, len(prompt) - 1, CHUNK):
            driver.step([(seq, prompt[at : min(at + CHUNK, len(prompt) - 1)])])


def decode(driver: Driver, seqs: dict[str, list[int]], steps: int) -> list[torch.Tensor]:
    """`steps` batched greedy decode steps from each prompt's last token; logits per step."""
    last = {seq: [p[-1]] for seq, p in seqs.items()}
    out = []
    for _ in range(steps):
        logits = driver.step([(seq, tok) for seq, tok in last.items()])
        out.append(logits)
        last = {seq: [int(row.argmax())] for seq, row in zip(last, logits, strict=True)}
    return out


def run(driver: Driver, seqs: dict[str, list[int]], steps: int) -> list[torch.Tensor]:
    prefill(driver, seqs)
    return decode(driver, seqs, steps)


def drivers(
    ours: LoadedSparseMla, num_blocks: int, hot_slots: int
) -> tuple[Driver, Driver, HiSparseKVCache]:
    lm = SparseMlaCausalLM(ours.model)
    spec = ours.config.kv_spec(BLOCK, num_blocks, torch.float64)
    order = list(range(num_blocks))
    random.Random(0).shuffle(order)
    device = Driver(lm, spec.allocate(), list(order))
    hisparse = HiSparseSpec(spec, hot_slots=hot_slots, max_requests=4).allocate()
    return device, Driver(lm, hisparse, list(order)), hisparse


def assert_same_decode(want: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(want) == len(got)
    for step, (w, g) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(w.argmax(-1), g.argmax(-1)), f"greedy tokens differ at step {step}"
        assert torch.equal(w, g), f"logits differ at decode step {step}"


def test_hisparse_decode_equals_all_on_device_decode_on_2k_contexts(
    ours: LoadedSparseMla,
) -> None:
    topk = ours.config.index_topk
    a, b = prompts(ours, [2048, 1500])
    hot = default_hot_slots(topk)
    device, hi, kv = drivers(ours, num_blocks=(2048 + 1500 + 256) // BLOCK, hot_slots=hot)
    seqs = {"a": a, "b": b}
    want = run(device, seqs, 64)
    prefill(hi, seqs)
    assert kv.counters.misses == 0  # prefill chunks copy their selected rows for the step only
    assert kv.counters.prefill_h2d_bytes > 0
    got = decode(hi, seqs, 64)
    assert_same_decode(want, got)

    c = kv.counters
    layers = ours.config.num_hidden_layers
    assert c.misses > layers * 2 * hot  # both sequences' buffers overflowed: LRU evicted rows
    assert c.hits > 0 and c.resident > 0
    assert c.h2d_bytes == c.misses * kv.spec.row_bytes
    selected = c.hits + c.misses + c.resident
    assert selected == 64 * 2 * layers * topk  # every decode query picked top-k of >> k tokens
    # the host tier was read only for the misses: far less than the context each step
    all_rows = 64 * layers * (2048 + 1500 + 64) * kv.spec.row_bytes
    assert c.h2d_bytes < all_rows / 8


@pytest.mark.parametrize(
    "context", [8192, pytest.param(16384, marks=[pytest.mark.slow, pytest.mark.timeout(900)])]
)
def test_hisparse_decode_equals_all_on_device_decode_on_a_long_context(
    ours: LoadedSparseMla, context: int
) -> None:
    """The prompt is prefilled once on the device and its blocks loaded into the tiers (as a
    P/D transfer would land them); then both decode 64 steps."""
    (prompt,) = prompts(ours, [context])
    hot = ours.config.index_topk + 1  # the smallest buffer a decode's selection fits in
    device, hi, kv = drivers(ours, num_blocks=(context + 128) // BLOCK, hot_slots=hot)
    prefill(device, {"long": prompt})
    assert isinstance(device.kv, LatentKVCache)
    kv.load_blocks(device.kv, torch.tensor(device.tables["long"]))
    hi.tables, hi.lengths = {"long": list(device.tables["long"])}, dict(device.lengths)
    hi.free = list(device.free)
    got = decode(hi, {"long": prompt}, 64)
    want = decode(device, {"long": prompt}, 64)
    assert_same_decode(want, got)
    c = kv.counters
    assert c.misses > ours.config.num_hidden_layers * hot
    assert c.h2d_bytes == c.misses * kv.spec.row_bytes and c.prefill_h2d_bytes == 0
    kv.release("long")
    assert kv.hot_requests == 0
