"""Checks that an engine hashes prefix blocks exactly as the router does, from its KV events.

Owns the comparison only (pure); never stores blocks. A mismatch (block size, seed or hash
algorithm) is reported loudly instead of letting the precise scorer silently score zero.
"""

from __future__ import annotations

from loom_router.core.kv_events import index_key
from loom_runtime.wire.kv_events import BlockStored
from loom_runtime.wire.prefix_hash import PrefixHasher

_TRUNCATED = 8  # an int-format hash on the wire: the low 64 bits only


def checkable(event: BlockStored) -> bool:
    """Whether the first block's hash can be recomputed: its parent is the seed or a full digest.

    With int-format hashes a parent is truncated to 64 bits, so only first blocks of a
    sequence (no parent) can be checked; those carry the seed, which is what drifts.
    """
    parent = event.parent_block_hash
    return bool(event.block_hashes) and (parent is None or len(parent) > _TRUNCATED)


def hash_problem(event: BlockStored, hasher: PrefixHasher) -> str | None:
    """Why this event's blocks can never match the router's hashes, or None if they can.

    Returns None as well when the event cannot be checked (see `checkable`).
    """
    if event.block_size != hasher.block_size:
        return (
            f"engine block size {event.block_size} != router block size {hasher.block_size}; "
            "set the same engine.blockSize for every role the router predicts"
        )
    if not checkable(event) or len(event.token_ids) < hasher.block_size:
        return None
    extra = event.extra_keys[0] if event.extra_keys else None
    if extra is None and event.lora_name is not None:
        extra = (event.lora_name,)
    expected = hasher.hash_block(
        event.parent_block_hash, event.token_ids[: hasher.block_size], extra
    )
    if index_key(expected) != index_key(event.block_hashes[0]):
        return (
            f"engine block hash differs from the router's (router: algo {hasher.algo!r}, "
            f"seed {hasher.seed!r}); engines and router must share "
            "spec.prefixCaching.hashAlgo and hashSeed"
        )
    return None
