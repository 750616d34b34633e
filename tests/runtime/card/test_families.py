"""The model-family registry: built-ins whose facts match their runtime halves, families added and
removed, clashes refused, and plugins loaded from LOOM_PLUGINS (a module or a .py path) in a fresh
process — a broken plugin stops it with its cause."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loom_runtime.card import families
from loom_runtime.card.families import Family
from loom_runtime.models.config import SUPPORTED_MODEL_TYPES
from loom_runtime.models.family import runtime_of
from loom_runtime.models.sparse_mla.config import MODEL_TYPE as SPARSE_MLA_MODEL_TYPE

PLUGIN = """\
from loom_runtime.card.families import Family

LOOM_FAMILIES = (
    Family(name="plugged", model_types=("plugged_lm",), loops=("ar_decode",), runtime="x:y"),
)
"""


def names_in_fresh_process(plugins: str) -> subprocess.CompletedProcess[str]:
    code = "from loom_runtime.card import families; print(','.join(families.names()))"
    env = {**os.environ, families.PLUGINS_ENV: plugins}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_builtin_families_and_what_they_load() -> None:
    assert families.names()[:4] == ("llama", "sparse-mla", "dit", "mot")
    assert families.family("llama").model_types == SUPPORTED_MODEL_TYPES
    assert families.family_of_model_type(SPARSE_MLA_MODEL_TYPE).name == "sparse-mla"
    assert set(families.tiny_checkpoints()) >= {"tiny", "tiny-sparse-mla", "tiny-wan", "tiny-mot"}
    for family in families.BUILTIN:
        runtime = runtime_of(family)
        assert (runtime.write_tiny is not None) == (family.tiny is not None), family.name
        text = runtime.read_config is not None and runtime.build is not None
        assert text == ("ar_decode" in family.loops), family.name


def test_unknown_names_list_the_registered_families() -> None:
    with pytest.raises(
        families.UnknownFamilyError, match="registered: llama, sparse-mla, dit, mot"
    ):
        families.family("mamba")
    with pytest.raises(families.UnknownFamilyError, match=r"supported: .*glm_moe_dsa.*llama"):
        families.family_of_model_type("mamba")


def test_a_registered_family_is_found_until_its_block_ends() -> None:
    extra = Family(name="extra", model_types=("extra_lm",), loops=("ar_decode",), runtime="m:a")
    with families.registered(extra):
        assert families.family("extra") is extra
        assert families.family_of_model_type("extra_lm") is extra
    assert "extra" not in families.names()


@pytest.mark.parametrize(
    ("clash", "message"),
    [
        (Family(name="llama", model_types=(), loops=(), runtime=""), "already registered"),
        (Family(name="x", model_types=("qwen2",), loops=(), runtime=""), "belongs to 'llama'"),
        (Family(name="x", model_types=(), loops=(), runtime="", tiny="tiny"), "is taken"),
    ],
)
def test_clashes_are_refused(clash: Family, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        families.register(clash)
    assert families.names().count("llama") == 1


def test_a_builtin_cannot_be_removed() -> None:
    with pytest.raises(ValueError, match="built-in"):
        families._REGISTRY.unregister("llama")


def test_plugins_load_from_a_path_or_a_module(tmp_path: Path) -> None:
    path = tmp_path / "plugged_family.py"
    path.write_text(PLUGIN)
    by_path = names_in_fresh_process(str(path))
    assert by_path.stdout.strip() == "llama,sparse-mla,dit,mot,plugged", by_path.stderr
    env_path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    code = "from loom_runtime.card import families; print(families.family('plugged').loops)"
    by_module = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": env_path, families.PLUGINS_ENV: " plugged_family ,"},
    )
    assert by_module.stdout.strip() == "('ar_decode',)", by_module.stderr


def test_a_broken_plugin_stops_the_process_with_its_cause(tmp_path: Path) -> None:
    missing = names_in_fresh_process("no_such_loom_plugin")
    assert missing.returncode != 0
    assert "LOOM_PLUGINS names 'no_such_loom_plugin', which cannot be imported" in missing.stderr
    empty = tmp_path / "empty_plugin.py"
    empty.write_text("FAMILIES = ()\n")
    wrong = names_in_fresh_process(str(empty))
    assert wrong.returncode != 0 and "has no LOOM_FAMILIES tuple of Family" in wrong.stderr
