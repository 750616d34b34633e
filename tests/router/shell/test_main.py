"""The router process's construction: a tokenizer it cannot load is a config error that names the
ROUTER.json field."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_router.errors import ConfigError
from loom_router.shell.main import load_tokenizer


def test_a_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokenizer_path"):
        load_tokenizer(tmp_path)
