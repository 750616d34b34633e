"""FP8 KV against FP32 KV on the tiny llama and the tiny sparse-mla (float32 compute): over a
prompt and 16 decode steps the logits stay within the tolerance documented in docs/fp8-kv.md, and
are bit-equal to an FP32 cache that stores rows rounded by the plain reference quantiser (so the
only difference fp8 storage makes is the quantisation itself).

The sparse-mla tolerance is measured with the MoE routing replayed from the fp32 run and within
index_topk: a discrete choice (an expert, a top-k row) that flips on a near-tie makes one step's
logits jump by far more than the rounding does; docs/fp8-kv.md gives those numbers too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.runtime.kv.fp8_reference import ref_round_trip
from tests.runtime.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

from loom_runtime.kv.cache import KVStore, PagedKVCache
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla import ffn
from loom_runtime.models.sparse_mla.gating import Routing
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny

FP8 = Fp8Format(128)
DECODE_STEPS = 16
BLOCK = 16
# docs/fp8-kv.md: max |logit(fp8 KV) - logit(fp32 KV)| over the prompt's last token and 16
# decode steps, absolute and relative to the largest |logit| of the fp32 run (the worst of 5
# prompts, then over 2x margin).
LLAMA_BOUND = (0.15, 0.10)  # measured at most 0.067 / 0.046
SPARSE_BOUND = (0.40, 0.12)  # measured at most 0.171 / 0.051 (routing replayed, within top-k)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(init_tiny(tmp_path_factory.mktemp("fp8-llama") / "tiny"), torch.float32)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    root = init_tiny_sparse_mla(tmp_path_factory.mktemp("fp8-sparse") / "tiny")
    return load_model(root, dtype=torch.float32)


class RoutingReplay:
    """Records every MoE routing of a run, then hands the same ones, in order, to the next."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode: str | None = None
        self.log: list[Routing] = []
        self._route = ffn.route
        monkeypatch.setattr(ffn, "route", self.route)

    def route(self, *args: Any) -> Routing:
        if self.mode == "replay":
            return self.log.pop(0)
        routing = self._route(*args)
        if self.mode == "record":
            self.log.append(routing)
        return routing


class RefQuantPagedCache(PagedKVCache):
    """A float32 llama cache whose rows are rounded by the reference quantiser on write."""

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        g = FP8.group_size
        super().write(layer, slots, ref_round_trip(k, g), ref_round_trip(v, g))

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        return ref_round_trip(x, FP8.group_size)


class RefQuantLatentCache(LatentKVCache):
    """A float32 latent cache whose rows are rounded by the reference quantiser on write (the
    RoPE dims to BF16), as the 656-byte row stores them."""

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        g = FP8.group_size
        keys = None if index_keys is None else ref_round_trip(index_keys, g)
        rope = rope_keys.to(torch.bfloat16).to(torch.float32)
        super().write(layer, slots, ref_round_trip(latent, g), rope, keys)


def logits_over(
    loaded: LoadedModel, prompt: list[int], kv: KVStore, tokens: list[int] | None = None
) -> tuple[list[int], torch.Tensor]:
    """(decoded tokens, logits [1 + DECODE_STEPS, vocab]): the last prompt token's logits, then
    each decoded token's. The prompt runs as one chunk, then one token per step (`tokens`, or
    greedy picks when None), in blocks numbered backwards."""
    n = len(prompt) + DECODE_STEPS
    table = list(range(kv.spec.num_blocks - 1, -1, -1))[: -(-n // BLOCK)]
    rows = [step(loaded, prompt, 0, table, kv)]
    fed: list[int] = []
    for i in range(DECODE_STEPS):
        fed.append(int(rows[-1].argmax()) if tokens is None else tokens[i])
        rows.append(step(loaded, fed[-1:], len(prompt) + i, table, kv))
    return fed, torch.stack(rows)


def step(
    loaded: LoadedModel, ids: list[int], start: int, table: list[int], kv: KVStore
) -> torch.Tensor:
    end = start + len(ids)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.arange(start, end),
        query_start=[0, len(ids)],
        context_lens=[end],
        block_tables=[table[: -(-end // BLOCK)]],
        slot_mapping=torch.tensor(
            [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, end)]
        ),
        logits_indices=torch.tensor([len(ids) - 1]),
    )
    return loaded.model.forward(batch, kv)[-1]


def spec_of(loaded: LoadedModel, fp8: Fp8Format | None) -> Any:
    blocks = 2 + -(-400 // BLOCK)
    return loaded.config.kv_spec(BLOCK, blocks, torch.float32, fp8)


def prompt_of(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(10, 4000, (n,), generator=gen)]


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = float((got - ref).abs().max())
    return diff, diff / float(ref.abs().max())


Case = tuple[str, int, tuple[float, float]]
CASES: list[Case] = [
    ("llama", 48, LLAMA_BOUND),
    # prompt + 16 decodes within index_topk: every row is selected, so what is measured is
    # the rows' rounding, not a flipped top-k choice (docs/fp8-kv.md)
    ("sparse", INDEX_TOPK - DECODE_STEPS - 8, SPARSE_BOUND),
]


@pytest.mark.parametrize(("family", "prompt_len", "bound"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_kv_logits_are_within_the_documented_tolerance_of_fp32_kv(
    family: str,
    prompt_len: int,
    bound: tuple[float, float],
    seed: int,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: LoadedModel = request.getfixturevalue(family)
    prompt = prompt_of(prompt_len, seed)
    replay = RoutingReplay(monkeypatch)  # llama has no MoE: nothing to record
    replay.mode = "record"
    tokens, ref = logits_over(loaded, prompt, spec_of(loaded, None).allocate())  # greedy
    replay.mode = "replay"
    _, got = logits_over(loaded, prompt, spec_of(loaded, FP8).allocate(), tokens)
    assert not replay.log  # every recorded routing was replayed
    abs_err, rel_err = errors(got, ref)
    assert abs_err <= bound[0] and rel_err <= bound[1], (abs_err, rel_err)
    assert abs_err > 0  # the cache really stored fp8


Reference = Callable[[LoadedModel], KVStore]
REFERENCE_CACHES: dict[str, Reference] = {
    "llama": lambda m: RefQuantPagedCache(spec_of(m, None)),
    "sparse": lambda m: RefQuantLatentCache(spec_of(m, None)),
}


@pytest.mark.parametrize("family", ["llama", "sparse"])
def test_fp8_kv_logits_equal_fp32_kv_over_reference_quantised_rows(
    family: str, request: pytest.FixtureRequest
) -> None:
    """Bit-equal, at a context past index_topk too (so the sparse indexer's top-k ran)."""
    loaded: LoadedModel = request.getfixturevalue(family)
    prompt = prompt_of(INDEX_TOPK + 36, seed=7)
    tokens = prompt_of(DECODE_STEPS, seed=8)
    _, got = logits_over(loaded, prompt, spec_of(loaded, FP8).allocate(), tokens)
    _, want = logits_over(loaded, prompt, REFERENCE_CACHES[family](loaded), tokens)
    assert torch.equal(got, want)
    _, plain = logits_over(loaded, prompt, spec_of(loaded, None).allocate(), tokens)
    assert not torch.equal(got, plain)
