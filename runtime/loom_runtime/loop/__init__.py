"""The loop contract: init -> (next -> execute -> advance)* -> finalize.

Describes work and routes it to executors; never runs a kernel itself and never holds
per-request state at module level.
"""

from loom_runtime.loop.contract import (
    Done,
    Executor,
    LoopContext,
    ResourceRequest,
    WorkPlan,
)
from loom_runtime.loop.execute import NoExecutorError, execute_plans

__all__ = [
    "Done",
    "Executor",
    "LoopContext",
    "NoExecutorError",
    "ResourceRequest",
    "WorkPlan",
    "execute_plans",
]
