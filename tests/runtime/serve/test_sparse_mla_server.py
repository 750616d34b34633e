"""A live `loom runtime` worker on the tiny sparse-mla checkpoint: `/v1/completions` returns the
one-sequence forward's greedy tokens (prompt of 100 ids > index_topk 64), and /metrics reports
the planner's KV bytes per token for the sparse-mla shape, with fp32 KV and with a card's fp8 KV;
a HiSparse worker serves the same tokens and reports its tiers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_operator.fleet.kv_layout import Indexer, MLAAttention, ModelShape, kv_bytes_per_token
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla, load_sparse_mla
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla

PROMPT = [10 + (7 * i) % 3000 for i in range(100)]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("serve-sparse") / "tiny")


@pytest.fixture(scope="module")
def worker(launch: Any, sparse_dir: Path) -> Iterator[Any]:
    with launch(sparse_dir) as w:
        yield w


def one_sequence_tokens(loaded: LoadedSparseMla) -> list[int]:
    """Greedy tokens of the one-sequence forward in float32 (the card's precision)."""
    model = loaded.model
    cache = model.new_cache(len(PROMPT) + NEW_TOKENS)
    logits = model.forward(torch.tensor(PROMPT), cache)
    out: list[int] = []
    for _ in range(NEW_TOKENS):
        out.append(int(logits[-1].argmax()))
        logits = model.forward(torch.tensor(out[-1:]), cache)
    return out


def greedy_tokens(worker: Any) -> list[int]:
    """The worker's greedy /v1/completions tokens for PROMPT."""
    body = {"model": worker.model, "prompt": PROMPT, "max_tokens": NEW_TOKENS,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    status, answer, _ = worker.post("/v1/completions", body)
    assert status == 200, answer
    return list(answer["choices"][0]["token_ids"])


def test_completions_return_the_one_sequence_forwards_tokens(worker: Any, sparse_dir: Path) -> None:
    assert len(PROMPT) > INDEX_TOPK
    assert greedy_tokens(worker) == one_sequence_tokens(
        load_sparse_mla(sparse_dir, dtype=torch.float32)
    )


def test_metrics_report_the_planners_kv_bytes_per_token(worker: Any, sparse_dir: Path) -> None:
    c = load_sparse_mla(sparse_dir).config
    shape = ModelShape(
        num_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        attention=MLAAttention(c.kv_lora_rank, c.qk_rope_head_dim),
        kv_dtype="fp32",
        indexer=Indexer(
            len(c.full_indexer_layers), c.index_head_dim, c.index_topk, c.index_n_heads
        ),
    )
    assert worker.metric("loom:kv_bytes_per_token") == kv_bytes_per_token(shape) == 768
    assert worker.metric("loom:kv_cache_bytes") == 96 * 16 * 768  # --num-blocks 96


def test_an_fp8_kv_card_serves_and_reports_the_planners_fp8_bytes(
    launch: Any, sparse_dir: Path
) -> None:
    c = load_sparse_mla(sparse_dir).config
    shape = ModelShape(
        num_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        attention=MLAAttention(c.kv_lora_rank, c.qk_rope_head_dim),
        kv_dtype="fp8",  # the card has no architecture block: groups of 128
        indexer=Indexer(
            len(c.full_indexer_layers), c.index_head_dim, c.index_topk, c.index_n_heads
        ),
    )
    with launch(sparse_dir, kv="fp8") as fp8_worker:
        per_token = fp8_worker.metric("loom:kv_bytes_per_token")
        assert per_token == kv_bytes_per_token(shape) == 4 * (32 + 4 + 8 * 2) + 2 * (16 + 4)
        assert fp8_worker.metric("loom:kv_cache_bytes") == 96 * 16 * per_token
        got = greedy_tokens(fp8_worker)
        assert len(got) == NEW_TOKENS


def test_a_hisparse_worker_serves_the_same_tokens_and_reports_its_tiers(
    launch: Any, sparse_dir: Path
) -> None:
    host_block = 16 * (4 * (32 + 8) + 2 * 16) * 4  # float32 rows of 4 layers, keys of 2
    with launch(sparse_dir, "--hisparse-host-pool-gib", "0.002") as hi:  # 174 blocks fit
        got = greedy_tokens(hi)
        want = one_sequence_tokens(load_sparse_mla(sparse_dir, dtype=torch.float32))
        assert got == want
        assert hi.metric("loom:hisparse_host_pool_bytes") == 96 * host_block  # --num-blocks 96
        misses = hi.metric("loom:hisparse_hot_misses_total")
        assert misses > 0 and hi.metric("loom:hisparse_h2d_bytes_total") == misses * 40 * 4
        assert 0 <= hi.metric("loom:hisparse_hot_hit_rate") < 1
        assert hi.metric("loom:hisparse_hot_requests") == 0
        # the device keeps keys and 8 hot buffers (--max-num-seqs 8) of 2 x 64 + 1 rows per layer
        device = 96 * 16 * 2 * 16 * 4 + 8 * 4 * (2 * INDEX_TOPK + 1) * 40 * 4
        assert hi.metric("loom:kv_cache_bytes") == device < 96 * 16 * 768


def test_an_mtp_worker_serves_the_same_tokens_and_reports_vllms_spec_decode_counters(
    launch: Any, sparse_dir: Path
) -> None:
    with launch(sparse_dir, "--mtp-draft-tokens", "3") as mtp:
        got = greedy_tokens(mtp)
        want = one_sequence_tokens(load_sparse_mla(sparse_dir, dtype=torch.float32))
        assert got == want
        drafts = mtp.metric("vllm:spec_decode_num_drafts_total")
        accepted = mtp.metric("vllm:spec_decode_num_accepted_tokens_total")
        # every decode step but the last (which max_tokens leaves no room to draft for) verifies
        assert 0 < drafts <= NEW_TOKENS - 2
        assert accepted <= mtp.metric("vllm:spec_decode_num_draft_tokens_total") <= 3 * drafts
        # the MTP layer's rows (latent + RoPE 40, indexer keys 16; float32) join each token's
        assert mtp.metric("loom:kv_bytes_per_token") == 768 + (40 + 16) * 4
