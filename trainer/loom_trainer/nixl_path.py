"""The NIXL data path of a push: the trainer packs each bucket into one registered buffer and
every worker READs it from there (one-sided: DRAM here, VRAM on GPUs). The transfer group
still carries the manifest, each bucket's checksum (the workers' cue to READ) and the verdicts,
so both paths refuse and fail alike.

Owns the NIXL agents of one push (one per side, dropped with the push) and the READ of a
bucket; never decides the order of a push (sender.py, and the runtime's weight_push.py, do).
NIXL is imported only when a push asks for this path.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import logging
import threading
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)

NIXL_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")
MISSING = "NIXL is not installed (pip install --no-deps nixl-cu12)"
_PROGRESS_S = 0.001  # the trainer's agent progress period while a push is open


def nixl_api() -> Any | None:
    """NIXL's Python API, or None where no NIXL package is installed."""
    for module in NIXL_MODULES:
        with contextlib.suppress(ImportError):
            return importlib.import_module(module)
    return None


def _agent(name: str) -> Any:
    api = nixl_api()
    if api is None:
        raise RuntimeError(MISSING)
    # No NIXL progress thread (it busy-polls a core): each side progresses while it waits.
    return api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))


def _descs(base: int, nbytes: int, device: int) -> list[tuple[int, int, int]]:
    return [(base, nbytes, device)]


def _mem(buf: torch.Tensor) -> tuple[str, int]:
    return ("VRAM", buf.get_device()) if buf.device.type == "cuda" else ("DRAM", 0)


class NixlSource:
    """The trainer's side: one registered buffer of the largest bucket's size, which each
    bucket is packed into in turn (the one bucket of extra memory this path costs), and a
    thread that progresses the agent until `close` (a READ completes only once its target has
    progressed: the trainer would otherwise sit in the group's collective)."""

    def __init__(self, update_id: str, nbytes: int, device: torch.device | str = "cpu") -> None:
        self.agent = _agent(f"loom-push-{update_id}-trainer")
        self.buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        self._reg = self.agent.register_memory(self.buf)
        self._lock = threading.Lock()  # the agent has no thread sync of its own
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._progress, name="loom-push-nixl", daemon=True)
        self._thread.start()

    def describe(self) -> dict[str, object]:
        """What a worker needs to READ from the buffer (in the manifest)."""
        mem, device = _mem(self.buf)
        with self._lock:
            metadata = base64.b64encode(self.agent.get_agent_metadata()).decode()
        return {"kind": "nixl", "agent": metadata, "addr": self.buf.data_ptr(),
                "mem": mem, "device": device}  # fmt: skip

    def _progress(self) -> None:
        while not self._stop.wait(_PROGRESS_S):
            try:
                with self._lock:
                    self.agent.get_new_notifs()
            except Exception:  # the workers' READs then time out: the push fails, named there
                logger.exception("NIXL progress failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):
            self.agent.deregister_memory(self._reg)


class NixlSink:
    """A worker's side: READs the trainer's buffer into `buf` (its receive buffer)."""

    def __init__(self, update_id: str, rank: int, buf: torch.Tensor, source: dict[str, Any]):
        self.name = f"loom-push-{update_id}-worker{rank}"
        self.agent = _agent(self.name)
        self.buf = buf
        self._reg = self.agent.register_memory(buf)
        name = self.agent.add_remote_agent(base64.b64decode(str(source["agent"])))
        self._remote = name.decode() if isinstance(name, bytes) else str(name)
        self._addr, self._mem = int(source["addr"]), str(source["mem"])
        self._device = int(source.get("device", 0))

    def read(self, nbytes: int, timeout_s: float) -> None:
        """The first `nbytes` of the trainer's buffer into `buf`. RuntimeError (or NIXL's own
        errors) when it fails or does not end within `timeout_s`."""
        mem, device = _mem(self.buf)
        local = self.agent.get_xfer_descs(_descs(self.buf.data_ptr(), nbytes, device), mem)
        far = self.agent.get_xfer_descs(_descs(self._addr, nbytes, self._device), self._mem)
        handle = self.agent.initialize_xfer("READ", local, far, self._remote)
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state == "PROC":  # DRAM moves inside these calls (UCX copies on this thread)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the NIXL READ did not finish within {timeout_s:g}s")
                state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                raise RuntimeError(f"the NIXL READ ended in state {state}")
        finally:
            self.agent.release_xfer_handle(handle)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.agent.remove_remote_agent(self._remote)
        with contextlib.suppress(Exception):
            self.agent.deregister_memory(self._reg)
