"""Engine settings declared once: each declaration is one the derivations can use, its default
is the engine's own, and no name or flag is declared twice."""

from __future__ import annotations

import pytest

from loom_runtime.engine.config import EngineConfig
from loom_runtime.wire.engine_settings import SETTINGS, EngineSetting, setting


def test_every_declared_default_is_the_engines_own() -> None:
    defaults = EngineConfig()
    for declared in SETTINGS:
        value = defaults
        for name in declared.name.split("."):
            value = getattr(value, name)
        if declared.name == "dtype":
            assert str(value) == f"torch.{declared.default}"
        else:
            assert value == declared.default, declared.name


def test_names_and_flags_are_declared_once() -> None:
    names = [s.name for s in SETTINGS]
    flags = [s.flag for s in SETTINGS if s.flag is not None]
    vllm = [s.vllm.name for s in SETTINGS if s.vllm is not None]
    assert len(set(names)) == len(names)
    assert len(set(flags)) == len(flags)
    assert len(set(vllm)) == len(vllm)
    assert setting("block_size").flag == "--block-size"
    with pytest.raises(KeyError, match="no engine setting declares 'nope'"):
        setting("nope")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"flag": "block"}, "must start with --"),
        ({"kind": bool, "default": True}, "flips its default"),
        ({"choices": ("a", "b"), "kind": str, "default": "c"}, "not a choice"),
    ],
)
def test_a_declaration_the_derivations_cannot_use_is_refused(
    kwargs: dict[str, object], says: str
) -> None:
    base: dict[str, object] = {
        "name": "x", "kind": int, "default": 1, "doc": "x", "flag": "--x"}  # fmt: skip
    with pytest.raises(ValueError, match=says):
        EngineSetting(**{**base, **kwargs})  # type: ignore[arg-type]
