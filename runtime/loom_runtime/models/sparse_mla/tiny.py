"""`loom model init-tiny --family sparse-mla`: a deterministic tiny GLM-MoE-DSA checkpoint.

Writes random (nonsense-producing) weights from a fixed seed; never downloads real weights.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.models.tiny_files import random_weights, write_checkpoint
from loom_runtime.models.tiny_tokenizer import train_tiny_tokenizer

logger = logging.getLogger(__name__)

INIT_STD = 0.1  # larger than a real init so attention is far from uniform and selection matters
INDEX_TOPK = 64  # smaller than the contexts the tests run, so the indexer's choice matters

README = """# Loom tiny sparse-mla checkpoint (random weights)

Written by `loom model init-tiny --family sparse-mla` (seed {seed}): a Hugging Face
`glm_moe_dsa` checkpoint (`GlmMoeDsaForCausalLM`: MLA attention, the DSA indexer with
top-{topk} selection and full/shared indexer layers, MoE FFNs, one MTP layer) whose weights
are **random numbers** from a fixed seed. It produces **nonsense text**; it exists so that
tests and benchmarks exercise the sparse-mla family on a CPU in seconds.

The tokenizer is Loom's tiny byte-level BPE ({vocab} tokens).
"""


def tiny_config_dict(vocab_size: int, bos_id: int, eos_ids: list[int]) -> dict[str, Any]:
    """config.json of the tiny model: 4 layers (full, shared, full, shared indexers; the first
    dense, the rest MoE over 8 experts in 2 groups), plus one MTP layer."""
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "index_topk": INDEX_TOPK,
        "index_head_dim": 16,
        "index_n_heads": 16,
        "indexer_types": ["full", "shared", "full", "shared"],
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }


def init_tiny_sparse_mla(dir: Path, seed: int = 0) -> Path:
    """Write the tiny sparse-mla checkpoint into `dir` (created if needed); same bytes each run."""
    tiny = train_tiny_tokenizer()
    eos_ids = [tiny.im_end_id, tiny.end_of_text_id]
    raw = tiny_config_dict(tiny.vocab_size, tiny.bos_id, eos_ids)
    shapes = {
        name: tuple(t.shape)
        for name, t in SparseMlaForCausalLM(SparseMlaConfig.from_dict(raw)).targets().items()
    }
    readme = README.format(seed=seed, topk=INDEX_TOPK, vocab=tiny.vocab_size)
    root = write_checkpoint(
        Path(dir), raw, random_weights(shapes, seed, INIT_STD), tiny, eos_ids, readme
    )
    logger.info("wrote tiny sparse-mla checkpoint", extra={"path": str(root), "seed": seed})
    return root
