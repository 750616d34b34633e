"""A role's engine settings as command-line flags: each declared setting (loom_runtime.wire.
engine_settings) read from its card fields, written as `loom runtime` or `vllm serve` flags.

Owns reading the declarations' card fields off a role and writing them as flags; never declares
a setting (the table does) and never writes a flag that is not an engine setting.
"""

from __future__ import annotations

from typing import TypeGuard

from pydantic import BaseModel

from loom_operator.api.roles import Role
from loom_runtime.card.component import Component
from loom_runtime.wire import engine_settings
from loom_runtime.wire.engine_settings import EngineSetting, Value, VllmFlag

COMPONENT = "component"
"""The first name of a card path that reads the ModelCard's served component, not the role."""


def card_field(role: Role, component: Component | None, path: str) -> object:
    """The card's value at `path` (YAML spelling); None where it, or a section on the way, is
    unset. KeyError for a name that is no field (a typo in the table)."""
    node: object = role
    names = path.split(".")
    if names[0] == COMPONENT:
        if component is None:
            raise KeyError(f"card path {path!r} reads the served component: pass it")
        node, names = component, names[1:]
    for name in names:
        if node is None:
            return None
        if not isinstance(node, BaseModel):
            raise KeyError(f"card path {path!r}: {name!r} is below a value, not a section")
        node = getattr(node, _attribute(type(node), name, path))
    return node


def _attribute(model: type[BaseModel], name: str, path: str) -> str:
    for attribute, info in model.model_fields.items():
        if name in (attribute, info.alias):
            return attribute
    raise KeyError(f"card path {path!r}: {model.__name__} has no field {name!r}")


def card_value(
    setting: EngineSetting,
    role: Role,
    component: Component | None = None,
    paths: tuple[str, ...] | None = None,
) -> Value | None:
    """The setting's value on the cards: its first card field that is set (or the first of
    `paths`), in the runtime's words; None where none is set."""
    for path in setting.card if paths is None else paths:
        value = card_field(role, component, path)
        if value is not None:
            break
    else:
        return None
    if setting.card_values is not None:
        return setting.card_values.get(str(value))
    if not isinstance(value, int | float | str):  # bool is an int
        raise TypeError(f"{setting.name}: card field holds {value!r}, not a setting's value")
    return value


def _written(value: Value | None, setting: EngineSetting) -> TypeGuard[Value]:
    """Whether the card's value is written: set, and not the default where that is omitted."""
    if value is None:
        return False
    return not setting.omit_default or value != setting.default


def flag_value(value: Value) -> str:
    """A value as a flag's argument (floats without a trailing .0: 2.5, 48)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def runtime_engine_flags(role: Role, component: Component) -> list[str]:
    """The role's engine settings as `loom runtime` flags, in the table's order: each with a
    runtime flag and a card value (a bool's flag alone where the card flips its default)."""
    argv: list[str] = []
    for setting in engine_settings.SETTINGS:
        value = card_value(setting, role, component)
        if setting.flag is None or not _written(value, setting):
            continue
        argv += [setting.flag] if setting.kind is bool else [setting.flag, flag_value(value)]
    return argv


def vllm_engine_flags(role: Role, component: Component) -> dict[str, list[str]]:
    """The role's engine settings as `vllm serve` flags, by setting name in the table's order:
    each with a vLLM flag and a card value (a switch always; the others as natively written)."""
    flags: dict[str, list[str]] = {}
    for setting in engine_settings.SETTINGS:
        vllm = setting.vllm
        if vllm is None:
            continue
        value = card_value(setting, role, component, None if vllm.card is None else (vllm.card,))
        if value is not None and (vllm.form == "switch" or _written(value, setting)):
            flags[setting.name] = vllm_flag(vllm, value)
    return flags


def vllm_engine_env(role: Role, component: Component) -> list[tuple[str, str]]:
    """The role's engine settings that vLLM reads from its environment, (name, value) in the
    table's order: each with a `vllm_env` and a card value written as the native flag would be
    (a bool as 1 or 0)."""
    env: list[tuple[str, str]] = []
    for setting in engine_settings.SETTINGS:
        value = card_value(setting, role, component)
        if setting.vllm_env is None or not _written(value, setting):
            continue
        env.append((setting.vllm_env, str(int(value)) if isinstance(value, bool) else
                    flag_value(value)))  # fmt: skip
    return env


def vllm_flag(flag: VllmFlag, value: Value) -> list[str]:
    """One `vllm serve` flag holding `value`."""
    if flag.form == "switch":
        return [flag.name if value else "--no-" + flag.name.removeprefix("--")]
    if flag.form == "present":
        return [flag.name]
    if flag.scale is not None and not isinstance(value, str | bool):
        return [flag.name, str(int(value * flag.scale))]
    return [flag.name, flag_value(value)]


def vllm_default(name: str) -> list[str]:
    """Setting `name`'s vLLM flag holding the runtime's default (for a flag vLLM needs where
    the cards have no field); KeyError if the table gives it no vLLM flag or no default."""
    declared = engine_settings.setting(name)
    if declared.vllm is None or declared.default is None:
        raise KeyError(f"engine setting {name!r} has no vLLM flag or no default")
    return vllm_flag(declared.vllm, declared.default)
