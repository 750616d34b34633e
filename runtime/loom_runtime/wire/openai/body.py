"""The base of every OpenAI request model: strict types, frozen, and fields the schema does not
define kept aside (request.py names or refuses them).

Owns that configuration; never defines a field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictBody(BaseModel):
    """Strict types; fields this schema does not define are kept aside (`unknown_fields`)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)
