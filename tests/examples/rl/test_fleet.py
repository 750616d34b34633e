"""The RL example finds a running fleet from its state directory, or says how to start one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from examples.rl.fleet import Fleet, connect


def test_a_state_directory_gives_the_endpoint_the_push_url_and_the_token(tmp_path: Path) -> None:
    (tmp_path / "controller.json").write_text(json.dumps({
        "pid": 1, "started_at": 0.0, "endpoint": "http://127.0.0.1:9/v1",
        "weights_url": "http://127.0.0.1:10",
    }))  # fmt: skip
    (tmp_path / "secrets.json").write_text(json.dumps({"admin_token": "t0k"}))
    assert connect(tmp_path) == Fleet("http://127.0.0.1:9/v1", "http://127.0.0.1:10", "t0k")


def test_a_directory_without_a_fleet_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"loom up examples/rl/card\.yaml --state-dir"):
        connect(tmp_path)
