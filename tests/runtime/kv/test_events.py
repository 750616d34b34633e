"""KV events on the wire: byte-equal to vLLM's msgspec encoding, published over ZMQ, replayable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgpack
import pytest
import zmq

from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.errors import KVConfigError
from loom_runtime.kv.event_publisher import END_SEQ, KVEventPublisher
from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.kv_event_codec import encode_batch, wire_hash
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBuffer

H1, H2, H3 = bytes(range(32)), bytes(range(100, 132)), bytes([0xFF] * 32)
TS = 1757500000.25
TOKENS = (*range(1, 9), 300, 70000, 0, 127, 128, 255, 256, 65536)
GOLDEN_EVENTS = [
    BlockStored(
        (H1, H2),
        None,
        TOKENS,
        8,
        extra_keys=(("salt",), None),
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    ),
    BlockStored(
        (H3,),
        H2,
        tuple(range(8)),
        8,
        extra_keys=(None,),
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    ),
    BlockRemoved((H1,), group_idx=0),
    AllBlocksCleared(),
]
# msgspec 0.22 `msgspec.msgpack.encode(KVEventBatch(ts=TS, events=..., data_parallel_rank=2))`
# with vLLM's struct definitions (vllm/distributed/kv_events.py; "array" = KVCacheEvent with
# array_like=True as before vLLM PR #42892, "map" = after it) and block hashes converted by
# maybe_convert_block_hash ("int" = VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default).
GOLDEN = {
    ("map", "int"): (
        "93cb41da305498100000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf"
        "18191a1b1c1d1e1fcf7c7d7e7f80818283b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69"
        "6473dc00100102030405060708cd012cce00011170007fcc80ccffcd0100ce00010000aa626c6f636b5f7369"
        "7a6508a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579"
        "739291a473616c74c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c"
        "5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfff"
        "ffffffffffffffb1706172656e745f626c6f636b5f68617368cf7c7d7e7f80818283a9746f6b656e5f696473"
        "980001020304050607aa626c6f636b5f73697a6508a76c6f72615f6964c0a66d656469756da3475055a96c6f"
        "72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f7370"
        "65635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c"
        "6f636b5f68617368657391cf18191a1b1c1d1e1fa66d656469756da3475055a967726f75705f6964780081a4"
        "74797065b0416c6c426c6f636b73436c656172656402"
    ),
    ("map", "bytes"): (
        "93cb41da305498100000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c4"
        "20000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fc4206465666768696a6b6c"
        "6d6e6f707172737475767778797a7b7c7d7e7f80818283b1706172656e745f626c6f636b5f68617368c0a974"
        "6f6b656e5f696473dc00100102030405060708cd012cce00011170007fcc80ccffcd0100ce00010000aa626c"
        "6f636b5f73697a6508a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa657874"
        "72615f6b6579739291a473616c74c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e"
        "64ae66756c6c5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173"
        "68657391c420ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffb1706172656e"
        "745f626c6f636b5f68617368c4206465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f8081"
        "8283a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6508a76c6f72615f6964c0a66d"
        "656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800"
        "b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f"
        "636b52656d6f766564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112"
        "131415161718191a1b1c1d1e1fa66d656469756da3475055a967726f75705f6964780081a474797065b0416c"
        "6c426c6f636b73436c656172656402"
    ),
    ("array", "int"): (
        "93cb41da305498100000949cab426c6f636b53746f72656492cf18191a1b1c1d1e1fcf7c7d7e7f80818283c0"
        "dc00100102030405060708cd012cce00011170007fcc80ccffcd0100ce0001000008c0a3475055c09291a473"
        "616c74c000ae66756c6c5f617474656e74696f6ec09cab426c6f636b53746f72656491cfffffffffffffffff"
        "cf7c7d7e7f8081828398000102030405060708c0a3475055c091c000ae66756c6c5f617474656e74696f6ec0"
        "94ac426c6f636b52656d6f76656491cf18191a1b1c1d1e1fa34750550091b0416c6c426c6f636b73436c6561"
        "72656402"
    ),
    ("array", "bytes"): (
        "93cb41da305498100000949cab426c6f636b53746f72656492c420000102030405060708090a0b0c0d0e0f10"
        "1112131415161718191a1b1c1d1e1fc4206465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e"
        "7f80818283c0dc00100102030405060708cd012cce00011170007fcc80ccffcd0100ce0001000008c0a34750"
        "55c09291a473616c74c000ae66756c6c5f617474656e74696f6ec09cab426c6f636b53746f72656491c420ff"
        "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffc4206465666768696a6b6c6d6e"
        "6f707172737475767778797a7b7c7d7e7f8081828398000102030405060708c0a3475055c091c000ae66756c"
        "6c5f617474656e74696f6ec094ac426c6f636b52656d6f76656491c420000102030405060708090a0b0c0d0e"
        "0f101112131415161718191a1b1c1d1e1fa34750550091b0416c6c426c6f636b73436c656172656402"
    ),
}


@pytest.mark.parametrize(("layout", "hash_format"), sorted(GOLDEN))
def test_encoding_is_byte_equal_to_vllm_msgspec(layout: str, hash_format: str) -> None:
    got = encode_batch(TS, GOLDEN_EVENTS, 2, layout, hash_format)  # type: ignore[arg-type]
    assert got.hex() == "".join(GOLDEN[(layout, hash_format)])


def test_int_block_hash_is_the_low_64_bits_big_endian() -> None:
    assert wire_hash(H3) == 2**64 - 1
    assert wire_hash(H1) == int.from_bytes(H1[-8:], "big")
    assert wire_hash(H1, "bytes") == H1


def test_bad_wire_options_are_typed_errors() -> None:
    with pytest.raises(WireConfigError):
        encode_batch(TS, [], 0, layout="json")  # type: ignore[arg-type]
    with pytest.raises(WireConfigError):
        KVEventPublisher("tcp://127.0.0.1:*", hash_format="hex")  # type: ignore[arg-type]


def test_event_buffer_is_bounded_and_drops_the_oldest() -> None:
    buffer = EventBuffer(max_events=2)
    for n in range(3):
        buffer.emit(BlockRemoved((n.to_bytes(32, "big"),)))
    assert (buffer.pending, buffer.emitted, buffer.dropped) == (2, 3, 1)
    assert [e.block_hashes[0][-1] for e in buffer.take()] == [1, 2]  # type: ignore[union-attr]
    assert buffer.take() == [] and buffer.pending == 0


# --- a real ZMQ subscriber ----------------------------------------------------------------


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def publisher() -> Iterator[KVEventPublisher]:
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", dp_rank=3, buffer_steps=4)
    yield pub
    pub.close()


def recv(sock: zmq.Socket[bytes], timeout_ms: int = 5000) -> list[bytes]:
    assert sock.poll(timeout_ms), "nothing received before the timeout"
    return sock.recv_multipart()


def subscribe(
    ctx: zmq.Context[zmq.Socket[bytes]], pub: KVEventPublisher
) -> tuple[zmq.Socket[bytes], int]:
    """Connect a SUB socket and publish probes until one arrives (the slow-joiner problem).

    Returns the socket and the sequence number of the first batch after the probe.
    """
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.connect(pub.pub_address)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.emit(AllBlocksCleared())
        assert pub.flush()
        if sub.poll(50):
            while sub.poll(50):  # drain probes still in flight
                sub.recv_multipart()
            return sub, pub.next_seq
    raise AssertionError("subscriber never joined")


def decode(frames: list[bytes]) -> tuple[bytes, int, list[object]]:
    topic, seq, payload = frames
    assert len(seq) == 8
    return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)


def test_subscriber_decodes_pool_events_with_plain_msgpack(
    ctx: zmq.Context[zmq.Socket[bytes]], publisher: KVEventPublisher
) -> None:
    sub, first_seq = subscribe(ctx, publisher)
    pool = BlockPool(2, 2, events=publisher)
    [a, b] = pool.allocate(2)
    pool.commit_blocks([a, b], [H1, H2], None, [1, 2, 3, 4])
    assert publisher.flush()
    pool.release([b, a])
    pool.allocate(1)  # evicts b (the tail)
    assert publisher.flush()
    pool.clear_cache()
    assert publisher.flush()

    batches = [decode(recv(sub)) for _ in range(3)]
    assert [topic for topic, _, _ in batches] == [b"kv-events"] * 3
    assert [seq for _, seq, _ in batches] == [first_seq, first_seq + 1, first_seq + 2]
    ts, events, rank = batches[0][2]
    assert isinstance(ts, float) and rank == 3
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": [wire_hash(H1), wire_hash(H2)],
            "parent_block_hash": None,
            "token_ids": [1, 2, 3, 4],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None, None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ]
    assert list(events[0]) == [  # field order is msgspec's: tag, then declaration order
        "type",
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
    ]
    assert batches[1][2][1] == [
        {"type": "BlockRemoved", "block_hashes": [wire_hash(H2)], "medium": "GPU", "group_idx": 0}
    ]
    assert batches[2][2][1] == [{"type": "AllBlocksCleared"}]
    sub.close(linger=0)


def test_replay_returns_exactly_the_missed_batches(
    ctx: zmq.Context[zmq.Socket[bytes]], publisher: KVEventPublisher
) -> None:
    sub, first_seq = subscribe(ctx, publisher)
    live = []
    for n in range(3):
        publisher.emit(BlockRemoved((n.to_bytes(32, "big"),)))
        assert publisher.flush()
        live.append(recv(sub))
    assert [int.from_bytes(f[1], "big") for f in live] == [first_seq + n for n in range(3)]

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(publisher.replay_address or "")
    dealer.send_multipart([b"", (first_seq + 1).to_bytes(8, "big")])
    replies = [recv(dealer) for _ in range(3)]
    assert replies[:2] == [[b"", f[1], f[2]] for f in live[1:]]
    assert replies[2] == [b"", END_SEQ, b""]
    assert int.from_bytes(END_SEQ, "big", signed=True) == -1

    # History is bounded (buffer_steps=4): replay from 0 starts at the oldest kept batch.
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    seqs = []
    while (frames := recv(dealer))[1] != END_SEQ:
        seqs.append(int.from_bytes(frames[1], "big"))
    last = first_seq + 2
    assert seqs == list(range(last - 3, last + 1))
    dealer.close(linger=0)
    sub.close(linger=0)


def test_close_publishes_pending_events_and_leaves_no_thread() -> None:
    pub = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    pub.emit(AllBlocksCleared())
    pub.close()
    assert pub.source.pending == 0 and pub.next_seq == 1
    assert not any(t.name == "loom-kv-events" for t in threading.enumerate())
    pub.close()  # idempotent


def test_binding_a_taken_address_is_a_typed_error() -> None:
    with (
        KVEventPublisher("tcp://127.0.0.1:*") as first,
        pytest.raises(KVConfigError, match="cannot bind"),
    ):
        KVEventPublisher(first.pub_address)
