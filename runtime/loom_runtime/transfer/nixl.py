"""The NIXL transport: one-sided READs of leased KV blocks (DRAM here, VRAM on GPUs).

Owns the NIXL agent (one per worker, every call under one lock), the registered KV pool, remote
agents from handshakes, and a prefill's progress thread that turns READ notifications into
completed leases; never decides which blocks move (the connector's copy plan does).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Literal

import numpy as np
import torch

from loom_runtime.errors import TransferError
from loom_runtime.transfer.layout import BlockLayout, CopyPlan
from loom_runtime.transfer.lease import LeaseTable
from loom_trainer.nixl_path import nixl_api

logger = logging.getLogger(__name__)

_BUSY_POLL_S = 0.001  # prefill progress period while leases exist (connection setup, notifs)
_IDLE_POLL_S = 0.02  # ... and with none
_CANCEL_GRACE_S = 30.0  # after a failed cancel, how long to wait for the READ to stop


class NixlUnavailableError(TransferError):
    """NIXL is not installed in this environment."""


def _nixl_api() -> Any:
    api = nixl_api()
    if api is not None:
        return api
    raise NixlUnavailableError(
        "--kv-connector nixl needs the NIXL Python package (pip install --no-deps "
        "nixl-cu12); on machines without it use --kv-connector tcp"
    )


class NixlTransport:
    """KV over NIXL (UCX backend). The engine's pull threads and the progress thread share the
    agent, so every agent call holds `_lock` (the agent runs without its own thread sync)."""

    kind: Literal["nixl"] = "nixl"
    needs_pin = True  # a READ is one-sided: pin the lease over the side channel first

    def __init__(self, engine_id: str, role: Literal["prefill", "decode"]) -> None:
        api = _nixl_api()
        # No NIXL progress thread: it busy-polls a core. Decodes progress while polling their
        # READs; a prefill runs the light progress loop below.
        config = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        self._agent = api.nixl_agent(engine_id, config)
        self._role = role
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._progress: threading.Thread | None = None
        self._kv: torch.Tensor | None = None
        self._base = 0
        self._mem = "DRAM"
        self._device = 0
        self._reg: Any = None

    def bind(self, kv: torch.Tensor, layout: BlockLayout, leases: LeaseTable, wake: Any) -> None:
        self._kv = kv
        self._base = kv.data_ptr()
        self._mem = "VRAM" if kv.device.type == "cuda" else "DRAM"
        self._device = max(kv.get_device(), 0)
        with self._lock:
            self._reg = self._agent.register_memory(kv)
        if self._role == "prefill":
            self._progress = threading.Thread(
                target=self._progress_loop,
                args=(leases, wake),
                name="loom-nixl-progress",
                daemon=True,
            )
            self._progress.start()

    def meta(self) -> dict[str, Any]:
        with self._lock:
            metadata = self._agent.get_agent_metadata()
        return {
            "agent_metadata": metadata,
            "base_addr": self._base,
            "mem_type": self._mem,
            "device_id": self._device,
        }

    def connect(self, meta: dict[str, Any], host: str, port: int) -> object:
        if meta.get("mem_type") not in ("DRAM", "VRAM") or "agent_metadata" not in meta:
            raise TransferError(f"prefill {host}:{port} sent no NIXL agent metadata")
        with self._lock:
            name = self._agent.add_remote_agent(bytes(meta["agent_metadata"]))
        agent = name.decode() if isinstance(name, bytes) else str(name)
        return _Remote(
            agent, int(meta["base_addr"]), str(meta["mem_type"]), int(meta.get("device_id", 0))
        )

    def forget(self, handle: object) -> None:
        if isinstance(handle, _Remote):
            with self._lock, contextlib.suppress(Exception):
                self._agent.remove_remote_agent(handle.agent)

    def close(self) -> None:
        self._stop.set()
        if self._progress is not None:
            self._progress.join(timeout=5)
        with self._lock:
            if self._reg is not None:
                with contextlib.suppress(Exception):
                    self._agent.deregister_memory(self._reg)
                self._reg = None

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
        """One READ covering every segment of the plan, then the notification that releases the
        lease. The notification is sent after the READ completes rather than attached to it: an
        attached one holds the READ's completion until the prefill's next progress call."""
        remote: _Remote = peer.handle
        if plan.num_segments == 0:
            with self._lock:
                self._agent.send_notif(remote.agent, notif)
            return
        local = _descs(self._base, plan.dst, plan.lengths, self._device)
        far = _descs(remote.base, plan.src, plan.lengths, remote.device)
        try:
            with self._lock:
                handle = self._agent.initialize_xfer(
                    "READ",
                    self._agent.get_xfer_descs(local, self._mem),
                    self._agent.get_xfer_descs(far, remote.mem_type),
                    remote.agent,
                )
                state = self._agent.transfer(handle)
        except Exception as exc:  # nixl raises its own exception types (remote disconnect, ...)
            raise TransferError(f"NIXL could not post the READ: {exc}") from None
        try:
            state = self._wait(handle, state, deadline, cancelled)
        finally:
            self._release(handle)
        if state != "DONE":
            raise TransferError(f"NIXL READ ended in state {state}")
        try:
            with self._lock:
                self._agent.send_notif(remote.agent, notif)
        except Exception as exc:  # the KV is here; the prefill's lease will expire instead
            logger.warning("NIXL notification failed (the lease will expire): %s", exc)

    def _wait(self, handle: Any, state: str, deadline: float, cancelled: threading.Event) -> str:
        """Poll the READ to an end. Without a NIXL progress thread, host-memory bytes move only
        inside these calls (UCX's cma copies on the caller's thread), so DRAM polls back to back
        (yielding the GIL); device memory is copied by DMA engines, so VRAM polls with backoff."""
        pause = 0.0 if self._mem == "DRAM" else 0.00005
        while state == "PROC":
            if cancelled.is_set():
                return "CANCELLED"
            if time.monotonic() > deadline:
                return "TIMEOUT"
            time.sleep(pause)
            if pause:
                pause = min(pause * 2, 0.0002)
            try:
                with self._lock:
                    state = self._agent.check_xfer_state(handle)
            except Exception as exc:
                raise TransferError(f"NIXL READ failed: {exc}") from None
        return state

    def _release(self, handle: Any) -> None:
        """Free the handle, cancelling a READ still in flight; never return while NIXL may still
        write the local blocks (bounded by a grace period, then logged)."""
        until = time.monotonic() + _CANCEL_GRACE_S
        while True:
            try:
                with self._lock:
                    self._agent.release_xfer_handle(handle)
                return
            except Exception as exc:
                if time.monotonic() > until:
                    logger.error("NIXL READ could not be cancelled: %s", exc)
                    return
                time.sleep(0.01)

    # --- prefill side --------------------------------------------------------------------------

    def serve(self, request: dict[str, Any], sock: Any) -> bool:
        return False  # READs never touch the side channel

    def _progress_loop(self, leases: LeaseTable, wake: Any) -> None:
        """Progress the agent (READs need the target) and complete leases on notifications."""
        while not self._stop.is_set():
            try:
                with self._lock:
                    notifs = self._agent.get_new_notifs()
            except Exception:
                logger.exception("NIXL progress failed")
                notifs = {}
            done = False
            for messages in notifs.values():
                for msg in messages:
                    rid = bytes(msg).decode("utf-8", "replace").rsplit(":", 1)[0]
                    if leases.complete(rid):
                        done = True
                    else:
                        logger.warning("NIXL notification for unknown lease %s (expired?)", rid)
            if done:
                wake()
            self._stop.wait(_BUSY_POLL_S if len(leases) else _IDLE_POLL_S)


class _Remote:
    __slots__ = ("agent", "base", "device", "mem_type")

    def __init__(self, agent: str, base: int, mem_type: str, device: int) -> None:
        self.agent = agent
        self.base = base
        self.mem_type = mem_type
        self.device = device


def _descs(base: int, offsets: np.ndarray, lengths: np.ndarray, device: int) -> np.ndarray:
    """Nx3 (address, length, device) descriptors."""
    out = np.empty((offsets.shape[0], 3), dtype=np.uint64)
    out[:, 0] = base + offsets
    out[:, 1] = lengths
    out[:, 2] = device
    return out
