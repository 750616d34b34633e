"""The mot family's registration, runtime half (card/families.py holds its facts): a MoT
checkpoint (model_type loom_mot) as MotForCausalLM, whose text loop the engine serves like a
llama model's, with `loom://tiny-mot` as its tiny checkpoint.

Owns that wiring only; the model is models/mot/model.py, its config models/mot/config.py.
"""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.family import FamilyRuntime
from loom_runtime.models.llama_family import RUNTIME as LLAMA
from loom_runtime.models.mot.config import MotConfig
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import init_tiny_mot


def _build(config: Any, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
    return MotForCausalLM(config, dtype=dtype, device=device)


RUNTIME = FamilyRuntime(
    read_config=MotConfig.from_dict,
    build=_build,
    prepare=LLAMA.prepare,  # the text loop's decode attention is llama's (its CPU kernel)
    write_tiny=init_tiny_mot,
)
