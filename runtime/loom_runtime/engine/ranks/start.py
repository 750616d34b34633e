"""Which ranks a parallel engine starts for its checkpoint: the rank runner its family names
(card/families.py) — TP shards (engine/ranks/tp_runner.py) or PCP/DCP/EP/DP ranks
(engine/ranks/ranked_runner.py) — after checking that the settings fit (engine/ranks/check.py).

Owns that choice only; never drives a step.
"""

from __future__ import annotations

from loom_runtime.card import families
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.kv_memory.hisparse import hot_slots
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.ranks.check import check_ranks
from loom_runtime.engine.ranks.ranked_runner import start_ranks
from loom_runtime.engine.ranks.tp_runner import start_tp
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.loader import LoadedModel


def start_engine_ranks(
    checkpoint: str, loaded: LoadedModel, config: EngineConfig, disagg: DisaggSettings | None
) -> EngineRanks:
    """`loaded`: the checkpoint's shapes-only model (the ranks load the weights)."""
    check_ranks(loaded.config, config, None, disagg, starting=True)
    max_model_len = config.resolve_max_model_len(loaded.config.max_position_embeddings)
    if families.family_of_model_type(loaded.config.model_type).ranks == "tp":
        assert isinstance(loaded.config, ModelConfig)  # check_ranks: TP shards llama shapes
        return start_tp(checkpoint, loaded.config, config, max_model_len)
    export = disagg is not None or config.use_prefix_cache  # the pool mirrors the ranks
    # a P/D prefill's ranks compute its prompts' MTP rows for the decode and never draft
    drafts = config.mtp_draft_tokens > 0 and (disagg is None or disagg.role != "prefill")
    hot = hot_slots(loaded.config, config) if config.hisparse else 0
    return start_ranks(checkpoint, config, max_model_len, export, drafts=drafts, hot_slots=hot)
