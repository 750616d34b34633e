"""The RL example's tests use the local-fleet tests' environment for child processes."""

from tests.operator.local.conftest import child_env

__all__ = ["child_env"]
