"""The one definition of how a trainer's pushed version is named between the operator and the
workers: `LoadWeights(source="push://<id>")` swaps in the version push <id> staged (docs/rl.md).

Owns the scheme; never receives or stages a push (serve/push_receiver.py does).
"""

from __future__ import annotations

PUSH_SCHEME = "push://"
