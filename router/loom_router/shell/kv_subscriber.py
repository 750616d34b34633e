"""Feeds the precise prefix index from every endpoint's KV-event stream (ZMQ SUB, vLLM's format),
asking the endpoint's replay socket (DEALER) for batches a sequence gap says were missed.

Owns the sockets, on one thread of their own (ZMQ sockets are not thread-safe, and decoding
never runs on the event loop); never decides what a block means (the PrefixIndex does). ZMQ
reconnects a SUB by itself; a restarted publisher starts its sequence again, which the index
sees as a restart and answers by dropping that endpoint's blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import zmq

from loom_router.core.endpoints import EndpointSnapshot
from loom_router.core.kv_events import decode_message, decode_replay, replay_request
from loom_router.core.prefix_index import PrefixIndex
from loom_router.errors import KVEventDecodeError
from loom_router.shell.metrics import RouterMetrics

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_REPLAY_ROUNDS = 3
"""Replays asked for one gap before giving up (the publisher's history may not reach back)."""


@dataclass(frozen=True)
class Feed:
    endpoint_id: str
    pub: str
    replay: str | None


@dataclass
class _Conn:
    feed: Feed
    sub: zmq.Socket[bytes]
    dealer: zmq.Socket[bytes] | None = None
    asked: tuple[int, int] | None = None
    started: float = 0.0
    rounds: int = 0


class KVSubscriber:
    """One SUB per endpoint that has `kv_events`; `sync(snapshot)` from any thread."""

    def __init__(
        self,
        index: PrefixIndex,
        metrics: RouterMetrics,
        replay_timeout_s: float = 2.0,
        poll_ms: int = 50,
        max_batches_per_wake: int = 512,
    ) -> None:
        self._index = index
        self._metrics = metrics
        self.replay_timeout_s = replay_timeout_s
        self._poll_ms = poll_ms
        self._max_batches = max_batches_per_wake
        self._lock = threading.Lock()
        self._desired: dict[str, Feed] = {}
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loom-kv-subscriber", daemon=True)
        self._conns: dict[str, _Conn] = {}

    def sync(self, snapshot: EndpointSnapshot) -> None:
        """Follow the endpoints' KV-event addresses (call from the endpoint listener)."""
        feeds = {
            e.id: Feed(e.id, e.kv_events, e.kv_replay)
            for e in snapshot.endpoints
            if e.kv_events is not None
        }
        with self._lock:
            self._desired = feeds
        self._changed.set()

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def connected(self) -> frozenset[str]:
        """Endpoints whose feed the thread has a socket for."""
        with self._lock:
            return frozenset(self._conns)

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        ctx = zmq.Context()
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                if self._changed.is_set():
                    self._changed.clear()
                    self._reconcile(ctx, poller)
                if not self._conns:  # zmq_poll over no socket returns at once: wait here
                    self._changed.wait(self._poll_ms / 1000)
                    continue
                ready = dict(poller.poll(self._poll_ms))
                for conn in list(self._conns.values()):
                    if conn.sub in ready:
                        self._drain_sub(conn, poller, ctx)
                    if conn.dealer is not None and conn.dealer in ready:
                        self._drain_dealer(conn, poller, ctx)
                    self._expire(conn, poller)
        except Exception:
            logger.exception("KV-event subscriber stopped")
        finally:
            for conn in self._conns.values():
                self._close(conn, poller)
            ctx.term()

    def _reconcile(self, ctx: zmq.Context[zmq.Socket[bytes]], poller: zmq.Poller) -> None:
        with self._lock:
            desired = dict(self._desired)
        for eid, conn in list(self._conns.items()):
            if desired.get(eid) != conn.feed:
                self._close(conn, poller)
                with self._lock:
                    del self._conns[eid]
                if eid in desired:  # a new address is a new process: its cache starts empty
                    self._index.remove_endpoint(eid)
        for eid, feed in desired.items():
            if eid in self._conns:
                continue
            sub = ctx.socket(zmq.SUB)
            for opt, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 100_000), (zmq.RECONNECT_IVL, 100),
                               (zmq.RECONNECT_IVL_MAX, 2000), (zmq.HEARTBEAT_IVL, 1000),
                               (zmq.HEARTBEAT_TIMEOUT, 3000)):  # fmt: skip
                sub.setsockopt(opt, value)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                sub.connect(feed.pub)
            except zmq.ZMQError as exc:
                logger.warning("bad KV-event address", extra={"endpoint": eid, "why": str(exc)})
                sub.close(0)
                continue
            poller.register(sub, zmq.POLLIN)
            with self._lock:
                self._conns[eid] = _Conn(feed, sub)

    def _drain_sub(
        self, conn: _Conn, poller: zmq.Poller, ctx: zmq.Context[zmq.Socket[bytes]]
    ) -> None:
        eid = conn.feed.endpoint_id
        for message in self._received(conn.sub, decode_message, eid, "a KV-event batch"):
            check = self._index.apply_message(eid, message)
            self._metrics.inc("kv_batches", eid, "live")
            if check.status in ("gap", "restart"):
                self._metrics.inc("kv_gaps", eid)
            if check.replay_from is not None:
                self._ask_replay(conn, poller, ctx)

    def _ask_replay(
        self, conn: _Conn, poller: zmq.Poller, ctx: zmq.Context[zmq.Socket[bytes]]
    ) -> None:
        eid = conn.feed.endpoint_id
        window = self._index.pending_replay(eid)
        if window is None or conn.dealer is not None:
            return  # nothing missing, or a replay is on its way (its end re-checks)
        if conn.feed.replay is None:
            self._index.end_replay(eid)
            self._metrics.inc("kv_replays", eid, "no_replay_socket")
            return
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(conn.feed.replay)
        dealer.send_multipart(replay_request(window[0]))
        poller.register(dealer, zmq.POLLIN)
        conn.dealer, conn.asked, conn.started = dealer, window, time.monotonic()
        conn.rounds += 1

    def _drain_dealer(
        self, conn: _Conn, poller: zmq.Poller, ctx: zmq.Context[zmq.Socket[bytes]]
    ) -> None:
        eid = conn.feed.endpoint_id
        assert conn.dealer is not None
        for message in self._received(conn.dealer, decode_replay, eid, "a replayed batch"):
            if message is not None:
                if self._index.apply_replay(eid, message):
                    self._metrics.inc("kv_batches", eid, "replay")
                continue
            self._close_dealer(conn, poller)  # the end marker
            window = self._index.pending_replay(eid)
            if window is not None and window != conn.asked and conn.rounds < MAX_REPLAY_ROUNDS:
                self._ask_replay(conn, poller, ctx)  # a newer gap arrived meanwhile
                return
            self._index.end_replay(eid)
            self._metrics.inc("kv_replays", eid, "ok" if window is None else "partial")
            conn.rounds = 0
            return

    def _received(
        self,
        sock: zmq.Socket[bytes],
        decode: Callable[[list[bytes]], T],
        eid: str,
        what: str,
    ) -> Iterator[T]:
        """What is waiting on `sock`, decoded (at most max_batches per call); a message that
        does not decode is counted, logged and skipped."""
        for _ in range(self._max_batches):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                yield decode(frames)
            except KVEventDecodeError as exc:
                self._metrics.inc("kv_decode_errors", eid)
                logger.warning(f"dropped {what}", extra={"endpoint": eid, "why": str(exc)})

    def _expire(self, conn: _Conn, poller: zmq.Poller) -> None:
        if conn.dealer is None or time.monotonic() - conn.started < self.replay_timeout_s:
            return
        self._close_dealer(conn, poller)
        self._index.end_replay(conn.feed.endpoint_id)
        self._metrics.inc("kv_replays", conn.feed.endpoint_id, "timeout")
        conn.rounds = 0

    def _close_dealer(self, conn: _Conn, poller: zmq.Poller) -> None:
        if conn.dealer is not None:
            poller.unregister(conn.dealer)
            conn.dealer.close(0)
            conn.dealer = None

    def _close(self, conn: _Conn, poller: zmq.Poller) -> None:
        self._close_dealer(conn, poller)
        poller.unregister(conn.sub)
        conn.sub.close(0)
