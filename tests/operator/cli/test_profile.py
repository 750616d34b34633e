"""`loom profile`: a real run of `--quick` on the tiny model's card prints a valid capacity
section whose decode figures obey the ITL target (the card's, or --itl-ms); a card that cannot be
profiled, or a worker that cannot start, is a clear error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loom_operator.api.autoscaling import ScaleCapacity
from loom_operator.cli import main
from loom_operator.cli.profile import ProfileArgsError, itl_target
from loom_operator.local.cards import parse_fleet_cards
from loom_operator.testing.cards import card_text
from loom_runtime.models.tiny import init_tiny

MAX_NUM_SEQS = 4
RUN_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


def write(path: Path, source: str, autoscaling: str = "") -> Path:
    text = card_text(source, max_num_seqs=MAX_NUM_SEQS, autoscaling=autoscaling)
    path.write_text(text)
    return path


def child_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("LOOM_CACHE", str(tmp_path / "loom-cache"))
    return env


def profile(card: Path, tmp_path: Path, *flags: str) -> tuple[ScaleCapacity, dict[str, Any], str]:
    """`loom profile --quick CARD` in a child process: the section it printed (loaded as a card
    loads it), its --json measurements and its stderr."""
    out = tmp_path / "profile.json"
    argv = [sys.executable, "-m", "loom_operator.cli", "profile", str(card), "--quick",
            "--json", str(out), *flags]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, env=child_env(tmp_path), timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    section = ScaleCapacity.model_validate(yaml.safe_load(done.stdout)["capacity"])
    return section, json.loads(out.read_text()), done.stderr


def test_a_quick_profile_prints_a_valid_section_within_the_cards_itl_target(
    tiny: Path, tmp_path: Path
) -> None:
    card = write(tmp_path / "card.yaml", f"file://{tiny}", "    targets: {itlP90Ms: 60000}\n")
    section, data, stderr = profile(card, tmp_path)
    assert section.prefill_tokens_per_second is not None and section.prefill_tokens_per_second > 0
    assert section.decode_tokens_per_second is not None and section.decode_tokens_per_second > 0
    levels = {lvl["concurrency"]: lvl for lvl in data["decode"]}
    assert list(levels) == [1, 2, 4]  # 1, 2, 4: up to maxNumSeqs
    within = [c for c, lvl in levels.items() if lvl["itl_p90_ms"] <= 60000]
    assert section.decode_sequences == max(within) == MAX_NUM_SEQS
    assert levels[MAX_NUM_SEQS]["tokens"] > 0
    assert data["itl_target_ms"] == 60000
    assert "prefill round 3/3" in stderr and "Decode sweep" in stderr


def test_an_itl_target_no_level_meets_leaves_decode_unset(tiny: Path, tmp_path: Path) -> None:
    card = write(tmp_path / "card.yaml", f"file://{tiny}", "    targets: {itlP90Ms: 60000}\n")
    section, data, stderr = profile(card, tmp_path, "--itl-ms", "0.001")
    assert data["itl_target_ms"] == 0.001  # --itl-ms wins over the card's target
    assert [lvl["concurrency"] for lvl in data["decode"]] == [1]  # over target: the sweep stops
    assert data["decode"][0]["itl_p90_ms"] > 0.001
    assert section.decode_sequences is None and section.decode_tokens_per_second is None
    assert section.prefill_tokens_per_second is not None
    assert "decode figures stay unset" in stderr


def test_the_itl_target_is_the_flag_else_the_cards(tmp_path: Path) -> None:
    cards = parse_fleet_cards(
        write(tmp_path / "a.yaml", "file:///x", "    targets: {itlP90Ms: 40}\n")
    )
    assert itl_target(cards, None) == 40
    assert itl_target(cards, 25.0) == 25
    bare = parse_fleet_cards(write(tmp_path / "b.yaml", "file:///x"))
    with pytest.raises(ProfileArgsError, match="itlP90Ms in the card or pass --itl-ms"):
        itl_target(bare, None)
    with pytest.raises(ProfileArgsError, match="must be positive"):
        itl_target(bare, 0.0)


def test_a_card_without_its_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = card_text("file:///x").split("---\n", 1)[1]  # the DeploymentCard alone
    card = tmp_path / "card.yaml"
    card.write_text(text)
    assert main(["profile", str(card), "--itl-ms", "50"]) == 2
    assert "put that ModelCard in the same file" in capsys.readouterr().err


def test_a_worker_that_cannot_start_names_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-weights"
    empty.mkdir()
    card = write(tmp_path / "card.yaml", f"file://{empty}")
    for key, value in child_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    assert main(["profile", str(card), "--itl-ms", "50", "--quick"]) == 1
    err = capsys.readouterr().err
    assert "before it was ready; its log:" in err
    log = Path(err.split("its log: ")[1].split()[0])
    assert log.is_file() and "loom starts profile-aggregated" in log.read_text()
    assert f"logs kept in {log.parent}" in err
    shutil.rmtree(log.parent)
