"""The KV-event subscriber against the runtime's real ZMQ publisher: live batches feed the index,
batches published before the router connected come back by replay when the first live batch
shows the gap, and a worker that comes back on a new address starts with an empty cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.kv_events import index_key
from loom_router.core.prefix_index import PrefixIndex
from loom_router.shell.kv_subscriber import KVSubscriber
from loom_router.shell.metrics import RouterMetrics
from loom_runtime.kv.event_publisher import KVEventPublisher
from loom_runtime.testing.processes import poll
from loom_runtime.wire.kv_events import BlockStored
from loom_runtime.wire.prefix_hash import PrefixHasher

HASHER = PrefixHasher(16, "0", "sha256_cbor")


def stored(first_token: int) -> tuple[BlockStored, int]:
    """A one-block BlockStored event with a correct hash, and its index key."""
    tokens = tuple(range(first_token, first_token + 16))
    (digest,) = HASHER.hash_blocks(tokens)
    return BlockStored((digest,), None, tokens, 16), index_key(digest)


def publish(pub: KVEventPublisher, first_token: int) -> int:
    event, key = stored(first_token)
    pub.emit(event)
    assert pub.flush(5.0)
    return key


@pytest.fixture
def world() -> Iterator[tuple[PrefixIndex, RouterMetrics, KVSubscriber]]:
    index = PrefixIndex(10_000, HASHER)
    metrics = RouterMetrics()
    sub = KVSubscriber(index, metrics, replay_timeout_s=2.0, poll_ms=10)
    sub.start()
    yield index, metrics, sub
    sub.close()


def feeds(pub: KVEventPublisher) -> EndpointSnapshot:
    e = Endpoint(
        "w0",
        "http://w0",
        "aggregated",
        "v1",
        kv_events=pub.pub_address,
        kv_replay=pub.replay_address,
    )
    return EndpointSnapshot((e,))


def holds(index: PrefixIndex, key: int) -> Callable[[], bool]:
    return lambda: index.match(["w0"], [key]) == {"w0": 1}


def test_missed_batches_are_replayed_and_live_ones_applied(
    world: tuple[PrefixIndex, RouterMetrics, KVSubscriber],
) -> None:
    index, metrics, sub = world
    with KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as pub:
        early = [publish(pub, 100 * i) for i in range(3)]  # before the router listens
        sub.sync(feeds(pub))
        poll(lambda: "w0" in sub.connected, 10, "the subscriber's socket")
        # ZMQ connects in the background: publish until one live batch gets through.
        late: list[int] = []

        def live_seen() -> bool:
            late.append(publish(pub, 10_000 + len(late)))
            return metrics.value("kv_batches", "w0", "live") > 0

        poll(live_seen, 10, "a live batch", interval=0.05)
        for key in early:
            poll(holds(index, key), 10, "a replayed block")
        poll(holds(index, late[-1]), 10, "the live block")
        assert metrics.value("kv_batches", "w0", "replay") >= 3
        assert metrics.value("kv_replays", "w0", "ok") >= 1
        assert metrics.value("kv_gaps", "w0") >= 1
        assert index.pending_replay("w0") is None


def test_a_restarted_publisher_is_followed_and_its_old_blocks_dropped(
    world: tuple[PrefixIndex, RouterMetrics, KVSubscriber],
) -> None:
    index, metrics, sub = world
    with ExitStack() as stack:
        first = stack.enter_context(KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
        sub.sync(feeds(first))
        old = [0]

        def first_live() -> bool:
            old[0] = publish(first, 7)
            return metrics.value("kv_batches", "w0", "live") > 0

        poll(first_live, 10, "a live batch from the first publisher", interval=0.05)
        poll(holds(index, old[0]), 10, "the first publisher's block")
        first.close()
        second = stack.enter_context(KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
        sub.sync(feeds(second))  # the worker came back on new ports (admin PUT)
        new = [0]

        def second_live() -> bool:
            new[0] = publish(second, 500)
            return index.match(["w0"], [new[0]]) == {"w0": 1}

        poll(second_live, 10, "the second publisher's block", interval=0.05)
        assert index.match(["w0"], [old[0]]) == {"w0": 0}  # a new process: an empty cache


def test_with_no_feeds_the_thread_waits_instead_of_spinning() -> None:
    sub = KVSubscriber(PrefixIndex(10, HASHER), RouterMetrics(), poll_ms=20)
    sub.start()
    try:
        before = time.process_time()
        time.sleep(0.5)  # measuring CPU use over a span, not waiting for a condition
        assert time.process_time() - before < 0.15  # a spinning poll burns the whole 0.5 s
    finally:
        sub.close()
