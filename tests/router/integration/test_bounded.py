"""The router's memory stays bounded when 100k distinct prefixes flow through it.

A real router process subscribes to a real KV-event stream: the runtime's own publisher (what
every worker runs), fed here with 100,000 distinct one-block prefixes rather than by an engine
prefilling them, which would take this CPU many minutes. The precise index is capped at 20,000
entries: it must hold at most that many, count every other block as evicted, and the router's
resident memory must not grow with the stream.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loom_runtime.kv.event_publisher import KVEventPublisher
from loom_runtime.wire.kv_events import BlockStored
from loom_runtime.wire.prefix_hash import PrefixHasher

PREFIXES = 100_000
CAP = 20_000
BS = 16


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def prefix(i: int) -> tuple[int, ...]:
    """The i-th distinct one-block prompt."""
    return (10 + i % 3000, 10 + i // 3000, *range(100, 100 + BS - 2))


def test_the_precise_index_stays_bounded_as_100k_prefixes_flow_through(
    launch_router: Any,
) -> None:
    hasher = PrefixHasher(BS, "0", "sha256_cbor")
    with KVEventPublisher("tcp://127.0.0.1:*") as publisher:
        port = int(publisher.pub_address.rsplit(":", 1)[1])
        feed = SimpleNamespace(spec={
            "id": "events", "url": "http://127.0.0.1:9", "role": "aggregated",
            "weights_version": "v1", "kv_events": f"tcp://127.0.0.1:{port}", "kv_replay": None,
        })  # fmt: skip
        flags = ("--max-index-entries", str(CAP))
        with launch_router([feed], flags=flags) as router:
            pid = router.proc.proc.pid

            def counted() -> float:
                entries = router.metric("loom_router:index_entries", index="precise")
                return entries + router.metric("loom_router:index_evictions_total", index="precise")

            probes = iter(range(PREFIXES, PREFIXES + 10_000))

            def subscribed() -> bool:  # PUB drops what it sends before the SUB has joined
                tokens = prefix(next(probes))
                publisher.emit(BlockStored(tuple(hasher.hash_blocks(tokens)), None, tokens, BS))
                return counted() > 0

            router.wait(subscribed, "the router to subscribe", 30)
            publisher.flush()
            last = [-1.0]

            def settled() -> bool:  # the same count twice in a row: nothing more in flight
                now = counted()
                same, last[0] = now == last[0], now
                return same

            router.wait(settled, "the probes to settle")
            base = counted()
            rss = []
            for start in range(0, PREFIXES, 10_000):
                for i in range(start, start + 10_000):
                    tokens = prefix(i)
                    publisher.emit(BlockStored(tuple(hasher.hash_blocks(tokens)), None, tokens, BS))
                router.wait(lambda n=start: counted() >= base + n + 10_000, "the batch", 60)
                rss.append(rss_mib(pid))
            entries = router.metric("loom_router:index_entries", index="precise")
            assert entries <= CAP
            assert counted() == base + PREFIXES  # every block counted once: kept or evicted
            assert max(rss[4:]) - rss[2] < 32, rss  # flat once the cap is reached (MiB)
