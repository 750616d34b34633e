"""The dit family's registration, runtime half (card/families.py holds its facts): the text
engine does not serve it (a diffusers checkpoint goes to the diffusion worker, found by its
model_index.json); `loom://tiny-wan` is its tiny checkpoint.

Owns that wiring only.
"""

from __future__ import annotations

from loom_runtime.models.family import FamilyRuntime
from loom_runtime.models.wan.tiny import init_tiny_wan

RUNTIME = FamilyRuntime(write_tiny=init_tiny_wan, tiny_marker="model_index.json")
