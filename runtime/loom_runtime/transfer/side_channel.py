"""The P/D side channel: length-prefixed msgpack frames over TCP, and raw KV byte segments.

Owns framing, the prefill's bounded threaded listener and the decode's one-shot calls; never
interprets a request (the connector's handler does) and never blocks without a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

import msgpack
import numpy as np

from loom_runtime.errors import TransferError

logger = logging.getLogger(__name__)

MAX_FRAME = 64 * 1024 * 1024  # bytes of one msgpack frame (a 32k-token plan is ~3 MiB)
_HEADER = struct.Struct(">I")
_IOV_BATCH = 512  # buffers per sendmsg/recvmsg_into call (IOV_MAX is 1024 on Linux)

Handler = Callable[[dict[str, Any], socket.socket], None]


class SideChannelError(TransferError):
    """The peer's side channel could not be reached or answered nonsense."""


def send_frame(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise SideChannelError(f"side-channel frame of {size} bytes exceeds {MAX_FRAME}")
    obj = msgpack.unpackb(_recv_exact(sock, size), raw=False)
    if not isinstance(obj, dict):
        raise SideChannelError("side-channel frame is not a map")
    return obj


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("side channel closed by the peer")
        got += k
    return bytes(buf)


def send_segments(
    sock: socket.socket, src: memoryview, offsets: np.ndarray, lengths: np.ndarray
) -> None:
    """Send src[o:o+n] for every segment, in order, without copying (vectored writes)."""
    views: deque[memoryview] = deque(
        src[o : o + n] for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)
    )
    while views:
        sent = sock.sendmsg(list(islice(views, _IOV_BATCH)))
        _consume(views, sent)


def recv_segments(
    sock: socket.socket,
    dst: memoryview,
    offsets: np.ndarray,
    lengths: np.ndarray,
    on_timeout: Callable[[], None],
) -> None:
    """Receive straight into dst[o:o+n] for every segment, in order (vectored reads).

    Each socket timeout calls `on_timeout`, which raises to give up (deadline, cancel) or
    returns to keep waiting.
    """
    views: deque[memoryview] = deque(
        dst[o : o + n] for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)
    )
    while views:
        try:
            got = sock.recvmsg_into(list(islice(views, _IOV_BATCH)))[0]
        except TimeoutError:
            on_timeout()
            continue
        if got == 0:
            raise ConnectionError("side channel closed by the peer mid-transfer")
        _consume(views, got)


def _consume(views: deque[memoryview], n: int) -> None:
    while n:
        head = views[0]
        if n >= len(head):
            n -= len(head)
            views.popleft()
        else:
            views[0] = head[n:]
            n = 0
    while views and not len(views[0]):
        views.popleft()


def call(host: str, port: int, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request, one answer, on a fresh connection."""
    with connect(host, port, timeout) as sock:
        try:
            send_frame(sock, request)
            return recv_frame(sock)
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            raise SideChannelError(
                f"side channel {host}:{port} failed during {request.get('op')!r}: {exc}"
            ) from None


def connect(host: str, port: int, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise SideChannelError(f"cannot reach the KV side channel {host}:{port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SideChannelServer:
    """A prefill worker's listener: one daemon thread per connection, at most `max_connections`
    at once (more are closed at once), every socket with `io_timeout` s."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        max_connections: int = 32,
        io_timeout: float = 30.0,
    ) -> None:
        self._handler = handler
        self._io_timeout = io_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"loom-kv-side-{self.port}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if not self._stop.is_set():
                    logger.exception("side channel accept failed")
                return
            if not self._slots.acquire(blocking=False):
                logger.warning("side channel busy; connection refused", extra={"port": self.port})
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self._io_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._stop.is_set():
                try:
                    request = recv_frame(conn)
                except (ConnectionError, TimeoutError, OSError, SideChannelError):
                    return
                self._handler(request, conn)
        except Exception:
            logger.exception("side channel handler failed")
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._slots.release()
