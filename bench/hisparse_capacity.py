"""How many long sequences fit one device KV budget, all on the device vs with HiSparse.

Sized with the runtime's own specs (the figures the engine allocates by): all on the device a
sequence costs its blocks' full latent cache; under HiSparse its blocks' indexer keys plus one
request's hot buffers (kv/hisparse_cache.py `HiSparseSpec`), and its whole latent blocks (rows
and keys) go to the host pool, whose size for that many sequences is reported too. Pure
arithmetic: no forward runs (the engine test
`test_a_fixed_device_budget_holds_more_blocks_with_a_host_pool` checks the engine admits by
these figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseSpec, default_hot_slots, plan_hisparse
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.tiny import tiny_config_dict

BLOCK = 16


@dataclass(frozen=True)
class Capacity:
    model: str
    kv: str  # "fp32" / "fp8": how rows are stored
    length: int  # tokens per sequence
    device_budget_bytes: int
    sequences_on_device: int
    sequences_hisparse: int
    host_pool_bytes: int  # what the HiSparse sequences' latent blocks need on the host

    @property
    def ratio(self) -> float:
        return self.sequences_hisparse / max(1, self.sequences_on_device)


def capacity(
    model: str, latent: LatentKVCacheSpec, index_topk: int, length: int, budget: int
) -> Capacity:
    blocks = -(-length // latent.block_size)
    one = replace(latent, num_blocks=1)
    on_device = budget // (blocks * one.bytes_per_block)
    hot = HiSparseSpec(one, default_hot_slots(index_topk), 1)
    per_sequence = blocks * hot.device_bytes_per_block + hot.hot_bytes_per_request
    fits = budget // per_sequence
    spec = HiSparseSpec(
        replace(latent, num_blocks=max(1, fits) * blocks), hot.hot_slots, max(1, fits)
    )
    assert fits == 0 or spec.device_bytes <= budget  # the engine's own check (plan_hisparse)
    kv = "fp8" if latent.fp8 is not None else "fp32"
    return Capacity(
        model, kv, length, budget, on_device, fits, fits * blocks * hot.host_bytes_per_block
    )


def engine_accepts(latent: LatentKVCacheSpec, index_topk: int, row: Capacity) -> bool:
    """Whether the engine's own sizing (`plan_hisparse`, which raises over budget) takes
    `row.sequences_hisparse` sequences of `row.length` tokens in the device budget."""
    blocks = -(-row.length // latent.block_size) * row.sequences_hisparse
    host_block = HiSparseSpec(replace(latent, num_blocks=1), 1, 1).host_bytes_per_block
    try:
        plan_hisparse(
            latent,
            host_pool_bytes=blocks * host_block,  # a pool that holds them: only the device decides
            hot_slots=default_hot_slots(index_topk),
            max_requests=row.sequences_hisparse,
            min_blocks=blocks,
            num_blocks=blocks,
            device_budget=row.device_budget_bytes,
        )
    except ValueError:
        return False
    return True


def tiny_latent(fp8: bool) -> tuple[LatentKVCacheSpec, int]:
    """The tiny sparse-mla checkpoint's cache (fp32 rows, or packed fp8 in groups of 16)."""
    config = SparseMlaConfig.from_dict(tiny_config_dict(4142, 0, [1]))
    spec = config.kv_spec(BLOCK, 1, torch.float32, Fp8Format(16) if fp8 else None)
    assert isinstance(spec, LatentKVCacheSpec)
    return spec, config.index_topk


def glm5_latent() -> tuple[LatentKVCacheSpec, int]:
    """REFERENCE.md §A's GLM-5-class cache: 78 MLA layers of 512 latent + 64 RoPE dims (fp8,
    656-byte rows), 21 indexer layers of 128 dims, top-k 2,048; hot buffers hold bf16 rows."""
    spec = LatentKVCacheSpec(
        num_layers=78, latent_dim=512, rope_dim=64, index_layers=tuple(range(21)),
        index_dim=128, block_size=64, num_blocks=1, dtype=torch.bfloat16, fp8=Fp8Format(128),
    )  # fmt: skip
    return spec, 2048


def rows() -> list[Capacity]:
    out = []
    for fp8 in (False, True):
        latent, topk = tiny_latent(fp8)
        out.append(capacity("tiny sparse-mla", latent, topk, 16_384, 2**30))
    latent, topk = glm5_latent()
    out.append(capacity("GLM-5 class", latent, topk, 131_072, 15 * 2**30))
    return out


def report(rows: list[Capacity]) -> str:
    lines = [
        "| model | KV | tokens per sequence | device budget | sequences, all on device | "
        "sequences, HiSparse | ratio | host pool they need |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.kv} | {r.length} | {r.device_budget_bytes / 2**30:g} GiB | "
            f"{r.sequences_on_device} | {r.sequences_hisparse} | {r.ratio:.1f}x | "
            f"{r.host_pool_bytes / 2**30:.1f} GiB |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    table = rows()
    print(report(table))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in table], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
