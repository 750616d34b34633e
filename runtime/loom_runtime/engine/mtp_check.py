"""Whether an engine may run MTP speculative decoding: the model, the role and the engine's
other features checked against `EngineConfig.mtp_draft_tokens` once, at construction.

Owns those refusals and their messages; never drafts, verifies or allocates anything.
"""

from __future__ import annotations

from loom_runtime.engine.config import EngineConfig
from loom_runtime.errors import SpeculativeConfigError
from loom_runtime.models.causal_lm import DecoderConfig
from loom_runtime.models.sparse_mla.config import MODEL_TYPE as SPARSE_MLA


def check_mtp(model: DecoderConfig, config: EngineConfig, role: str) -> None:
    """SpeculativeConfigError if MTP is on (mtp_draft_tokens > 0) and this engine cannot run it:
    a model outside the sparse-mla family or without MTP layers, a P/D role, or — for now —
    any engine, since the batched step runs no verify rows yet (only the one-sequence
    engine/mtp_speculator.py does). Nothing is checked when MTP is off."""
    k = config.mtp_draft_tokens
    if k == 0:
        return
    fix = "drop the role's mtp (or --mtp-draft-tokens)"
    if model.model_type != SPARSE_MLA:
        raise SpeculativeConfigError(
            f"MTP speculation (mtp_draft_tokens {k}) needs a sparse-mla model with MTP layers; "
            f"{config.model_name!r} is {model.model_type!r}: {fix}"
        )
    if getattr(model, "num_nextn_predict_layers", 0) < 1:
        raise SpeculativeConfigError(
            f"MTP speculation (mtp_draft_tokens {k}): the checkpoint of {config.model_name!r} "
            f"has no MTP layer (num_nextn_predict_layers is 0): {fix}"
        )
    if role != "aggregated":
        raise SpeculativeConfigError(
            f"MTP speculation (mtp_draft_tokens {k}) runs in the aggregated role only; the "
            f"{role} role would need the draft rows to cross with the KV: {fix}"
        )
    raise SpeculativeConfigError(
        f"MTP speculation (mtp_draft_tokens {k}) of {config.model_name!r}: the engine's "
        "batched step runs no verify rows yet (one-sequence speculation is "
        f"engine/mtp_speculator.py, measured by bench/mtp.py): {fix}"
    )
