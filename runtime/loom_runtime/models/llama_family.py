"""The llama family's registration, runtime half (card/families.py holds its facts): llama,
mistral, qwen2 and qwen3 checkpoints as LlamaForCausalLM, with the CPU decode kernel loaded
with the model and `loom://tiny` as its tiny checkpoint.

Owns that wiring only; the model is models/llama.py, its config models/config.py.
"""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime import kernels
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.family import FamilyRuntime
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.models.tiny import init_tiny


def _build(config: Any, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
    return LlamaForCausalLM(config, dtype=dtype, device=device)


def _prepare(model: CausalLM) -> None:
    # Its decode attention's kernel: loaded (or built, once per machine) now; a float64 model
    # never uses it (its decode takes the exact torch path, models/attention.py), so a float64
    # worker does not wait for a build it cannot use (a fresh container builds it each time).
    if model.device.type == "cpu" and model.dtype != torch.float64:
        kernels.status()


RUNTIME = FamilyRuntime(
    read_config=ModelConfig.from_dict,
    build=_build,
    prepare=_prepare,
    write_tiny=init_tiny,
)
