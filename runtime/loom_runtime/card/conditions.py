"""Status conditions in the Kubernetes shape, shared by the status of every card.

Owns the condition record and its vocabulary; never decides when a condition changes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from loom_runtime.card.base import CardModel

ConditionType = Literal["Ready", "Progressing", "Degraded", "WeightSyncing", "Valid"]
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(CardModel):
    """One observation about the card, as in metav1.Condition."""

    type: ConditionType
    """Ready | Progressing | Degraded | WeightSyncing | Valid."""
    status: ConditionStatus
    """True | False | Unknown."""
    reason: str = ""
    """One CamelCase word saying why, e.g. `InvalidSpec`, `Draining`."""
    message: str = ""
    """What happened and what to do, for humans."""
    last_transition_time: datetime | None = Field(default=None, strict=False)
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this condition was computed from."""
