"""loom_trainer: the trainer-side client that pushes weights into a running Loom fleet.

Imports torch and the standard library only (and NIXL, when a push asks for it): never Loom's
runtime, operator or router.
"""

from loom_trainer.client import PushResult, WeightSync
from loom_trainer.errors import PushError, PushFailed, PushRefused

__all__ = ["PushError", "PushFailed", "PushRefused", "PushResult", "WeightSync"]
