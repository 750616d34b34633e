"""The model-family registry: one `Family` per family, which everything that must know a family
reads (card rules, the operator's checks and vLLM flags, the engine's loader, ranks and tiny
checkpoints) instead of branching on its name.

A family is its folder plus one registration: the built-in four are in `BUILTIN` below; a
family outside Loom's tree is a plugin module named in `LOOM_PLUGINS` (comma-separated module
names or .py paths) whose `LOOM_FAMILIES` tuple lists its `Family` registrations. Every process
Loom starts inherits the variable, so `loom up`'s workers know the family too.

Owns the torch-free facts of each family and the lookup; never imports a model (the runtime
half is named by `runtime`, a "module:attribute" string, or given as the object itself).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Literal

from loom_runtime.card.chat_parsers import ReasoningParserName, ToolCallParserName

PLUGINS_ENV = "LOOM_PLUGINS"
PLUGIN_ATTRIBUTE = "LOOM_FAMILIES"

Split = Literal["tp", "pcp", "dcp", "ep", "dp"]
RankRunner = Literal["tp", "ranked"]


@dataclass(frozen=True)
class Family:
    """What Loom knows of one model family without loading it."""

    name: str
    """The ModelCard's `spec.family`."""
    model_types: tuple[str, ...]
    """config.json `model_type` values it loads (none: its checkpoints are found another way,
    e.g. a diffusers `model_index.json`)."""
    loops: tuple[str, ...]
    """Loop kinds it runs (ar_decode, encode, diffusion)."""
    runtime: str | object
    """Its runtime half (loom_runtime.models.family.FamilyRuntime): "module:attribute", imported
    only by the runtime, or the object itself (a plugin's)."""
    attention: Literal["gqa", "mla"] | None = None
    """How its attention stores KV: the card's `architecture.attention.kind` must say the same;
    the capacity planner sizes KV by it."""
    needs_indexer: bool = False
    """Its architecture block must give a sparse-attention indexer."""
    hisparse: bool = False
    """Hybrid HiSparse decode (a host KV tier read through the indexer's top-k rows) runs it."""
    splits: frozenset[Split] = frozenset()
    """Parallel axes the native runtime splits it over (none: one rank only)."""
    ranks: RankRunner | None = None
    """Which rank runner holds its ranks: TP shards (tp) or PCP/DCP/EP/DP ranks (ranked)."""
    tiny: str | None = None
    """The `loom://` checkpoint Loom generates for it (its runtime half writes it)."""
    vllm_context_parallel: Mapping[str, object] = field(default_factory=dict)
    """vLLM `--attention-config` entries its PCP/DCP roles need."""
    tool_call_parser: ToolCallParserName | None = None
    """How its chat templates write tool calls (a card's chat.toolCallParser overrides it)."""
    reasoning_parser: ReasoningParserName | None = None
    """How its chat templates write thinking; None: no reasoning is parsed out."""
    batch_invariant: bool = False
    """The native runtime has its batch-invariant mode (a role's `engine.batchInvariant`) in one
    process: its model is a models/linear.py `BatchInvariant`."""


BUILTIN = (
    Family(
        name="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3"),
        loops=("ar_decode", "encode"),
        runtime="loom_runtime.models.llama_family:RUNTIME",
        attention="gqa",
        splits=frozenset({"tp"}),
        ranks="tp",
        tiny="tiny",
        tool_call_parser="llama3_json",
        batch_invariant=True,
    ),
    Family(
        name="sparse-mla",
        model_types=("glm_moe_dsa",),
        loops=("ar_decode", "encode"),
        runtime="loom_runtime.models.sparse_mla.family:RUNTIME",
        attention="mla",
        needs_indexer=True,
        hisparse=True,
        splits=frozenset({"pcp", "dcp", "ep", "dp"}),
        ranks="ranked",
        tiny="tiny-sparse-mla",
        vllm_context_parallel=MappingProxyType({"sparse_mla_force_mqa": True}),
        tool_call_parser="glm47",
        reasoning_parser="glm45",
        batch_invariant=True,
    ),
    Family(
        name="dit",
        model_types=(),
        loops=("diffusion", "encode"),
        runtime="loom_runtime.models.wan.family:RUNTIME",
        tiny="tiny-wan",
    ),
    Family(
        name="mot",
        model_types=("loom_mot",),
        loops=("ar_decode", "diffusion"),
        runtime="loom_runtime.models.mot.family:RUNTIME",
        attention="gqa",
        tiny="tiny-mot",
        batch_invariant=True,
    ),
)


class UnknownFamilyError(LookupError):
    """No registered family has that name or model_type; the message lists the ones there are."""


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {f.name: f for f in BUILTIN}
        self._plugins_loaded = False

    def register(self, family: Family) -> None:
        with self._lock:
            self._add(family)

    def unregister(self, name: str) -> None:
        with self._lock:
            if name in {f.name for f in BUILTIN}:
                raise ValueError(f"{name!r} is a built-in family")
            self._families.pop(name, None)

    def all(self) -> tuple[Family, ...]:
        self._load_plugins()
        return tuple(self._families.values())

    def _add(self, family: Family) -> None:
        if family.name in self._families:
            raise ValueError(f"model family {family.name!r} is already registered")
        taken = {t: f.name for f in self._families.values() for t in f.model_types}
        clash = next((t for t in family.model_types if t in taken), None)
        if clash is not None:
            raise ValueError(
                f"model family {family.name!r}: model_type {clash!r} already belongs to "
                f"{taken[clash]!r}"
            )
        tinies = {f.tiny for f in self._families.values()}
        if family.tiny is not None and family.tiny in tinies:
            raise ValueError(f"model family {family.name!r}: loom://{family.tiny} is taken")
        self._families[family.name] = family

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded:
                return
            for entry in plugin_entries(os.environ.get(PLUGINS_ENV, "")):
                for family in _plugin_families(entry):
                    self._add(family)
            self._plugins_loaded = True


_REGISTRY = _Registry()


def plugin_entries(value: str) -> tuple[str, ...]:
    """The module names and .py paths a `LOOM_PLUGINS` value lists."""
    return tuple(entry.strip() for entry in value.split(",") if entry.strip())


def _plugin_families(entry: str) -> tuple[Family, ...]:
    module = _import_plugin(entry)
    families = getattr(module, PLUGIN_ATTRIBUTE, None)
    if not isinstance(families, tuple) or not all(isinstance(f, Family) for f in families):
        raise ValueError(
            f"{PLUGINS_ENV} names {entry!r}, which has no {PLUGIN_ATTRIBUTE} tuple of Family"
        )
    return families


def _import_plugin(entry: str) -> ModuleType:
    try:
        if not entry.endswith(".py"):
            return importlib.import_module(entry)
        path = Path(entry).resolve()
        spec = importlib.util.spec_from_file_location(f"loom_plugin_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"no Python module at {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import would: dataclasses look themselves up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[spec.name]
            raise
        return module
    except Exception as exc:  # any failure to import a plugin stops the process with its cause
        raise ValueError(f"{PLUGINS_ENV} names {entry!r}, which cannot be imported: {exc}") from exc


def families() -> tuple[Family, ...]:
    """Every registered family: the built-ins, then the plugins' (loaded on first use)."""
    return _REGISTRY.all()


def family(name: str) -> Family:
    """The family a card names; UnknownFamilyError lists the registered ones."""
    found = next((f for f in families() if f.name == name), None)
    if found is None:
        raise UnknownFamilyError(
            f"no model family {name!r} (registered: {', '.join(names())}; a family outside "
            f"Loom is a plugin named in {PLUGINS_ENV})"
        )
    return found


def family_of_model_type(model_type: str) -> Family:
    """The family whose checkpoints carry config.json's `model_type`."""
    found = next((f for f in families() if model_type in f.model_types), None)
    if found is None:
        known = sorted(t for f in families() for t in f.model_types)
        raise UnknownFamilyError(
            f"no model family loads model_type {model_type!r} (supported: {', '.join(known)})"
        )
    return found


def names() -> tuple[str, ...]:
    return tuple(f.name for f in families())


def tiny_checkpoints() -> dict[str, Family]:
    """`loom://` checkpoint name -> the family that writes it."""
    return {f.tiny: f for f in families() if f.tiny is not None}


def register(family: Family) -> None:
    """Add a family (ValueError when its name, a model_type or its tiny name is taken)."""
    _REGISTRY.register(family)


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """A family registered for the block's duration (tests, embedding Loom)."""
    register(family)
    try:
        yield family
    finally:
        _REGISTRY.unregister(family.name)
