"""vLLM's KV-event wire format: the msgpack bytes a `KVEventBatch` encodes to under msgspec.

Owns encoding only (pure functions); never opens a socket and never decides what to send.

The batch is array-like: `[ts, [event, ...], data_parallel_rank]`. Events are msgspec structs
with `tag=True` (tag field "type" = class name) and `omit_defaults=True`:
- layout "map" (vLLM since PR #42892): `{"type": "BlockStored", field: value, ...}` in field
  declaration order, fields that have a default in vLLM's struct left out when they equal it;
- layout "array" (older vLLM): `["BlockStored", value, ...]`, every field present (msgspec
  does not omit defaults from array-like structs).
Block hashes go out as vLLM sends them by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the
low 64 bits of the digest read big-endian, as an int; hash_format "bytes" sends the full digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgpack

from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loom_runtime.wire.prefix_hash import BlockHash

EventLayout = Literal["map", "array"]
HashFormat = Literal["int", "bytes"]

_U64 = (1 << 64) - 1

# (field, has a default in vLLM's struct) in vLLM's declaration order.
_STORED_FIELDS: tuple[tuple[str, bool], ...] = (
    ("block_hashes", False),
    ("parent_block_hash", False),
    ("token_ids", False),
    ("block_size", False),
    ("lora_id", False),
    ("medium", False),
    ("lora_name", False),
    ("extra_keys", True),
    ("group_idx", True),
    ("kv_cache_spec_kind", True),
    ("kv_cache_spec_sliding_window", True),
)
_REMOVED_FIELDS: tuple[tuple[str, bool], ...] = (
    ("block_hashes", False),
    ("medium", False),
    ("group_idx", True),
)


def check_wire_options(layout: str, hash_format: str) -> None:
    if layout not in ("map", "array"):
        raise WireConfigError(f"event layout must be 'map' or 'array', got {layout!r}")
    if hash_format not in ("int", "bytes"):
        raise WireConfigError(f"hash format must be 'int' or 'bytes', got {hash_format!r}")


def wire_hash(block_hash: BlockHash, hash_format: HashFormat = "int") -> int | bytes:
    """A block hash as vLLM's `maybe_convert_block_hash` puts it on the wire."""
    if hash_format == "bytes":
        return bytes(block_hash)
    return int.from_bytes(block_hash, "big") & _U64


def _values(event: BlockStored | BlockRemoved, hash_format: HashFormat) -> dict[str, Any]:
    values: dict[str, Any] = {
        "block_hashes": [wire_hash(h, hash_format) for h in event.block_hashes]
    }
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        values["parent_block_hash"] = None if parent is None else wire_hash(parent, hash_format)
        values["token_ids"] = list(event.token_ids)
        values["block_size"] = event.block_size
        values["lora_id"] = event.lora_id
        values["lora_name"] = event.lora_name
        keys = event.extra_keys
        values["extra_keys"] = (
            None if keys is None else [None if k is None else list(k) for k in keys]
        )
        values["kv_cache_spec_kind"] = event.kv_cache_spec_kind
        values["kv_cache_spec_sliding_window"] = event.kv_cache_spec_sliding_window
    values["medium"] = event.medium
    values["group_idx"] = event.group_idx
    return values


def event_to_wire(
    event: KVEvent, layout: EventLayout = "map", hash_format: HashFormat = "int"
) -> dict[str, Any] | list[Any]:
    """The plain msgpack-ready value msgspec would produce for this event."""
    tag = type(event).__name__
    if isinstance(event, AllBlocksCleared):
        return {"type": tag} if layout == "map" else [tag]
    fields = _STORED_FIELDS if isinstance(event, BlockStored) else _REMOVED_FIELDS
    values = _values(event, hash_format)
    if layout == "array":
        return [tag, *(values[name] for name, _ in fields)]
    wire: dict[str, Any] = {"type": tag}
    for name, has_default in fields:
        if not (has_default and values[name] is None):
            wire[name] = values[name]
    return wire


def encode_batch(
    ts: float,
    events: Sequence[KVEvent],
    dp_rank: int | None,
    layout: EventLayout = "map",
    hash_format: HashFormat = "int",
) -> bytes:
    """msgpack bytes of `KVEventBatch(ts, events, data_parallel_rank)`, byte-equal to msgspec's."""
    check_wire_options(layout, hash_format)
    body = [float(ts), [event_to_wire(e, layout, hash_format) for e in events], dp_rank]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed
