"""Whether an engine may run MTP speculative decoding: its model checked against
`EngineConfig.mtp_draft_tokens` once, at construction (every role and layout runs it).

Owns those refusals and their messages; never drafts, verifies or allocates anything.
"""

from __future__ import annotations

from loom_runtime.engine.config import EngineConfig
from loom_runtime.errors import SpeculativeConfigError
from loom_runtime.models.causal_lm import DecoderConfig
from loom_runtime.models.sparse_mla.config import MODEL_TYPE as SPARSE_MLA


def check_mtp(model: DecoderConfig, config: EngineConfig) -> None:
    """SpeculativeConfigError if MTP is on (mtp_draft_tokens > 0) and this engine cannot run it:
    a model outside the sparse-mla family or without MTP layers. Every role runs it, on one
    rank or a worker's ranks: a P/D prefill computes the MTP layer's rows of the prompt beside
    the trunk's (and never drafts), they cross in the same blocks, and the decode recomputes
    the last prompt token (and with it the draft state) itself; a prefill and a decode must
    agree on it (the layouts' layer counts differ otherwise, and the decode refuses the pull).
    Nothing is checked when MTP is off."""
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
