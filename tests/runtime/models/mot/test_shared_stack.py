"""Both loops run one stack: each shared block of the denoise path equals the llama family's
block on the same weights (where causal and joint attention coincide: one latent token), and the
model holds one copy of every weight, which a weight load changes for both loops at once."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.models.mot.ar_history import decode_greedily, latents

from loom_runtime.errors import CheckpointError
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models import attention
from loom_runtime.models.attention import plan_attention
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.loader import load_model, read_weights
from loom_runtime.models.mot.denoise_batch import DenoiseBatch, DenoiseRequest
from loom_runtime.models.mot.joint_attention import joint_attention
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.rope import rope_tables

PROMPT = [9, 400, 23, 1500, 61, 8, 730, 2, 99]


def llama_decode_step(layer, x, kv: PagedKVCache, table: list[int], context: int, free: int):
    """The llama block's own forward on one token at position `context` over a copy of the
    cache (its K/V written into block `free` when the table is full)."""
    copy = PagedKVCache(kv.spec)
    copy.data.copy_(kv.data)
    size = kv.spec.block_size
    table = table if len(table) * size > context else [*table, free]
    slot = torch.tensor([table[context // size] * size + context % size])
    batch = ForwardBatch(
        input_ids=torch.zeros(1, dtype=torch.long),
        positions=torch.tensor([context]),
        query_start=[0, 1],
        context_lens=[context + 1],
        block_tables=[table],
        slot_mapping=slot,
        logits_indices=torch.zeros(1, dtype=torch.long),
    )
    return batch, layer.forward, copy, plan_attention(batch, size, x.device), slot


def test_each_shared_block_equals_the_llama_block_on_one_latent_token(
    mot64, paged, monkeypatch
) -> None:
    # llama's decode on a CPU may run Loom's kernel, which accumulates in float32; its torch
    # path is the same block in float64 throughout, so the two can be compared to 1e-12
    monkeypatch.setattr(attention.kernels, "available", lambda: False)
    seqs, _ = decode_greedily(mot64, paged, {"a": PROMPT}, steps=4)
    table, context = seqs.tables["a"], seqs.lengths["a"]
    text = mot64.text
    x = torch.randn(1, mot64.config.text.hidden_size, generator=torch.Generator().manual_seed(8))
    x = x.to(torch.float64)
    for layer in mot64.layers:
        batch, forward, copy, plan, slot = llama_decode_step(
            layer, x, seqs.kv, table, context, free=seqs.free[-1]
        )
        rope = rope_tables(batch.positions, text.inv_freq, text.rope_scale, torch.float64)
        llama = forward(x, rope, copy, plan, slot, text.attention_scale)
        q, k, v = layer.attention_inputs(x, rope)
        blocks = torch.tensor(table)
        attn = joint_attention(
            q, k, v, seqs.kv, layer.layer, (blocks, context), text.attention_scale
        )
        ours = layer.after_attention(x, attn)
        assert (ours - llama).abs().max().item() < 1e-12
        assert (ours - x).abs().max().item() > 1e-2  # the block did something
        x = ours


def unique_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def test_the_model_holds_one_copy_of_every_weight(mot_checkpoint) -> None:
    path, _ = mot_checkpoint
    model = load_model(path, dtype=torch.float64).model
    assert isinstance(model, MotForCausalLM)
    assert model.layers is model.text.layers  # the denoise loop's stack is the text loop's
    checkpoint = read_weights(path)
    wanted = sum(t.numel() * 8 for t in checkpoint.values())  # float64 bytes
    assert unique_bytes(model.targets().values()) == wanted
    assert model.config.num_parameters == sum(t.numel() for t in checkpoint.values())


def test_a_weight_load_changes_both_loops_at_once(mot_checkpoint, paged) -> None:
    path, _ = mot_checkpoint
    model = load_model(path, dtype=torch.float64).model
    assert isinstance(model, MotForCausalLM)

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        seqs = paged(model, block_size=4)
        logits = seqs.step([("a", PROMPT)])["a"]
        request = DenoiseRequest(latents(3, 4, 4, seed=9), 0.5, len(PROMPT), seqs.tables["a"])
        return logits, model.denoise(DenoiseBatch((request,)), seqs.kv)[0]

    logits, velocity = both()
    name = "model.layers.1.mlp.down_proj.weight"
    model.load_state({name: read_weights(path)[name] * 3}, strict=False)
    new_logits, new_velocity = both()
    assert (new_logits - logits).abs().max().item() > 1e-3
    assert (new_velocity - velocity).abs().max().item() > 1e-3


def test_a_bad_load_changes_neither_loop(mot_checkpoint) -> None:
    path, _ = mot_checkpoint
    model = load_model(path, dtype=torch.float64).model
    assert isinstance(model, MotForCausalLM)
    before = {name: t.clone() for name, t in model.targets().items()}
    tensors = {name: t + 1 for name, t in read_weights(path).items()}
    tensors["image.proj_out.bias"] = torch.zeros(5)
    with pytest.raises(CheckpointError, match=r"image\.proj_out\.bias \(5,\) != \(12,\)"):
        model.load_state(tensors)
    with pytest.raises(CheckpointError, match=r"missing: image\.norm\.weight"):
        model.load_state({n: t for n, t in read_weights(path).items() if n != "image.norm.weight"})
    assert all(torch.equal(t, before[name]) for name, t in model.targets().items())
