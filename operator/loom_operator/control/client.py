"""An asyncio client of one worker's gRPC control service (loom.control.v1.Control).

Owns the method paths, the bearer token and a deadline on every call; never decides when to call
(the fleet controller does). Errors come back as ControlError naming the worker and the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import grpc

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api.status import WorkerStatus

SERVICE = "/loom.control.v1.Control"


class ControlError(Exception):
    """A control call failed: the worker is unreachable, refused it, or ran past the deadline."""

    def __init__(self, target: str, call: str, code: str, details: str) -> None:
        super().__init__(f"{call} on {target}: {code}: {details}")
        self.target = target
        self.call = call
        self.code = code
        self.details = details


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


class ControlClient:
    """Calls one worker's control service at `target` (host:port) with `token`.

    Use as an async context manager, or call `close()`. Every call takes a deadline in seconds.
    """

    def __init__(self, target: str, token: str) -> None:
        self.target = target
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.aio.insecure_channel(target)

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request: Any, timeout: float) -> WorkerStatus:
        deserialize: Callable[[bytes], pb.WorkerStatus] = pb.WorkerStatus.FromString
        stub = self._channel.unary_unary(
            f"{SERVICE}/{method}",
            request_serializer=_serialize,
            response_deserializer=deserialize,
        )
        try:
            reply = await stub(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise ControlError(self.target, method, exc.code().name, exc.details() or "") from None
        return WorkerStatus.from_pb(reply)

    async def status(self, timeout: float = 2.0) -> WorkerStatus:
        return await self._call("Status", pb.StatusRequest(), timeout)

    async def pause(
        self, mode: Literal["wait", "abort"], wait_s: float, timeout: float | None = None
    ) -> WorkerStatus:
        """Close admission. `wait`: returns once drained or after `wait_s` (then draining);
        `abort`: aborts what is in flight. The deadline is `wait_s` plus a margin by default."""
        pb_mode = pb.PAUSE_MODE_ABORT if mode == "abort" else pb.PAUSE_MODE_WAIT
        request = pb.PauseRequest(mode=pb_mode, timeout_seconds=wait_s)
        return await self._call("Pause", request, wait_s + 10.0 if timeout is None else timeout)

    async def resume(self, timeout: float = 10.0) -> WorkerStatus:
        return await self._call("Resume", pb.ResumeRequest(), timeout)

    async def load_weights(
        self, source: str, version: str, timeout: float, kv: str = "", rebuild_from: str = ""
    ) -> WorkerStatus:
        """`kv` "" (a paused, drained worker) or, for a staged push swapped in under the running
        requests (mode keep), "keep" or "recompute". `rebuild_from`: for a push (push://), a
        peer serving its version (host:port) that a worker which has not staged it receives it
        from."""
        request = pb.LoadWeightsRequest(
            source=source, version=version, kv=kv, rebuild_from=rebuild_from
        )
        return await self._call("LoadWeights", request, timeout)

    async def receive_weights(
        self,
        update_id: str,
        store: tuple[str, int],
        rank: int,
        world_size: int,
        version: str,
        timeout_s: float,
        deadline_s: float,
    ) -> WorkerStatus:
        """Join a trainer's push and stage it; returns once staged (`deadline_s` bounds it)."""
        request = pb.ReceiveWeightsRequest(
            update_id=update_id, store_host=store[0], store_port=store[1], rank=rank,
            world_size=world_size, version=version, timeout_seconds=timeout_s,
        )  # fmt: skip
        return await self._call("ReceiveWeights", request, deadline_s)
