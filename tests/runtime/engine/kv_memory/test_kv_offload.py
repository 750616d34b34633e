"""CPU KV offload gates (float64, greedy): a prefix evicted from a small device pool and reloaded
from the host tier gives the same tokens as recomputing it, and the reloaded KV bytes are the
bytes recompute writes; the tier's blocks are announced with medium CPU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.runtime.engine.push_helpers import stage

from loom_router.core.kv_events import decode_batch, index_key
from loom_router.core.prefix_index import PrefixIndex
from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.offload import ReloadJob
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.wire.kv_event_codec import encode_batch
from loom_runtime.wire.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    EventBuffer,
)

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]

# 8 blocks of 16 tokens: one request of max_model_len 128 fills the device pool, so the second
# prompt evicts most of the first one's cached blocks.
SMALL = {"dtype": torch.float64, "max_model_len": 128, "num_blocks": 8, "block_size": 16}


def small_engine(
    model: LoadedModel,
    gib: float,
    events: EventBuffer | None = None,
    async_reload: bool = True,
    kv_fp8: Fp8Format | None = None,
) -> Engine:
    config = EngineConfig(
        kv_offload_gib=gib,
        kv_reload_async=async_reload,
        kv_fp8=kv_fp8,
        **SMALL,  # type: ignore[arg-type]
    )
    return Engine(model, config, events)


def turns(engine: Engine, first: tuple[int, ...], other: tuple[int, ...], sampling: SamplingParams
          ) -> list[CompletedRequest]:  # fmt: skip
    """first, then other (evicting first's blocks), then first again."""
    return [engine.generate(p, sampling) for p in (first, other, first)]


def prefix_rows(engine: Engine, prompt: tuple[int, ...]) -> torch.Tensor:
    """The device cache bytes of the prompt's cached full blocks, in order."""
    kv = engine._kv  # the test reads the cache the engine wrote
    hashes = kv.hasher.hash_blocks(prompt[: (len(prompt) - 1) // kv.block_size * kv.block_size])
    ids = kv.pool.lookup(hashes)
    assert len(ids) == len(hashes), "the prompt's blocks should be device-resident after its run"
    return engine._runner.cache.data[torch.tensor(ids)].clone()


@pytest.mark.parametrize(
    ("async_reload", "fp8", "family"),
    [(True, False, "llama"), (False, False, "llama"), (True, True, "llama"),
     (True, False, "sparse-mla")],
    ids=["copy-thread", "in-step", "fp8-rows", "sparse-mla-latent"],
)  # fmt: skip
def test_offload_hit_reload_equals_recompute(
    request: pytest.FixtureRequest,
    prompt: Prompt,
    greedy: Greedy,
    async_reload: bool,
    fp8: bool,
    family: str,
) -> None:
    model: LoadedModel = request.getfixturevalue("tiny64" if family == "llama" else "sparse64")
    first, other = prompt(81, 1), prompt(100, 2)
    kv_fp8 = Fp8Format(32) if fp8 else None
    offload = small_engine(model, gib=0.01, async_reload=async_reload, kv_fp8=kv_fp8)
    recompute = small_engine(model, gib=0.0, kv_fp8=kv_fp8)
    got = [offload.generate(first, greedy(8))]
    computed = prefix_rows(offload, first)  # the bytes the first turn wrote
    got += [offload.generate(p, greedy(8)) for p in (other, first)]
    want = turns(recompute, first, other, greedy(8))

    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in want]
    assert got[2].output_token_ids == got[0].output_token_ids
    stats = offload.stats()
    assert stats.kv_offloaded_blocks > 0 and stats.kv_reload_tokens > 0
    assert stats.kv_reload_bytes == stats.kv_reload_tokens // 16 * offload._offload.host.block_bytes
    # The reloaded tokens were not run through the model again: that is the point.
    assert recompute.tokens_run - offload.tokens_run == stats.kv_reload_tokens
    assert got[2].num_cached_tokens == want[2].num_cached_tokens + stats.kv_reload_tokens
    # Bit for bit: the reload copied back what the first turn computed ...
    reloaded, recomputed = prefix_rows(offload, first), prefix_rows(recompute, first)
    assert torch.equal(reloaded, computed)
    # ... which is what recompute writes: exactly for llama, whose rows do not depend on how
    # the prompt was chunked; sparse-mla's recompute (a chunk after the device hit) differs from
    # the one-chunk first turn in the last float64 bits only.
    if family == "llama":
        assert torch.equal(reloaded, recomputed)
    else:
        torch.testing.assert_close(reloaded, recomputed, rtol=0, atol=1e-12)


def test_offloaded_blocks_are_announced_with_medium_cpu(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    events = EventBuffer()
    engine = small_engine(tiny64, gib=0.01, events=events)
    turns(engine, prompt(81, 1), prompt(100, 2), greedy(4))
    taken = events.take()
    removed_gpu = {h for e in taken if isinstance(e, BlockRemoved) and e.medium == MEDIUM_GPU
                   for h in e.block_hashes}  # fmt: skip
    stored_cpu = [e for e in taken if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU]
    assert stored_cpu and removed_gpu
    offloaded = {h for e in stored_cpu for h in e.block_hashes}
    assert offloaded == removed_gpu  # every evicted cached block went to the host tier
    assert all(e.parent_block_hash is None and e.token_ids == () for e in stored_cpu)
    assert all(e.block_size == 16 for e in stored_cpu)
    # Each CPU store comes before the GPU removal of the same block: the router never loses it.
    first_cpu = min(i for i, e in enumerate(taken) if e in stored_cpu)
    first_removed = min(
        i for i, e in enumerate(taken) if isinstance(e, BlockRemoved) and e.medium == MEDIUM_GPU
    )
    assert first_cpu < first_removed


def test_weight_reload_clears_the_host_tier(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = small_engine(tiny64, gib=0.01)
    turns(engine, prompt(81, 1), prompt(100, 2), greedy(2))
    assert engine.stats().kv_offload_used_bytes > 0
    engine._kv.reset_prefix_cache()  # what load_weights does
    engine.step()  # the stats snapshot is taken at a step boundary
    assert engine.stats().kv_offload_used_bytes == 0


@pytest.mark.parametrize("gib", [-1.0, float("nan")])
def test_negative_offload_size_is_refused_with_what_to_do(gib: float) -> None:
    with pytest.raises(
        ValueError, match=r"kv_offload_gib must be >= 0 .* 0 turns CPU KV offload off"
    ):
        EngineConfig(kv_offload_gib=gib)


def test_offload_without_prefix_caching_is_refused() -> None:
    with pytest.raises(ValueError, match="needs prefix_caching"):
        EngineConfig(kv_offload_gib=1.0, prefix_caching=False)


def test_the_routers_index_sees_offloaded_prefixes_as_host_blocks(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    """The engine's events, over vLLM's wire, into the router's precise index: the prompt whose
    blocks went to the host tier is matched in full, and the offloaded run is host blocks."""
    events = EventBuffer()
    engine = small_engine(tiny64, gib=0.01, events=events)
    first = prompt(81, 1)
    engine.generate(first, greedy(2))
    engine.generate(prompt(100, 2), greedy(2))  # evicts most of first's blocks to the host
    index = PrefixIndex(hasher=engine._kv.hasher)
    index.apply_batch("w", decode_batch(encode_batch(0.0, events.take(), 0)))
    keys = [index_key(x) for x in engine._kv.hasher.hash_blocks(first[:80])]
    on_device = len(engine._kv.pool.lookup(engine._kv.hasher.hash_blocks(first[:80])))
    assert 0 < on_device < len(keys)
    assert index.match(["w"], keys) == {"w": len(keys)}
    assert index.host_blocks(["w"], keys) == {"w": len(keys) - on_device}
    assert not index.stats().hash_problems


class Gate:
    """Holds the engine's reload copies until opened (what a slow host-to-device copy looks like
    to the step loop)."""

    def __init__(self, engine: Engine) -> None:
        offload = engine._offload
        assert offload is not None
        self.opened = threading.Event()
        self.copy = offload.copy
        offload.copy = self  # type: ignore[method-assign]

    def __call__(self, job: ReloadJob) -> None:
        assert self.opened.wait(30), "the test never opened the gate"
        self.copy(job)


def step_until(engine: Engine, done: Callable[[], bool], steps: int = 2000) -> None:
    for _ in range(steps):
        if done():
            return
        engine.step()
    raise AssertionError(f"not done after {steps} steps")


def reload_beside_another(
    engine: Engine, first: tuple[int, ...], prompt: Prompt, greedy: Greedy, other_tokens: int
) -> tuple[Gate, dict[str, OutputCollector]]:
    """`first` (run once already) evicted to the host tier by another prompt, then sent again
    ("again": its copy held by the returned gate) beside a request "other" of `other_tokens`."""
    engine.generate(prompt(100, 2), greedy(8))  # evicts first's tail to the host tier
    gate = Gate(engine)
    other = EngineRequest("other", prompt(5, 3), greedy(other_tokens))
    again = EngineRequest("again", first, greedy(8))
    got = {r.request_id: OutputCollector(r) for r in (other, again)}
    for r in (other, again):
        engine.add_request(r, got[r.request_id])
    return gate, got


def test_the_step_loop_runs_other_requests_while_a_prefix_reloads(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = small_engine(tiny64, gib=0.01)
    first = prompt(65, 1)
    alone = engine.generate(first, greedy(8))
    gate, got = reload_beside_another(engine, first, prompt, greedy, 20)
    step_until(engine, lambda: len(got["other"].outputs) >= 5)
    assert not got["again"].outputs  # still waiting for its prefix, holding its blocks
    gate.opened.set()
    step_until(engine, lambda: all(c.done.is_set() for c in got.values()))
    assert got["again"].result().output_token_ids == alone.output_token_ids
    assert got["again"].result().num_cached_tokens == 64
    assert engine.stats().kv_reload_tokens == 48
    engine._pool.assert_whole()


def test_a_request_aborted_while_reloading_finishes_after_its_copy(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = small_engine(tiny64, gib=0.01)
    first = prompt(65, 1)
    engine.generate(first, greedy(8))
    engine.generate(prompt(100, 2), greedy(8))
    gate = Gate(engine)
    req = EngineRequest("again", first, greedy(8))
    out = OutputCollector(req)
    engine.add_request(req, out)
    engine.step()  # admitted: its blocks are being written
    engine.abort("again")
    for _ in range(3):
        engine.step()
    assert not out.done.is_set()  # its blocks are still being written: not freed yet
    gate.opened.set()
    step_until(engine, out.done.is_set)
    assert out.result().finish_reason == "abort"
    engine._pool.assert_whole()
    assert engine._offload is not None and not engine._offload.host._pins
    engine.shutdown()


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_keep_swap_while_a_prefix_reloads_computes_it_under_the_new_weights(
    tiny_dir: Path, prompt: Prompt, greedy: Greedy, tmp_path: Path, kv: str
) -> None:
    """A keep swap comes while `again`'s 48 host-tier tokens are being copied in (its first
    16 hit the device): the copy lands uncached (it is KV of the old weights, from a tier the
    swap emptied) and those tokens are computed under v2. keep: the 16 device tokens stay, so
    its tokens are those of a request swapped after a 16-token prefill chunk; recompute: it
    re-prefills, as a fresh v2 run. A request running beside it carries on as in any keep swap;
    nothing leaks (blocks, pins)."""
    new_dir = init_tiny(tmp_path / "v2", seed=1)
    v2 = load_model(new_dir, dtype=torch.float64)
    staged = stage(v2.model.targets(), "v2", tmp_path / "staged")  # type: ignore[operator]
    engine = small_engine(load_model(tiny_dir, dtype=torch.float64), gib=0.01)
    first = prompt(65, 1)
    engine.generate(first, greedy(8))
    gate, got = reload_beside_another(engine, first, prompt, greedy, 12)
    step_until(engine, lambda: len(got["other"].outputs) >= 3)
    engine.load_pushed_keep(staged, kv)
    gate.opened.set()
    step_until(engine, lambda: all(c.done.is_set() for c in got.values()))
    result = got["again"].result()
    assert {o.weights_version for o in got["again"].outputs if o.new_token_ids} == {"v2"}
    assert engine.stats().kv_reload_tokens == 0  # the copy landed uncached
    if kv == "recompute":
        want = Engine(v2, EngineConfig(**SMALL)).generate(first, greedy(8))  # type: ignore[arg-type]
        assert result.output_token_ids == want.output_token_ids
    else:
        want = swapped_after_a_chunk(tiny_dir, new_dir, first, greedy(8), tmp_path)
        assert result.output_token_ids == want
    engine._pool.assert_whole()
    assert engine._offload is not None and not engine._offload.host._pins
    engine.shutdown()


def swapped_after_a_chunk(old: Path, new: Path, p: tuple[int, ...], sampling: SamplingParams,
                          tmp_path: Path) -> tuple[int, ...]:  # fmt: skip
    """`p`'s tokens when a keep swap to `new` comes after its first 16-token prefill chunk."""
    config = EngineConfig(max_num_batched_tokens=16, **SMALL)  # type: ignore[arg-type]
    engine = Engine(load_model(old, dtype=torch.float64), config)
    targets = load_model(new, dtype=torch.float64).model.targets()  # type: ignore[operator]
    outs: list[RequestOutput] = []
    engine.add_request(EngineRequest("chunked", p, sampling), outs.append)
    engine.step()
    engine.load_pushed_keep(stage(targets, "v2", tmp_path / "staged-chunked"), "keep")
    while engine.in_flight():
        engine.step()
    return tuple(t for o in outs for t in o.new_token_ids)


def test_a_later_keep_does_not_undo_an_earlier_recompute_of_a_reloading_prefix(
    tiny_dir: Path, prompt: Prompt, greedy: Greedy, tmp_path: Path
) -> None:
    """Two keep swaps while `again`'s copy is held, v2 with kv recompute, then v3 with kv keep:
    the first swap's promise stands, so `again` re-prefills under v3 (a fresh v3 run), not
    keeping its 16 device tokens of v1."""
    engine = small_engine(load_model(tiny_dir, dtype=torch.float64), gib=0.01)
    first = prompt(65, 1)
    engine.generate(first, greedy(8))
    gate, got = reload_beside_another(engine, first, prompt, greedy, 12)
    step_until(engine, lambda: len(got["other"].outputs) >= 3)
    for seed, version, kv in ((1, "v2", "recompute"), (2, "v3", "keep")):
        model = load_model(init_tiny(tmp_path / version, seed=seed), dtype=torch.float64)
        engine.load_pushed_keep(
            stage(model.model.targets(), version, tmp_path / f"s-{version}"), kv
        )  # type: ignore[operator]
    gate.opened.set()
    step_until(engine, lambda: all(c.done.is_set() for c in got.values()))
    v3 = Engine(model, EngineConfig(**SMALL)).generate(first, greedy(8))  # type: ignore[arg-type]
    assert got["again"].result().output_token_ids == v3.output_token_ids
    engine._pool.assert_whole()
    engine.shutdown()
