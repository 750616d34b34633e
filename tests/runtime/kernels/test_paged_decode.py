"""Loom's CPU decode-attention kernel against the torch path and a float64 reference, built and
loaded for real (this machine has g++; the kernel is compiled once into the per-machine cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loom_runtime import kernels
from loom_runtime.kernels import build
from loom_runtime.kv.cache import KVCacheSpec, PagedKVCache
from loom_runtime.models.attention import DecodeGroup, decode_by_sequence, plan_attention
from loom_runtime.models.batch import ForwardBatch


def test_the_kernels_build_and_load_on_this_machine() -> None:
    status = kernels.status()
    assert status.loaded, status.reason


def decode_case(
    contexts: list[int],
    block_size: int,
    kv_heads: int,
    rep: int,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, PagedKVCache, DecodeGroup]:
    """Random queries and a random pool; each sequence's blocks scattered over it."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in contexts]
    spec = KVCacheSpec(2, kv_heads, head_dim, block_size, sum(need) + 5, dtype)
    kv = spec.allocate()
    kv.data.copy_(torch.randn(kv.data.shape, generator=gen).to(dtype))
    order = torch.randperm(spec.num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at : at + n])
        at += n
    b = len(contexts)
    batch = ForwardBatch(
        input_ids=torch.zeros(b, dtype=torch.long),
        positions=torch.tensor([n - 1 for n in contexts]),
        query_start=list(range(b + 1)),
        context_lens=contexts,
        block_tables=tables,
        slot_mapping=torch.zeros(b, dtype=torch.long),
        logits_indices=torch.arange(b),
        request_ids=tuple(f"r{i}" for i in range(b)),
    )
    group = plan_attention(batch, block_size, torch.device("cpu")).decode
    assert group is not None
    q = torch.randn(b, kv_heads * rep, head_dim, generator=gen).to(dtype)
    return q, kv, group


def kernel(q: torch.Tensor, kv: PagedKVCache, layer: int, group: DecodeGroup) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    return kernels.paged_decode(
        q, kv.data, layer, group.blocks, group.starts, group.context_lens, scale
    )


def reference(q: torch.Tensor, kv: PagedKVCache, layer: int, group: DecodeGroup) -> torch.Tensor:
    """Plain float64 softmax(q k^T) v, one sequence and head at a time."""
    keys, values = kv.gather(layer, group.blocks)
    rep = q.shape[1] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j, (at, length) in enumerate(group.spans):
        k = keys[at : at + length].double().repeat_interleave(rep, dim=1)  # [L, H, D]
        v = values[at : at + length].double().repeat_interleave(rep, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[j].double(), k) * q.shape[-1] ** -0.5
        out[j] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v)
    return out


@pytest.mark.parametrize(
    ("contexts", "block_size", "kv_heads", "rep"),
    [
        ([1, 2, 17, 300, 511], 16, 2, 3),  # GQA 3:1, partial last blocks, a one-key sequence
        ([5, 64, 129], 16, 1, 4),  # multi-query
        ([33, 7], 1, 4, 1),  # plain multi-head, one token per block
        ([100] * 16, 32, 2, 2),
    ],
)
def test_the_kernel_matches_the_torch_path_and_a_float64_reference(
    contexts: list[int], block_size: int, kv_heads: int, rep: int
) -> None:
    q, kv, group = decode_case(contexts, block_size, kv_heads, rep)
    for layer in (0, 1):
        got = kernel(q, kv, layer, group)
        assert got.shape == q.shape and got.dtype == q.dtype
        torch.testing.assert_close(got, reference(q, kv, layer, group).to(got.dtype))
        torch.testing.assert_close(got, decode_by_sequence(q, kv, layer, group, 64**-0.5))


def test_bfloat16_pools_accumulate_in_float32() -> None:
    q, kv, group = decode_case([40, 200], 16, 2, 3, dtype=torch.bfloat16)
    got = kernel(q, kv, 1, group)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), reference(q, kv, 1, group), atol=1e-2, rtol=1e-2)


def test_a_sequence_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count() -> None:
    contexts = [90, 250, 16, 400]
    q, kv, group = decode_case(contexts, 16, 2, 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        together = kernel(q, kv, 0, group)
        torch.set_num_threads(2)
        assert torch.equal(kernel(q, kv, 0, group), together)
    finally:
        torch.set_num_threads(before)
    tables = [group.blocks[group.starts[j] : group.starts[j + 1]] for j in range(len(contexts))]
    for j, n in enumerate(contexts):
        alone = kernels.paged_decode(
            q[j : j + 1],
            kv.data,
            0,
            tables[j],
            torch.tensor([0, len(tables[j])]),
            torch.tensor([n]),
            64**-0.5,
        )
        assert torch.equal(alone[0], together[j])


def test_bad_inputs_are_refused_with_a_reason() -> None:
    q, kv, group = decode_case([20, 40], 16, 2, 3)
    bad_block = group.blocks.clone()
    bad_block[0] = kv.spec.num_blocks
    with pytest.raises(RuntimeError, match="is not in the pool"):
        kernels.paged_decode(q, kv.data, 0, bad_block, group.starts, group.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="sequence 0: 2 blocks for 40 keys"):
        kernels.paged_decode(
            q, kv.data, 0, group.blocks, group.starts, group.context_lens + 20, 1.0
        )
    with pytest.raises(RuntimeError, match="layer 2 of 2"):
        kernels.paged_decode(q, kv.data, 2, group.blocks, group.starts, group.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernels.paged_decode(
            q.double(), kv.data, 0, group.blocks, group.starts, group.context_lens, 1.0
        )


def test_the_cache_key_follows_the_cpu_and_the_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    here = build.key()
    monkeypatch.setattr(build, "cpu_flags", lambda: "flags : fpu sse2")
    assert build.key() != here
    monkeypatch.setattr(build, "FLAGS", ("-O0",))
    assert len({here, build.key()}) == 2


def status_in_a_fresh_process(env: dict[str, str]) -> str:
    code = "from loom_runtime import kernels; s = kernels.status(); print(s.loaded, s.reason)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.strip()


def test_switched_off_the_kernels_are_neither_built_nor_loaded() -> None:
    assert status_in_a_fresh_process({"LOOM_CPU_KERNELS": "0"}) == "False LOOM_CPU_KERNELS=0"


@pytest.mark.slow
def test_a_failed_build_leaves_the_torch_path_with_the_compiler_s_error(tmp_path: Path) -> None:
    out = status_in_a_fresh_process({"LOOM_KERNEL_CACHE": str(tmp_path), "CXX": "/bin/false"})
    assert out.startswith("False the build failed"), out
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.parametrize(("dtype", "loaded"), [("float32", "True"), ("float64", "None")])
def test_loading_a_cpu_llama_loads_its_kernel_before_the_first_step_unless_float64(
    tmp_path: Path, dtype: str, loaded: str
) -> None:
    """A float64 model never uses the kernel (its decode is exact): it neither loads nor builds
    it."""
    code = (
        "import sys, torch; from loom_runtime import kernels; from loom_runtime.models.loader "
        "import load_model; from loom_runtime.models.tiny import init_tiny\n"
        "init_tiny(sys.argv[1], seed=0); print(kernels.status_so_far())\n"
        "load_model(sys.argv[1], dtype=getattr(torch, sys.argv[2]))\n"
        "s = kernels.status_so_far(); print(None if s is None else s.loaded)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tiny"), dtype],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.split() == ["None", loaded], done.stderr
