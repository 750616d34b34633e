"""Whether a parallel engine's settings, its model's family and its ranks agree: a family's
registration (card/families.py) names the axes it splits over and its rank runner — TP shards
(engine/ranks/tp_runner.py) or PCP/DCP/EP/DP ranks (engine/ranks/ranked_runner.py);
LayoutError says how they do not, before any rank starts.

Pure checks; never starts or stops ranks.
"""

from __future__ import annotations

from loom_runtime.card import families
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.ranks.tp_runner import TpRunner
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.models.causal_lm import DecoderConfig
from loom_runtime.models.config import ModelConfig
from loom_runtime.parallel.layout import LayoutError
from loom_runtime.parallel.llama.tp import shard_config


def check_ranks(
    model: DecoderConfig,
    config: EngineConfig,
    ranks: EngineRanks | None,
    disagg: DisaggSettings | None,
    starting: bool = False,
) -> None:
    """`starting`: before the ranks are started (from_checkpoint), so none are given yet."""
    layout = config.parallel
    if layout.world == 1:
        if ranks is not None:
            raise LayoutError("the engine was given ranks but its config.parallel is one rank")
        return
    where = f"parallel {layout.describe()}"
    family = families.family_of_model_type(model.model_type)
    if family.ranks is None:
        raise LayoutError(f"{where}: the {family.name} model does not run on ranks")
    split = [axis for axis in AXES if getattr(layout, axis) > 1]
    if any(axis not in family.splits for axis in split):
        raise LayoutError(
            f"{where}: the {family.name} model splits over {' and '.join(sorted(family.splits))}"
            f" only, not {' and '.join(a for a in split if a not in family.splits)}"
        )
    if family.ranks == "tp":
        _check_tp(model, config, disagg, where)
        kind: type = TpRunner
    else:
        _check_ranked(config, ranks, disagg, where)
        kind = RankedRunner
    if not starting and (ranks is None or ranks.world != layout.world):
        have = "none" if ranks is None else f"{ranks.world}"
        raise LayoutError(f"{where} needs {layout.world} ranks, the engine was given {have}")
    if ranks is not None and not isinstance(ranks, kind):
        raise LayoutError(f"{where}: the {model.model_type} model runs on {kind.__name__} ranks")


AXES = ("tp", "pcp", "dcp", "ep", "dp")


def _check_tp(
    model: DecoderConfig, config: EngineConfig, disagg: DisaggSettings | None, where: str
) -> None:
    if not isinstance(model, ModelConfig):
        raise LayoutError(f"{where}: TP ranks shard llama-shaped configs, not {model.model_type}")
    shard_config(model, config.parallel.tp)  # the heads and the MLP divide, or LayoutError says not
    if disagg is not None:
        raise LayoutError(
            f"{where}: P/D from or into TP ranks is not built (the KV connector moves one pool; "
            f"each TP rank holds its kv heads' shard of it): serve the {disagg.role} role with "
            "tp 1 or aggregated"
        )
    if config.kv_offload_bytes > 0:
        raise LayoutError(
            f"{where}: CPU KV offload on TP ranks is not built (the tier copies the engine's "
            "pool; each TP rank keeps its own): set kv_offload_gib 0"
        )


def _check_ranked(
    config: EngineConfig, ranks: EngineRanks | None, disagg: DisaggSettings | None, where: str
) -> None:
    if disagg is not None and ranks is not None and not ranks.export_rows:
        raise LayoutError(
            f"{where}: a P/D {disagg.role}'s ranks must export their rows (its pool is what the "
            "connector moves, and what a pulled request's ranks are seeded from)"
        )
    if disagg is None and ranks is not None and config.use_prefix_cache != ranks.export_rows:
        raise LayoutError(f"{where}: prefix caching on ranks needs ranks that export their rows")
