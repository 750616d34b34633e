"""Fixtures for the engine tests: the tiny checkpoint (float64 for parity, float32 for speed),
the plain way to run a request (one AR-decode loop alone on the production step: a batcher of
one sequence, no prefix cache, the whole prompt in one chunk) and a forward spy
that records what actually ran through the model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from tests.runtime.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState, CompletedRequest
from loom_runtime.engine.batcher import Batcher
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.runner import TOKEN_FORWARD, ModelRunner
from loom_runtime.engine.token_forward import TokenForward, TokenResult
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.loop.contract import LoopContext, WorkPlan
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny
from loom_runtime.wire.prefix_hash import PrefixHasher


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny sparse-mla checkpoint's directory (one per module: engines and ranks mutate
    nothing in it, but a module's tests stay independent of another's)."""
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("engine-sparse") / "tiny")


@pytest.fixture(scope="module")
def sparse64(sparse_dir: Path) -> LoadedModel:
    """That checkpoint loaded in float64."""
    return load_model(sparse_dir, dtype=torch.float64)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("engine-tiny") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny64(tiny_dir: Path) -> LoadedModel:
    return load_model(tiny_dir, dtype=torch.float64)


@pytest.fixture(scope="session")
def tiny32(tiny_dir: Path) -> LoadedModel:
    return load_model(tiny_dir, dtype=torch.float32)


def random_prompt(n: int, seed: int, vocab: int = 4000) -> tuple[int, ...]:
    """n token ids in 10..vocab-1 (no special tokens), reproducible from the seed."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(10, vocab, (n,), generator=gen))


@pytest.fixture
def prompt() -> Callable[[int, int], tuple[int, ...]]:
    return random_prompt


PlainRun = Callable[[EngineRequest], CompletedRequest]


@pytest.fixture
def plain(tiny64: LoadedModel) -> PlainRun:
    """The plain way: one request alone on the production step, float64, unbatched, uncached."""
    return make_plain(tiny64)


@dataclass
class LoopRig:
    """One AR-decode loop over its own KV cache, with the production executor of its plans.

    `executed` records every plan the executor ran with its result, in order.
    """

    loop: ARDecodeLoop
    forward: TokenForward
    executed: list[tuple[WorkPlan[TokenResult], TokenResult]] = field(default_factory=list)

    def execute(self, plans: list[WorkPlan[TokenResult]]) -> list[TokenResult]:
        results = self.forward.execute(plans)
        self.executed.extend(zip(plans, results, strict=True))
        return results

    def batcher(
        self, emit: Callable[[RequestOutput], None], token_budget: int = 2048, max_num_seqs: int = 1
    ) -> Batcher:
        return Batcher(self.loop, {TOKEN_FORWARD: self}, (token_budget, max_num_seqs), emit)

    def drive(
        self, req: EngineRequest, ctx: LoopContext | None = None, token_budget: int = 2048
    ) -> tuple[ARDecodeState, list[RequestOutput]]:
        """Run one request to its end alone on a batcher; its state and every output."""
        outs: list[RequestOutput] = []
        batcher = self.batcher(outs.append, token_budget)
        state = self.loop.init(req, ctx or LoopContext())
        batcher.add(state)
        while batcher.step():
            pass
        assert outs and outs[-1].finished and not batcher.has_work
        return state, outs

    def run_alone(
        self, req: EngineRequest, ctx: LoopContext | None = None, token_budget: int = 2048
    ) -> CompletedRequest:
        """The whole result, gathered from the streamed outputs as Engine.generate does."""
        collector = OutputCollector(req)
        for out in self.drive(req, ctx, token_budget)[1]:
            collector(out)
        return collector.result()


def build_loop(
    loaded: LoadedModel,
    num_blocks: int,
    block_size: int = 16,
    eos_token_ids: tuple[int, ...] | None = None,
    prefix_caching: bool = False,
) -> LoopRig:
    spec = loaded.config.kv_spec(block_size, num_blocks, loaded.model.dtype)
    loop = ARDecodeLoop(
        KVAllocator(BlockPool(num_blocks, block_size), PrefixHasher(block_size)),
        new_decoder=loaded.tokenizer.incremental_decoder,
        eos_token_ids=loaded.tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids,
        prefix_caching=prefix_caching,
    )
    return LoopRig(loop, TokenForward(ModelRunner(loaded.model, PagedKVCache(spec))))


@pytest.fixture
def make_loop() -> Callable[..., LoopRig]:
    """make_loop(loaded, num_blocks, block_size=16, eos_token_ids=None, prefix_caching=False)."""
    return build_loop


def make_plain(loaded: LoadedModel, block_size: int = 16) -> PlainRun:
    def run(req: EngineRequest) -> CompletedRequest:
        total = len(req.prompt_token_ids) + req.sampling.max_tokens
        rig = build_loop(loaded, -(-total // block_size), block_size)
        out = rig.run_alone(req, LoopContext(weights_version="plain"), token_budget=total)
        assert rig.loop.kv.pool.is_whole()
        return out

    return run


@pytest.fixture
def greedy() -> Callable[..., SamplingParams]:
    """greedy(max_tokens, **more) -> greedy SamplingParams that ignore EOS (fixed lengths)."""

    def make(max_tokens: int, **more: object) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **more)  # type: ignore[arg-type]

    return make


@dataclass
class ForwardSpy:
    """Wraps a model's forward and records each batch's per-sequence query lengths."""

    batches: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(sum(b) for b in self.batches)


@pytest.fixture
def spy_forward() -> Iterator[Callable[[LoadedModel], ForwardSpy]]:
    """spy_forward(loaded) -> ForwardSpy; the model's forward is restored after the test."""
    restore: list[tuple[object, object]] = []

    def install(loaded: LoadedModel) -> ForwardSpy:
        spy = ForwardSpy()
        model = loaded.model
        original = model.forward

        def forward(batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
            qs = batch.query_start
            spy.batches.append([qs[i + 1] - qs[i] for i in range(batch.num_seqs)])
            return original(batch, kv)

        model.forward = forward  # type: ignore[method-assign]
        restore.append((model, original))
        return spy

    yield install
    for model, _ in reversed(restore):
        del model.forward  # type: ignore[attr-defined]
