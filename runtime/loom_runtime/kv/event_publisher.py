"""Publishes KV events over ZMQ exactly as vLLM's ZmqEventPublisher does, on its own thread.

Owns the PUB and replay ROUTER sockets, sequence numbers and the replay history; never blocks
the engine (which only appends to the EventBuffer) and never decides what a block's state is.

Wire: PUB multipart [topic, seq (u64 big-endian, from 0, +1 per batch), msgpack(batch)].
Replay: a DEALER/REQ client sends [b"", start_seq (8 bytes big-endian)] to the ROUTER and gets
one [b"", seq, payload] per buffered batch with seq >= start_seq, then the end marker
[b"", (-1 as signed 8 bytes), b""]. A REQ client reads only the first reply; use DEALER.
Both sockets bind (use "tcp://127.0.0.1:*" for a free port; see `pub_address`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq

from loom_runtime.kv.errors import KVConfigError
from loom_runtime.wire.kv_event_codec import (
    EventLayout,
    HashFormat,
    check_wire_options,
    encode_batch,
)
from loom_runtime.wire.kv_events import EventBuffer, KVEvent

logger = logging.getLogger(__name__)

_CLOSE_LINGER_MS = 200

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""vLLM's end-of-replay marker, sent in place of a sequence number with an empty payload."""


class KVEventPublisher:
    """A KVEventSink that batches what was emitted since the last send and publishes it.

    Every `interval_s` the thread takes all pending events of `source` (one buffer feeds one
    publisher) and, if there are any, sends them as one batch. `layout` "map" is current vLLM,
    "array" is vLLM before PR #42892; `hash_format` "int" is vLLM's default, "bytes" the full
    digest (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). `buffer_steps` batches are kept for replay.
    Unlike vLLM, the PUB socket always binds, and `dp_rank` does not offset the port.
    """

    def __init__(
        self,
        pub_endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "kv-events",
        buffer_steps: int = 10_000,
        dp_rank: int = 0,
        *,
        source: EventBuffer | None = None,
        layout: EventLayout = "map",
        hash_format: HashFormat = "int",
        interval_s: float = 0.01,
        hwm: int = 100_000,
    ) -> None:
        check_wire_options(layout, hash_format)
        if buffer_steps <= 0 or interval_s <= 0:
            raise KVConfigError("buffer_steps and interval_s must be positive")
        self.source = source if source is not None else EventBuffer()
        self._topic = topic.encode("utf-8")
        self._dp_rank = dp_rank
        self._layout: EventLayout = layout
        self._hash_format: HashFormat = hash_format
        self._interval_ms = max(1, int(interval_s * 1000))
        self._history: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._published_mark = 0  # source.emitted value covered by sent batches
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.set_hwm(hwm)
            self._pub.bind(pub_endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            self._ctx.term()
            raise KVConfigError(f"cannot bind KV event sockets ({pub_endpoint}): {exc}") from exc
        self.pub_address: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_address: str | None = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else None
        )
        # The sockets are handed to the thread here and used by no other thread from now on.
        self._thread = threading.Thread(target=self._run, name="loom-kv-events", daemon=True)
        self._thread.start()

    def emit(self, event: KVEvent) -> None:
        self.source.emit(event)

    @property
    def next_seq(self) -> int:
        """Sequence number the next batch will carry."""
        with self._cond:
            return self._next_seq

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything emitted before this call is published; False on timeout."""
        target = self.source.emitted
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._published_mark < target and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._published_mark >= target

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is pending, stop the thread and close the sockets. Idempotent."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("kv event publisher thread did not stop", extra={"timeout": timeout})
            return
        if not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- publisher thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            poller = zmq.Poller()
            if self._replay is not None:
                poller.register(self._replay, zmq.POLLIN)
            while not self._stop.is_set():
                if self._replay is not None:
                    if poller.poll(self._interval_ms):
                        self._serve_replays()
                else:
                    self._stop.wait(self._interval_ms / 1000)
                self._publish_pending()
            self._publish_pending()
        except Exception:
            logger.exception("kv event publisher thread failed")
        finally:
            self._close_sockets(linger_ms=_CLOSE_LINGER_MS)
            with self._cond:
                self._cond.notify_all()

    def _publish_pending(self) -> None:
        mark = self.source.emitted  # read first: everything up to it is in this take
        events = self.source.take()
        if events:
            payload = encode_batch(
                time.time(), events, self._dp_rank, self._layout, self._hash_format
            )
            seq = self._next_seq
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._history.append((seq, payload))
        with self._cond:
            if events:
                self._next_seq += 1
            self._published_mark = max(self._published_mark, mark)
            self._cond.notify_all()

    def _serve_replays(self) -> None:
        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) == 3 and frames[1] == b"":
                envelope = [frames[0], b""]
            elif len(frames) == 2:
                envelope = [frames[0]]
            else:
                logger.warning("invalid kv event replay request", extra={"frames": len(frames)})
                continue
            start = int.from_bytes(frames[-1], "big")
            for seq, payload in list(self._history):
                if seq >= start:
                    self._replay.send_multipart([*envelope, seq.to_bytes(8, "big"), payload])
            self._replay.send_multipart([*envelope, END_SEQ, b""])

    def _close_sockets(self, linger_ms: int = 0) -> None:
        self._pub.close(linger=linger_ms)  # a short linger lets the last batch go out
        if self._replay is not None:
            self._replay.close(linger=0)
