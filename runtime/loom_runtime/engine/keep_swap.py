"""A `keep` weight swap: new weights swapped in under running requests, which continue on them.

Owns the rules of such a swap (which KV policies there are, which versions it may go to); never
touches the model or a request's state (the engine swaps, the batcher and the loop carry the
requests over).
"""

from __future__ import annotations

from typing import Literal

from loom_runtime.errors import InvalidRequestError

KVPolicy = Literal["keep", "recompute"]
KV_POLICIES: tuple[KVPolicy, ...] = ("keep", "recompute")
"""keep: a running request keeps the KV computed under the old weights (what async-RL systems
do); recompute: it drops its KV and re-prefills prompt + output so far under the new weights."""


def check_keep(kv: str, version: str, serving: str) -> KVPolicy:
    """The KV policy of a keep swap to `version`, or InvalidRequestError saying why not."""
    if kv not in KV_POLICIES:
        raise InvalidRequestError(
            f"kv must be one of {', '.join(KV_POLICIES)} for a keep swap, got {kv!r}", param="kv"
        )
    if version == serving:
        raise InvalidRequestError(
            f"already serving weights version {version!r}; caches are keyed by the version, so "
            "new weights need a new version string",
            param="version",
        )
    return "keep" if kv == "keep" else "recompute"
