"""The gRPC control service (loom.control.v1.Control): status, drain, weight load, resume.

Owns the shared-token check and the order of control calls; never blocks the event loop (engine
calls that wait run in worker threads) and never maps errors itself (errors.py does).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import grpc

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.engine.types import EngineStats
from loom_runtime.errors import InvalidRequestError, LoomError
from loom_runtime.serve.errors import ControlStateError, UnauthenticatedError, classify
from loom_runtime.serve.metrics import StatsSource
from loom_runtime.serve.push_receiver import PushReceiver, PushTarget, is_push_source
from loom_runtime.transfer.weight_push import StagedPush

logger = logging.getLogger(__name__)

WATCH_POLL_S = 0.05  # how often WatchStatus looks for a change
WATCH_MIN_S, WATCH_MAX_S, WATCH_DEFAULT_S = 0.05, 60.0, 1.0


class ControlledEngine(StatsSource, Protocol):
    """What the control service needs of the engine (the Engine satisfies it)."""

    def pause(
        self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None
    ) -> bool: ...

    def resume(self) -> None: ...

    def load_weights(self, path: str, version: str) -> None: ...


@dataclass(frozen=True)
class ControlSettings:
    model_name: str
    role: str
    drain_timeout_s: float  # Pause(WAIT) default and upper bound
    resolve_source: Callable[[str], Path]  # LoadWeights source -> checkpoint dir
    healthy: Callable[[], bool]  # False once the engine thread has died
    push: PushTarget | None = None  # the engine's side of a trainer's weight push, if it has one
    host: str = ""  # the address peers reach this worker at ("" or a wildcard: unknown)
    token: str = ""  # the control token (a peer sending a push checks it)


def watch_interval(requested: float) -> float:
    if requested <= 0:
        return WATCH_DEFAULT_S
    return min(max(requested, WATCH_MIN_S), WATCH_MAX_S)


R = TypeVar("R")


def _mapped(
    fn: Callable[[ControlService, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]],
) -> Callable[[ControlService, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]:
    """Turn typed errors of a unary call into its gRPC status (errors.py decides which)."""

    @functools.wraps(fn)
    async def call(self: ControlService, request: Any, context: Any) -> R:
        try:
            return await fn(self, request, context)
        except Exception as exc:
            reply = classify(exc)
            if not isinstance(exc, LoomError):
                logger.exception("control call failed", extra={"call": fn.__name__})
            else:
                logger.info("control call refused: %s", reply.message, extra={"call": fn.__name__})
            await context.abort(reply.grpc_code, reply.message)
            raise  # unreachable: abort raises

    return call


class ControlService:
    """The Control service's methods; `rpc_handler` registers them with a grpc.aio server."""

    def __init__(self, engine: ControlledEngine, settings: ControlSettings) -> None:
        self._engine = engine
        self._settings = settings
        self._load_lock = asyncio.Lock()  # one LoadWeights or Resume at a time
        self._loading = False
        self._pushes = PushReceiver(settings.push)

    async def snapshot(self) -> pb.WorkerStatus:
        stats, in_flight = await asyncio.to_thread(self._read)
        return WorkerStatus.of_engine(
            stats,
            model_name=self._settings.model_name,
            role=self._settings.role,
            in_flight=in_flight,
            loading=self._loading,
            healthy=self._settings.healthy(),
        ).to_pb()

    def _read(self) -> tuple[EngineStats, int]:
        return self._engine.stats(), self._engine.in_flight()

    @_mapped
    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.WorkerStatus:
        return await self.snapshot()

    async def WatchStatus(
        self, request: pb.WatchStatusRequest, context: Any
    ) -> AsyncIterator[pb.WorkerStatus]:
        interval = watch_interval(request.interval_seconds)
        last: pb.WorkerStatus | None = None
        sent_at = 0.0
        while True:  # ends when the client cancels (grpc cancels this generator)
            status = await self.snapshot()
            now = time.monotonic()
            if status != last or now - sent_at >= interval:
                yield status
                last, sent_at = status, now
            await asyncio.sleep(min(WATCH_POLL_S, interval))

    @_mapped
    async def Pause(self, request: pb.PauseRequest, context: Any) -> pb.WorkerStatus:
        mode: Literal["wait", "abort"] = "abort" if request.mode == pb.PAUSE_MODE_ABORT else "wait"
        limit = self._settings.drain_timeout_s
        timeout = min(request.timeout_seconds, limit) if request.timeout_seconds > 0 else limit
        drained = await asyncio.to_thread(self._engine.pause, mode, timeout)
        logger.info("paused", extra={"mode": mode, "drained": drained})
        return await self.snapshot()

    @_mapped
    async def Resume(self, request: pb.ResumeRequest, context: Any) -> pb.WorkerStatus:
        async with self._load_lock:
            await asyncio.to_thread(self._engine.resume)
        logger.info("resumed")
        return await self.snapshot()

    @_mapped
    async def LoadWeights(self, request: pb.LoadWeightsRequest, context: Any) -> pb.WorkerStatus:
        if not request.version:
            raise InvalidRequestError("LoadWeights needs a version", param="version")
        if request.kv:
            return await self._load_keep(request)
        async with self._load_lock:
            stats, in_flight = await asyncio.to_thread(self._read)
            if request.version == stats.weights_version:
                raise InvalidRequestError(
                    f"already serving weights version {request.version!r}; caches are keyed by "
                    "the version, so new weights need a new version string",
                    param="version",
                )
            if stats.admission_open or in_flight:
                raise ControlStateError(
                    f"LoadWeights needs a paused, drained worker (admission_open="
                    f"{stats.admission_open}, in_flight={in_flight}); call Pause first"
                )
            self._loading = True
            try:
                if is_push_source(request.source):
                    staged = await self._obtain(request)
                    await self._pushes.swap(staged)
                else:
                    path = self._settings.resolve_source(request.source)
                    await asyncio.to_thread(self._engine.load_weights, str(path), request.version)
            finally:
                self._loading = False
        logger.info(
            "weights loaded",
            extra={"previous": stats.weights_version, "version": request.version},
        )
        return await self.snapshot()

    async def _obtain(self, request: pb.LoadWeightsRequest) -> StagedPush:
        """The push a LoadWeights swaps in: staged here, or received from `rebuild_from`."""
        return await self._pushes.obtain(
            request.source, request.version, request.rebuild_from, self._settings.host,
            self._settings.token,
        )  # fmt: skip

    async def _load_keep(self, request: pb.LoadWeightsRequest) -> pb.WorkerStatus:
        """A keep swap: a staged push swapped in under the running requests of a serving worker."""
        if not is_push_source(request.source):
            raise InvalidRequestError(
                f"LoadWeights with kv={request.kv!r} (a keep swap) takes a staged push "
                f"(source push://<update_id>), not {request.source!r}",
                param="kv",
            )
        async with self._load_lock:
            stats = await asyncio.to_thread(self._engine.stats)
            if not self._settings.healthy() or not stats.admission_open:
                raise ControlStateError(
                    "a keep swap needs a serving worker (admission open, engine healthy); this "
                    "one is paused, draining or failed: swap it in with LoadWeights without kv "
                    "once it is paused and drained"
                )
            staged = await self._obtain(request)
            self._loading = True
            try:
                await self._pushes.swap_keep(staged, request.kv)
            finally:
                self._loading = False
        logger.info(
            "weights swapped under running requests",
            extra={"previous": stats.weights_version, "version": request.version,
                   "kv": request.kv},
        )  # fmt: skip
        return await self.snapshot()

    @_mapped
    async def ReceiveWeights(
        self, request: pb.ReceiveWeightsRequest, context: Any
    ) -> pb.WorkerStatus:
        if not self._settings.healthy():
            raise ControlStateError("this worker's engine has failed; it cannot take a push")
        staged = await self._pushes.receive(request)
        logger.info("push staged", extra={"update_id": staged.update_id, "version": staged.version})
        return await self.snapshot()

    @_mapped
    async def SendWeights(self, request: pb.SendWeightsRequest, context: Any) -> pb.WorkerStatus:
        if not request.version:
            raise InvalidRequestError("SendWeights needs a version", param="version")
        async with self._load_lock:  # no swap while the peer copies what this worker serves
            stats = await asyncio.to_thread(self._engine.stats)
            if not self._settings.healthy() or stats.weights_version != request.version:
                raise ControlStateError(
                    f"asked to send weights version {request.version!r}; this worker serves "
                    f"{stats.weights_version!r}{'' if self._settings.healthy() else ' (failed)'}"
                )
            await self._pushes.send(request)
        logger.info("weights sent to a peer", extra={"update_id": request.update_id,
                                                     "version": request.version})  # fmt: skip
        return await self.snapshot()


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call whose `authorization` metadata is not `Bearer <token>`."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the control token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or self._allowed(handler_call_details.invocation_metadata):
            return handler
        reply = classify(UnauthenticatedError("missing or wrong control token"))

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(reply.grpc_code, reply.message)

        async def deny_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await context.abort(reply.grpc_code, reply.message)
            yield  # pragma: no cover - makes this an async generator

        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                deny_stream, handler.request_deserializer, handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            deny, handler.request_deserializer, handler.response_serializer
        )


def rpc_handler(service: ControlService) -> grpc.GenericRpcHandler:
    """The method table of loom.control.v1.Control, checked against the proto's descriptor."""
    desc = pb.DESCRIPTOR.services_by_name["Control"]
    unary = grpc.unary_unary_rpc_method_handler
    methods = {
        "Status": unary(service.Status, pb.StatusRequest.FromString, _serialize),
        "WatchStatus": grpc.unary_stream_rpc_method_handler(
            service.WatchStatus, pb.WatchStatusRequest.FromString, _serialize
        ),
        "Pause": unary(service.Pause, pb.PauseRequest.FromString, _serialize),
        "Resume": unary(service.Resume, pb.ResumeRequest.FromString, _serialize),
        "LoadWeights": unary(service.LoadWeights, pb.LoadWeightsRequest.FromString, _serialize),
        "ReceiveWeights": unary(
            service.ReceiveWeights, pb.ReceiveWeightsRequest.FromString, _serialize
        ),
        "SendWeights": unary(service.SendWeights, pb.SendWeightsRequest.FromString, _serialize),
    }
    declared = {m.name for m in desc.methods}
    if declared != set(methods):
        raise RuntimeError(f"control.proto declares {sorted(declared)}; served {sorted(methods)}")
    return grpc.method_handlers_generic_handler(desc.full_name, methods)


def _serialize(status: pb.WorkerStatus) -> bytes:
    return status.SerializeToString()


async def start_control_server(
    service: ControlService, host: str, port: int, token: str
) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server; returns it and the port it bound (port 0 picks a free one)."""
    server = grpc.aio.server(interceptors=[TokenInterceptor(token)])
    server.add_generic_rpc_handlers((rpc_handler(service),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the control service on {host}:{port}")
    await server.start()
    return server, bound
