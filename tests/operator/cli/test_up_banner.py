"""`loom up`'s banner names a `loom` that works from this shell (finding 4: `loom status` was
printed although only `.venv/bin/loom` existed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loom_operator.cli.up import loom_command


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_loom_off_path_is_named_by_the_path_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = _script(tmp_path / ".venv" / "bin" / "loom")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert loom_command(str(exe)) == ".venv/bin/loom"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert loom_command(str(exe)) == str(exe.resolve())


def test_a_loom_on_path_is_plain_loom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path / "bin" / "loom")
    monkeypatch.setenv("PATH", str(exe.parent))
    assert loom_command(str(exe)) == "loom"
    other = _script(tmp_path / "other" / "loom")  # another loom on PATH: not this one
    monkeypatch.chdir(tmp_path)
    assert loom_command(str(other)) == "other/loom"


def test_python_m_is_named_as_such() -> None:
    assert loom_command("/x/loom_operator/cli/__main__.py") == (
        f"{sys.executable} -m loom_operator.cli"
    )
