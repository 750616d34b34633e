"""The trainer client's fleet tests use the local-fleet tests' fixtures: two tiny checkpoints,
the tiny sparse-mla checkpoint and an environment for child processes."""

from tests.operator.local.conftest import checkpoints, child_env, sparse_checkpoint

__all__ = ["checkpoints", "child_env", "sparse_checkpoint"]
