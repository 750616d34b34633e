"""A llama-family model's tensor-parallel shard (Megatron-style): rank r of a TP group of W
keeps heads [r·H/W, (r+1)·H/W) of q with their kv heads [r·KV/W, (r+1)·KV/W) (so GQA groups
stay whole), columns [r·I/W, (r+1)·I/W) of the MLP's gate and up, and the matching input
columns of o_proj and down_proj, whose partial sums are all-reduced over the group; the
embeddings, norms and head stay whole on every rank.

Pure slicing of a loaded model plus the all-reduce it wires in; never loads files or keeps a
cache (the rank program does).
"""

from __future__ import annotations

from dataclasses import replace

from loom_runtime.models.config import ModelConfig
from loom_runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from loom_runtime.parallel.collectives import Comm, all_reduce_sum, ordered_sum
from loom_runtime.parallel.layout import LayoutError


def shard_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The architecture one of `tp` ranks holds; LayoutError when the model does not split."""
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "intermediate_size": config.intermediate_size,
    }
    if problems := [f"tp ({tp}) must divide {k} ({v})" for k, v in sizes.items() if v % tp]:
        raise LayoutError(f"{config.model_type} on tp {tp}: " + "; ".join(problems))
    return replace(
        config,
        num_attention_heads=config.num_attention_heads // tp,
        num_key_value_heads=config.num_key_value_heads // tp,
        intermediate_size=config.intermediate_size // tp,
    )


def shard_llama(
    model: LlamaForCausalLM, comm: Comm, batch_invariant: bool = False
) -> LlamaForCausalLM:
    """This rank's shard of `model` (copies of its slices; the whole model can be dropped);
    `batch_invariant`: in that mode, its partial sums added in rank order (ordered_sum)."""
    tp, r = comm.size, comm.index
    if tp == 1:
        model.set_batch_invariant(batch_invariant)
        return model
    shard = LlamaForCausalLM(shard_config(model.config, tp), model.dtype, "meta")
    shard.set_batch_invariant(batch_invariant)
    reduce = ordered_sum if batch_invariant else all_reduce_sum
    shard.embed_tokens = model.embed_tokens
    shard.final_norm = model.final_norm
    shard.lm_head = model.lm_head
    for whole, part in zip(model.layers, shard.layers, strict=True):
        _shard_layer(whole, part, r, tp)
        part.reduce = lambda x: reduce(comm, x)
    return shard


def _shard_layer(whole: LlamaDecoderLayer, part: LlamaDecoderLayer, r: int, tp: int) -> None:
    c = whole.config
    q, kv, i = c.q_size // tp, c.kv_size // tp, c.intermediate_size // tp
    qkv = _rows(q, r) + _rows(kv, r, c.q_size) + _rows(kv, r, c.q_size + c.kv_size)
    gate_up = _rows(i, r) + _rows(i, r, c.intermediate_size)
    part.input_norm = whole.input_norm
    part.post_attention_norm = whole.post_attention_norm
    part.qkv_weight = whole.qkv_weight[qkv].contiguous()
    part.o_weight = whole.o_weight[:, r * q : (r + 1) * q].contiguous()
    part.gate_up_weight = whole.gate_up_weight[gate_up].contiguous()
    part.down_weight = whole.down_weight[:, r * i : (r + 1) * i].contiguous()
    part.qkv_bias = None if whole.qkv_bias is None else whole.qkv_bias[qkv].contiguous()
    part.gate_up_bias = None if whole.gate_up_bias is None else whole.gate_up_bias[gate_up]

    part.o_bias = whole.o_bias  # added once, after the all-reduce
    part.down_bias = whole.down_bias
    part.q_norm, part.k_norm = whole.q_norm, whole.k_norm


def _rows(share: int, r: int, offset: int = 0) -> list[int]:
    """Rank r's `share` rows of the block of a fused matrix that starts at row `offset`."""
    return list(range(offset + r * share, offset + (r + 1) * share))


def weight_bytes(model: LlamaForCausalLM) -> int:
    """Bytes of the weights a rank holds (its shards and the replicated parts, each once)."""
    storages = {t.untyped_storage().data_ptr(): t for t in model.targets().values()}
    return sum(t.untyped_storage().nbytes() for t in storages.values())
