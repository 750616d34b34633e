"""The declared engine settings (loom_runtime.wire.engine_settings) as `loom runtime` arguments,
and the parsed arguments back as EngineConfig's field values.

Owns the argparse side of the declarations; never builds an EngineConfig (plan_worker does, where
a value needs a type torch owns) and never declares a setting.
"""

from __future__ import annotations

import argparse
from typing import Any

from loom_runtime.wire import engine_settings


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per setting with a runtime flag, in the table's order, each in its group
    (a bool's flag stores the opposite of its default)."""
    groups: dict[str, Any] = {}
    for setting in engine_settings.SETTINGS:
        if setting.flag is None:
            continue
        target: Any = parser
        if setting.group is not None:
            target = groups.get(setting.group) or parser.add_argument_group(setting.group)
            groups[setting.group] = target
        if setting.kind is bool:
            action = "store_false" if setting.default else "store_true"
            target.add_argument(setting.flag, dest=setting.dest, action=action, help=setting.doc)
            continue
        target.add_argument(
            setting.flag,
            dest=setting.dest,
            type=setting.kind,
            default=setting.default,
            choices=setting.choices or None,
            help=setting.doc,
        )


def engine_values(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig field -> parsed value, for each setting with a runtime flag; a dotted name's
    value sits under its first name (`parallel.tp` 2 -> {"parallel": {"tp": 2}})."""
    values: dict[str, Any] = {}
    for setting in engine_settings.SETTINGS:
        if setting.flag is None:
            continue
        head, _, field = setting.name.partition(".")
        value = getattr(args, setting.dest)
        if field:
            values.setdefault(head, {})[field] = value
        else:
            values[head] = value
    return values
