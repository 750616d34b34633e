"""The sparse-mla family's registration, runtime half (card/families.py holds its facts):
`glm_moe_dsa` checkpoints as SparseMlaForCausalLM and `loom://tiny-sparse-mla`.

Owns that wiring only.
"""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.family import FamilyRuntime
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla


def _build(config: Any, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
    return SparseMlaCausalLM(SparseMlaForCausalLM(config, dtype=dtype, device=device))


RUNTIME = FamilyRuntime(
    read_config=SparseMlaConfig.from_dict,
    build=_build,
    write_tiny=init_tiny_sparse_mla,
)
