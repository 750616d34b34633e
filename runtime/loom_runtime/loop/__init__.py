"""The loop contract: init -> (next -> execute -> advance)* -> finalize.

Describes work; never runs a kernel itself and never holds per-request state at module level.
"""

from loom_runtime.loop.contract import Done, Loop, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.loop.runner import LoopRunner, LoopStepLimitError

__all__ = [
    "Done",
    "Loop",
    "LoopContext",
    "LoopRunner",
    "LoopStepLimitError",
    "ResourceRequest",
    "WorkPlan",
]
