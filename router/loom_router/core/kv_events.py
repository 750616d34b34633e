"""Decodes vLLM's KV-event wire format (ZMQ frames, msgpack batches) into `wire` records.

Owns decoding only (pure functions, the inverse of `wire.kv_event_codec`); never opens a socket.

Accepts both layouts vLLM has used: tagged maps (`{"type": "BlockStored", ...}`, current) and
tagged arrays (`["BlockStored", ...]`, older; trailing fields may be missing). Block hashes
may be ints (the low 64 bits of the digest, big-endian: vLLM's default) or bytes (the full
digest); ints become 8 big-endian bytes, so `index_key` gives the same key for both forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from loom_router.errors import KVEventDecodeError
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loom_runtime.wire.prefix_hash import BlockHash

_U64 = (1 << 64) - 1
_MAX_PAYLOAD = 64 << 20  # a batch larger than this is refused, not unpacked
REPLAY_END_SEQ = -1
"""The sequence number of vLLM's end-of-replay marker (sent as signed 8 bytes)."""

# Field names in vLLM's declaration order (array layout is positional).
_STORED = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED = ("block_hashes", "medium", "group_idx")


@dataclass(frozen=True)
class DecodedBatch:
    """One `KVEventBatch`. `skipped` counts events of a type this router does not know."""

    ts: float
    events: tuple[KVEvent, ...]
    dp_rank: int | None
    skipped: int = 0


@dataclass(frozen=True)
class EventMessage:
    """One PUB message (or one replayed batch): topic, sequence number and the batch."""

    topic: str
    seq: int
    batch: DecodedBatch


def index_key(block_hash: BlockHash | int) -> int:
    """The key the prefix index uses for a block: the low 64 bits of its hash, as an int."""
    if isinstance(block_hash, int):
        return block_hash & _U64
    return int.from_bytes(block_hash[-8:], "big")


def decode_message(frames: Sequence[bytes]) -> EventMessage:
    """A PUB message `[topic, seq (u64 big-endian), payload]`."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"a KV-event message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    return EventMessage(_text(topic), _seq(seq, signed=False), decode_batch(payload))


def decode_replay(frames: Sequence[bytes]) -> EventMessage | None:
    """A replay reply as a DEALER sees it, `[b"", seq, payload]`; None for the end marker."""
    if len(frames) != 3 or frames[0] != b"":
        raise KVEventDecodeError(f"a replay reply is [b'', seq, payload], got {len(frames)} frames")
    seq = _seq(frames[1], signed=True)
    if seq == REPLAY_END_SEQ:
        return None
    return EventMessage("", seq, decode_batch(frames[2]))


def replay_request(start_seq: int) -> list[bytes]:
    """The frames a DEALER sends to a replay ROUTER to get every batch with seq >= start_seq."""
    if start_seq < 0:
        raise KVEventDecodeError(f"replay start must be >= 0, got {start_seq}")
    return [b"", start_seq.to_bytes(8, "big")]


def decode_batch(payload: bytes) -> DecodedBatch:
    """msgpack `[ts, [event, ...], dp_rank]` (dp_rank may be absent in old vLLM)."""
    if len(payload) > _MAX_PAYLOAD:
        raise KVEventDecodeError(f"batch of {len(payload)} bytes is over {_MAX_PAYLOAD}")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KVEventDecodeError(f"batch is not msgpack: {exc}") from exc
    if not isinstance(body, list) or len(body) not in (2, 3) or not isinstance(body[1], list):
        raise KVEventDecodeError(f"batch must be [ts, [events], dp_rank], got {_brief(body)}")
    ts, raw_events = body[0], body[1]
    dp_rank = body[2] if len(body) == 3 else None
    if not isinstance(ts, int | float) or not (dp_rank is None or isinstance(dp_rank, int)):
        raise KVEventDecodeError(f"bad batch header ts={ts!r} dp_rank={dp_rank!r}")
    events: list[KVEvent] = []
    skipped = 0
    for i, raw in enumerate(raw_events):
        event = _event(raw, i)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return DecodedBatch(float(ts), tuple(events), dp_rank, skipped)


def _event(raw: Any, position: int) -> KVEvent | None:
    if isinstance(raw, dict):
        tag, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = {"BlockStored": _STORED, "BlockRemoved": _REMOVED}.get(str(tag), ())
        if len(raw) - 1 > len(names) and names:
            raise KVEventDecodeError(f"event {position}: {tag} has {len(raw) - 1} fields")
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventDecodeError(f"event {position} is neither a map nor an array: {_brief(raw)}")
    try:
        if tag == "BlockStored":
            return _stored(fields)
        if tag == "BlockRemoved":
            return BlockRemoved(
                block_hashes=_hashes(fields["block_hashes"]),
                medium=_opt_str(fields.get("medium", "GPU")),
                group_idx=_opt_int(fields.get("group_idx")),
            )
        if tag == "AllBlocksCleared":
            return AllBlocksCleared()
    except (KeyError, TypeError, ValueError) as exc:
        raise KVEventDecodeError(f"event {position} ({tag}) is malformed: {exc!r}") from exc
    return None  # a newer event type: skipped and counted, never fatal


def _stored(f: dict[str, Any]) -> BlockStored:
    hashes = _hashes(f["block_hashes"])
    parent = f.get("parent_block_hash")
    tokens = f["token_ids"]
    block_size = f["block_size"]
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise TypeError("token_ids must be a list of ints")
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    keys = f.get("extra_keys")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else _hash(parent),
        token_ids=tuple(tokens),
        block_size=block_size,
        lora_id=_opt_int(f.get("lora_id")),
        medium=_opt_str(f.get("medium", "GPU")),
        lora_name=_opt_str(f.get("lora_name")),
        extra_keys=None if keys is None else tuple(None if k is None else tuple(k) for k in keys),
        group_idx=_opt_int(f.get("group_idx")),
        kv_cache_spec_kind=_opt_str(f.get("kv_cache_spec_kind")),
        kv_cache_spec_sliding_window=_opt_int(f.get("kv_cache_spec_sliding_window")),
    )


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool):
        raise TypeError("a block hash is an int or bytes, got a bool")
    if isinstance(value, int):
        return (value & _U64).to_bytes(8, "big")
    if isinstance(value, bytes) and value:
        return value
    raise TypeError(f"a block hash is an int or bytes, got {type(value).__name__}")


def _hashes(values: Any) -> tuple[BlockHash, ...]:
    if not isinstance(values, list):
        raise TypeError("block_hashes must be a list")
    return tuple(_hash(v) for v in values)


def _opt_int(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"expected an int or nil, got {type(value).__name__}")


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"expected a string or nil, got {type(value).__name__}")


def _seq(frame: bytes, signed: bool) -> int:
    if len(frame) != 8:
        raise KVEventDecodeError(f"sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=signed)


def _text(frame: bytes) -> str:
    try:
        return frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KVEventDecodeError(f"topic is not UTF-8: {exc}") from exc


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
