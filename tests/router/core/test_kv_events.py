from __future__ import annotations

import hashlib

import msgpack
import pytest

from loom_router.core.kv_events import (
    decode_batch,
    decode_message,
    decode_replay,
    index_key,
    replay_request,
)
from loom_router.errors import KVEventDecodeError
from loom_runtime.wire.kv_event_codec import encode_batch
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

H1 = hashlib.sha256(b"one").digest()
H2 = hashlib.sha256(b"two").digest()
H0 = hashlib.sha256(b"parent").digest()

STORED = BlockStored(
    block_hashes=(H1, H2),
    parent_block_hash=H0,
    token_ids=tuple(range(8)),
    block_size=4,
    lora_id=None,
    medium="GPU",
    extra_keys=(None, ("salt",)),
    group_idx=0,
    kv_cache_spec_kind="full_attention",
)
EVENTS = (STORED, BlockRemoved(block_hashes=(H2,), medium="CPU"), AllBlocksCleared())


@pytest.mark.parametrize("layout", ["map", "array"])
@pytest.mark.parametrize("hash_format", ["int", "bytes"])
def test_decodes_what_the_engine_encodes(layout: str, hash_format: str) -> None:
    payload = encode_batch(12.5, EVENTS, 3, layout=layout, hash_format=hash_format)  # type: ignore[arg-type]
    batch = decode_batch(payload)
    assert (batch.ts, batch.dp_rank, batch.skipped) == (12.5, 3, 0)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert isinstance(removed, BlockRemoved)
    assert isinstance(cleared, AllBlocksCleared)
    # Whatever the hash format, the index keys are the low 64 bits of the digests.
    assert [index_key(h) for h in stored.block_hashes] == [index_key(H1), index_key(H2)]
    assert stored.parent_block_hash is not None
    assert index_key(stored.parent_block_hash) == index_key(H0)
    assert stored.token_ids == STORED.token_ids
    assert stored.block_size == 4
    assert stored.extra_keys == (None, ("salt",))
    assert (stored.medium, stored.group_idx, stored.kv_cache_spec_kind) == (
        "GPU",
        0,
        "full_attention",
    )
    assert [index_key(h) for h in removed.block_hashes] == [index_key(H2)]
    assert removed.medium == "CPU"
    if hash_format == "bytes":
        assert stored.block_hashes == (H1, H2)  # full digests survive


def test_index_key_is_the_low_64_bits_big_endian() -> None:
    assert index_key(H1) == int.from_bytes(H1, "big") & ((1 << 64) - 1)
    assert index_key(int.from_bytes(H1[-8:], "big")) == index_key(H1)
    assert index_key(-1) == (1 << 64) - 1


def test_old_array_layout_with_fewer_fields_and_no_dp_rank() -> None:
    # vLLM before medium/lora_name existed: 5 fields, batch of [ts, events].
    payload = msgpack.packb(
        [1.0, [["BlockStored", [7, 8], None, [1, 2, 3, 4], 2, None], ["BlockRemoved", [7]]]]
    )
    batch = decode_batch(payload)
    assert batch.dp_rank is None
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert [index_key(h) for h in stored.block_hashes] == [7, 8]
    assert stored.parent_block_hash is None and stored.medium == "GPU"
    assert removed.medium == "GPU"


def test_unknown_event_types_are_skipped_and_counted() -> None:
    payload = msgpack.packb(
        [
            1.0,
            [{"type": "BlockPinned", "x": 1}, ["FutureEvent", 1], {"type": "AllBlocksCleared"}],
            0,
        ]
    )
    batch = decode_batch(payload)
    assert batch.skipped == 2
    assert batch.events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0, "events", 0]),
        msgpack.packb(["ts", [], 0]),
        msgpack.packb([1.0, [42], 0]),
        msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1]}], 0]),  # missing fields
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": ["x"]}], 0]),
        msgpack.packb([1.0, [["BlockRemoved", [1], "GPU", 0, "extra"]], 0]),  # too many fields
        msgpack.packb(
            [
                1.0,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": [1],
                        "parent_block_hash": None,
                        "token_ids": [1],
                        "block_size": 0,
                    }
                ],
                0,
            ]
        ),
    ],
)
def test_malformed_batches_are_typed_errors(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_pub_message_frames() -> None:
    payload = encode_batch(1.0, [AllBlocksCleared()], 0)
    msg = decode_message([b"kv-events", (41).to_bytes(8, "big"), payload])
    assert (msg.topic, msg.seq, msg.batch.events) == ("kv-events", 41, (AllBlocksCleared(),))
    with pytest.raises(KVEventDecodeError):
        decode_message([b"kv-events", payload])
    with pytest.raises(KVEventDecodeError):
        decode_message([b"kv-events", b"\x01", payload])


def test_replay_frames_and_end_marker() -> None:
    payload = encode_batch(1.0, [AllBlocksCleared()], 0)
    msg = decode_replay([b"", (7).to_bytes(8, "big"), payload])
    assert msg is not None and msg.seq == 7
    assert decode_replay([b"", (-1).to_bytes(8, "big", signed=True), b""]) is None
    assert replay_request(5) == [b"", (5).to_bytes(8, "big")]
    with pytest.raises(KVEventDecodeError):
        replay_request(-1)
