"""The plain-TCP transport: a decode reads leased KV bytes over the prefill's side channel.

Owns the "read" side-channel op (bounds-checked against the lease) and vectored socket I/O
straight between the two KV pools; never used for GPU memory (NIXL moves VRAM).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any, Literal

import numpy as np
import torch

from loom_runtime.errors import TransferError
from loom_runtime.transfer import side_channel
from loom_runtime.transfer.layout import BlockLayout, CopyPlan
from loom_runtime.transfer.lease import Lease, LeaseTable

logger = logging.getLogger(__name__)

_POLL_S = 0.5  # socket timeout between cancel/deadline checks while receiving


class TcpTransport:
    """KV over one TCP connection per pull, zero-copy on both ends (sendmsg / recvmsg_into)."""

    kind: Literal["tcp"] = "tcp"
    needs_pin = False  # the read itself pins the lease on the prefill

    def __init__(self, connect_timeout_s: float = 10.0) -> None:
        self._connect_timeout = connect_timeout_s
        self._kv: torch.Tensor | None = None
        self._bytes: memoryview | None = None
        self._layout: BlockLayout | None = None
        self._leases: LeaseTable | None = None

    def bind(self, kv: torch.Tensor, layout: BlockLayout, leases: LeaseTable, wake: object) -> None:
        if kv.device.type != "cpu":
            raise TransferError(
                f"the tcp KV connector moves host memory, but the KV pool is on {kv.device}; "
                "use --kv-connector nixl for device memory"
            )
        self._kv = kv  # keeps the memory the view points at alive
        self._bytes = memoryview(kv.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        self._layout = layout
        self._leases = leases

    def meta(self) -> dict[str, Any]:
        return {}

    def connect(self, meta: dict[str, Any], host: str, port: int) -> object:
        return None

    def forget(self, handle: object) -> None:
        return None

    def close(self) -> None:
        self._bytes = None
        self._kv = None

    # --- decode side ---------------------------------------------------------------------------

    def read(
        self,
        peer: Any,
        remote_request_id: str,
        plan: CopyPlan,
        deadline: float,
        cancelled: threading.Event,
        notif: bytes,
    ) -> None:
        assert self._bytes is not None
        if plan.num_segments == 0:
            return
        sock = side_channel.connect(peer.host, peer.port, self._connect_timeout)

        def give_up_if_needed() -> None:
            if cancelled.is_set():
                raise TransferError("cancelled")
            if time.monotonic() > deadline:
                raise TransferError("timed out reading KV")

        try:
            sock.settimeout(max(0.01, min(self._connect_timeout, deadline - time.monotonic())))
            side_channel.send_frame(
                sock,
                {
                    "op": "read",
                    "request_id": remote_request_id,
                    "src": plan.src.tobytes(),
                    "len": plan.lengths.tobytes(),
                },
            )
            header = side_channel.recv_frame(sock)
            if not header.get("ok"):
                raise TransferError(str(header.get("error", "the prefill refused the read")))
            if int(header.get("nbytes", -1)) != plan.nbytes:
                raise TransferError(
                    f"prefill offers {header.get('nbytes')} bytes, {plan.nbytes} asked"
                )
            sock.settimeout(_POLL_S)
            side_channel.recv_segments(sock, self._bytes, plan.dst, plan.lengths, give_up_if_needed)
        except OSError as exc:
            raise TransferError(f"KV read from {peer.host}:{peer.port} failed: {exc}") from None
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    # --- prefill side --------------------------------------------------------------------------

    def serve(self, request: dict[str, Any], sock: socket.socket) -> bool:
        if request.get("op") != "read":
            return False
        assert self._leases is not None and self._bytes is not None
        rid = str(request.get("request_id", ""))
        lease = self._leases.begin_read(rid)
        if lease is None:
            error = f"no live KV lease for request {rid} (expired or already pulled)"
            side_channel.send_frame(sock, {"ok": False, "error": error})
            return True
        pulled = False
        try:
            src = np.frombuffer(request.get("src", b""), dtype=np.int64)
            lengths = np.frombuffer(request.get("len", b""), dtype=np.int64)
            refusal = self._outside_lease(lease, src, lengths)
            if refusal:
                side_channel.send_frame(sock, {"ok": False, "error": refusal})
                return True
            side_channel.send_frame(sock, {"ok": True, "nbytes": int(lengths.sum())})
            side_channel.send_segments(sock, self._bytes, src, lengths)
            pulled = True
        except (OSError, ValueError) as exc:
            logger.warning("KV read of request %s failed: %s", rid, exc)
        finally:
            self._leases.end_read(rid, pulled)
        return True

    def _outside_lease(self, lease: Lease, src: np.ndarray, lengths: np.ndarray) -> str | None:
        """Why these segments may not be read (None: every byte lies in the lease's blocks)."""
        assert self._layout is not None
        if src.shape != lengths.shape or (lengths <= 0).any() or (src < 0).any():
            return "malformed read: offsets and lengths must pair up and be positive"
        per_block = self._layout.block_bytes
        first, last = src // per_block, (src + lengths - 1) // per_block
        if last.size and int(last.max()) >= self._layout.num_blocks:
            return "read beyond the KV pool"
        held = np.zeros(self._layout.num_blocks + 1, dtype=np.int64)
        held[np.asarray(lease.block_ids, dtype=np.int64) + 1] = 1
        covered = np.cumsum(held)
        if ((covered[last + 1] - covered[first]) != last - first + 1).any():
            return f"read outside the blocks leased to request {lease.request_id}"
        return None
