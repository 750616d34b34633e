"""A worker of a card with a program: the program's settings as it serves them, and its engine
built from the card's ModelInstance (the think and draw loops' shared component, loaded once).

Owns those two decisions; never serves HTTP (draw_api.py does) nor runs a step (the engine does).
"""

from __future__ import annotations

from pathlib import Path

from loom_runtime.card import ModelCard
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.serve.draw_api import DrawSettings
from loom_runtime.serve.model_instance import LoadComponent, checkpoint_loader, instantiate
from loom_runtime.wire.kv_events import KVEventSink


def draw_settings(card: ModelCard) -> DrawSettings | None:
    """The card's first program as served (None without one; the card rules checked it)."""
    if not card.spec.programs:
        return None
    program = card.spec.programs[0]
    steps = card.loop(program.draw).steps
    assert steps is not None  # a think_then_draw's draw loop has steps (card rules)
    return DrawSettings(program.name, program.max_think_tokens, steps)


def engine_from_instance(
    card: ModelCard,
    card_path: Path | None,
    config: EngineConfig,
    events: KVEventSink | None = None,
    load: LoadComponent | None = None,
) -> Engine:
    """The engine of a card with a program: its ModelInstance loads every component once, and
    the engine runs the component the think and draw loops share (one object for both).
    `events`: where its KV events go (the worker's publisher)."""
    program = card.spec.programs[0]
    instance = instantiate(card, load or checkpoint_loader(card_path, config.dtype, config.device))
    think, draw = instance.for_loop(program.think), instance.for_loop(program.draw)
    shared = next(name for name in think if name in draw)
    return Engine(think[shared], config, events)
