"""The KV connector: leases on the prefill side, pulls on the decode side, over one Transport.

Owns the side-channel protocol (meta handshake once per peer, pin, release), the per-peer cache,
the bounded pull threads and the layout mapping of every pull; never touches block accounting
(the engine frees what it is told) and never runs on the engine's step thread for long: every
network wait happens on its own threads.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from loom_runtime.errors import TransferError
from loom_runtime.kv.cache import KVSpec
from loom_runtime.kv.fp8 import E4M3_NAME, Fp8Format
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.transfer import side_channel
from loom_runtime.transfer.layout import (
    BlockLayout,
    CopyPlan,
    KVLayout,
    LatentLayout,
    check_compatible,
    copy_plan,
    layout_from_dict,
)
from loom_runtime.transfer.lease import LeaseTable, Released
from loom_runtime.wire.kv_transfer import KVTransferParams

logger = logging.getLogger(__name__)

Role = Literal["prefill", "decode"]
ConnectorKind = Literal["nixl", "tcp"]
Wake = Callable[[], None]


@dataclass(frozen=True)
class ConnectorSettings:
    """How one worker takes part in P/D transfers; defaults documented here."""

    kind: ConnectorKind
    role: Role
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    side_host: str = "127.0.0.1"  # the address decodes reach the prefill at (remote_host)
    side_port: int = 5600  # the prefill's side channel; 0 picks a free port (tests, benches)
    bind_host: str | None = None  # where the side channel listens; None: side_host
    lease_seconds: float = 30.0  # a prefill frees unpulled blocks after this long without a pin
    pull_timeout_s: float = 60.0  # one pull's bound (also cut to 80 % of the pinned lease)
    handshake_timeout_s: float = 10.0  # side-channel calls (meta, pin, release)
    pull_threads: int = 2  # concurrent pulls; more wait in the executor's queue


@dataclass(frozen=True)
class PullResult:
    """How one pull ended; `error` None means the KV is in the local blocks."""

    request_id: str
    error: str | None
    num_tokens: int = 0
    nbytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Peer:
    """A prefill engine this worker has handshaken with."""

    engine_id: str
    host: str
    port: int
    layout: BlockLayout
    handle: object  # the transport's own (the NIXL agent name, or nothing for TCP)


class Transport(Protocol):
    """Moves bytes; nixl.py and tcp.py implement it."""

    @property
    def kind(self) -> ConnectorKind: ...

    @property
    def needs_pin(self) -> bool:
        """A one-sided read must pin the lease over the side channel first."""
        ...

    def bind(
        self, kv: torch.Tensor, layout: BlockLayout, leases: LeaseTable, wake: Wake
    ) -> None: ...

    def meta(self) -> dict[str, Any]: ...

    def connect(self, meta: dict[str, Any], host: str, port: int) -> object: ...

    def forget(self, handle: object) -> None: ...

    def read(
        self,
        peer: Peer,
        remote_request_id: str,
        plan: CopyPlan,
        deadline: float,
        cancelled: threading.Event,
        notif: bytes,
    ) -> None: ...

    def serve(self, request: dict[str, Any], sock: socket.socket) -> bool: ...

    def close(self) -> None: ...


def layout_of(kv: torch.Tensor, fp8: Fp8Format | None = None) -> KVLayout:
    """The layout of a block-major PagedKVCache tensor; `fp8`: its last dimension is each
    head's packed uint8 row (kv/fp8.py), moved as it is."""
    if kv.dim() != 6 or kv.shape[2] != 2 or not kv.is_contiguous():
        raise TransferError(
            f"the KV pool must be a contiguous [blocks, layers, 2, block_size, kv_heads, "
            f"head_dim] tensor, got shape {tuple(kv.shape)}"
        )
    nb, layers, _, bs, heads, dim = kv.shape
    if fp8 is None:
        dtype = str(kv.dtype).removeprefix("torch.")
        return KVLayout(nb, layers, bs, heads, dim, dtype, kv.element_size(), "block_major")
    if kv.dtype != torch.uint8:
        raise TransferError(f"an fp8 KV pool holds packed uint8 rows, got {kv.dtype}")
    head_dim = fp8.elements_in_row(dim)
    return KVLayout(nb, layers, bs, heads, head_dim, E4M3_NAME, 1, "block_major", fp8.group_size)


def latent_layout_of(kv: torch.Tensor, spec: LatentKVCacheSpec) -> LatentLayout:
    """The layout of a LatentKVCache's [num_blocks, block elements] tensor of this spec."""
    fp8 = spec.fp8
    dtype = E4M3_NAME if fp8 is not None else str(spec.dtype).removeprefix("torch.")
    layout = LatentLayout(
        spec.num_blocks,
        spec.num_layers,
        spec.block_size,
        spec.latent_dim,
        spec.rope_dim,
        spec.index_layers,
        spec.index_dim,
        dtype,
        1 if fp8 is not None else spec.dtype.itemsize,
        0 if fp8 is None else fp8.group_size,
    )
    if kv.dim() != 2 or not kv.is_contiguous() or kv.nbytes != layout.total_bytes:
        raise TransferError(
            f"the latent KV pool must be a contiguous [blocks, block elements] tensor of "
            f"{layout.total_bytes} bytes, got {tuple(kv.shape)} {kv.dtype}"
        )
    return layout


@dataclass
class _Pull:
    request_id: str
    params: KVTransferParams
    block_ids: tuple[int, ...]
    start: int
    end: int
    cancelled: threading.Event = field(default_factory=threading.Event)


class KVConnector:
    """One worker's connector; satisfies the engine's KVConnectorPort.

    Prefill: `grant` leases blocks and answers the side channel (meta, pin, release, and the
    transport's reads); the engine frees what `take_released` returns. Decode: `start_pull`
    maps and reads blocks on a pull thread; the engine collects `take_pulled`.
    """

    def __init__(self, settings: ConnectorSettings, transport: Transport) -> None:
        if transport.kind != settings.kind:
            raise ValueError(f"transport {transport.kind!r} != settings.kind {settings.kind!r}")
        self.settings = settings
        self.engine_id = settings.engine_id
        self.transport = transport
        self.leases = LeaseTable(settings.lease_seconds)
        self.layout: BlockLayout | None = None
        self._wake: Wake = _nothing
        self._server: side_channel.SideChannelServer | None = None
        self._pool = ThreadPoolExecutor(settings.pull_threads, thread_name_prefix="loom-kv-pull")
        self._lock = threading.Lock()  # guards the dicts below (pull threads and the engine)
        self._peers: dict[tuple[str, int], Peer] = {}
        self._pulls: dict[str, tuple[_Pull, Future[PullResult]]] = {}
        self._pins: dict[tuple[str, str], float] = {}  # (engine, remote request) -> last pin
        self._handshake = threading.RLock()  # one handshake at a time; guards _peers

    @property
    def side_port(self) -> int | None:
        return None if self._server is None else self._server.port

    # --- lifecycle -----------------------------------------------------------------------------

    def bind(
        self,
        kv: torch.Tensor,
        wake: Wake,
        fp8: Fp8Format | None = None,
        spec: KVSpec | None = None,
    ) -> None:
        """Register the KV pool (packed fp8 rows when `fp8`; a latent pool when `spec` is a
        LatentKVCacheSpec, whose rows its tensor's shape does not show); a prefill starts
        answering its side channel."""
        if isinstance(spec, LatentKVCacheSpec):
            self.layout = latent_layout_of(kv, spec)
        else:
            self.layout = layout_of(kv, fp8)
        self._wake = wake
        self.transport.bind(kv, self.layout, self.leases, wake)
        if self.settings.role == "prefill":
            s = self.settings
            self._server = side_channel.SideChannelServer(
                s.bind_host or s.side_host, s.side_port, self._answer, io_timeout=s.pull_timeout_s
            )
            logger.info(
                "KV side channel listening",
                extra={"host": s.side_host, "port": self._server.port, "transport": s.kind},
            )

    def close(self) -> None:
        with self._lock:
            for pull, _ in self._pulls.values():
                pull.cancelled.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._server is not None:
            self._server.close()
        self.transport.close()

    # --- prefill side --------------------------------------------------------------------------

    def grant(
        self, request_id: str, block_ids: Sequence[int], num_tokens: int, weights_version: str
    ) -> KVTransferParams:
        """Lease these blocks to a remote decode; the answer goes back in the response."""
        if self._server is None:
            raise TransferError("only a prefill worker (with a side channel) can lease KV")
        self.leases.grant(request_id, block_ids, num_tokens)
        return KVTransferParams(
            do_remote_prefill=True,
            remote_engine_id=self.engine_id,
            remote_request_id=request_id,
            remote_block_ids=tuple(block_ids),
            remote_host=self.settings.side_host,
            remote_port=self._server.port,
            tp_size=1,
            remote_num_tokens=num_tokens,
            weights_version=weights_version,
            lease_seconds=self.settings.lease_seconds,
        )

    def take_released(self) -> list[Released]:
        return self.leases.take_released()

    def num_leases(self) -> int:
        return len(self.leases)

    def _answer(self, request: dict[str, Any], sock: socket.socket) -> None:
        op, rid = request.get("op"), str(request.get("request_id", ""))
        if op == "meta":
            assert self.layout is not None
            reply = {
                "engine_id": self.engine_id,
                "transport": self.transport.kind,
                "layout": self.layout.to_dict(),
                **self.transport.meta(),
            }
        elif op == "pin":
            lease = self.leases.pin(rid)
            reply = {"ok": lease is not None, "ttl": self.settings.lease_seconds}
            if lease is None:
                reply["error"] = f"no live KV lease for request {rid} (expired or pulled)"
        elif op == "release":
            if self.leases.complete(rid):
                self._wake()
            reply = {"ok": True}
        elif self.transport.serve(request, sock):
            self._wake()
            return
        else:
            reply = {"ok": False, "error": f"unknown side-channel op {op!r}"}
        side_channel.send_frame(sock, reply)

    # --- decode side ---------------------------------------------------------------------------

    def start_pull(
        self,
        request_id: str,
        params: KVTransferParams,
        block_ids: Sequence[int],
        start: int,
        end: int,
    ) -> None:
        """Read tokens start..end-1 of the remote prompt into these local blocks, off-thread."""
        pull = _Pull(request_id, params, tuple(block_ids), start, end)
        with self._lock:
            if request_id in self._pulls:
                raise TransferError(f"request {request_id!r} is already pulling")
            future = self._pool.submit(self._run_pull, pull)
            self._pulls[request_id] = (pull, future)
        future.add_done_callback(lambda _: self._wake())

    def take_pulled(self) -> list[PullResult]:
        with self._lock:
            done = [rid for rid, (_, f) in self._pulls.items() if f.done()]
            futures = [self._pulls.pop(rid)[1] for rid in done]
        return [f.result() for f in futures]

    def num_pulls(self) -> int:
        with self._lock:
            return len(self._pulls)

    def cancel_pull(self, request_id: str) -> None:
        """Stop a pull early; it still reports (with an error) once nothing writes its blocks."""
        with self._lock:
            entry = self._pulls.get(request_id)
        if entry is not None:
            entry[0].cancelled.set()

    def release_remote(self, params: KVTransferParams) -> None:
        """Tell the prefill to free a lease this worker will not read (cache hit, abort)."""
        self._pool.submit(self._call_quietly, params, "release")

    def keep_alive(self, waiting: Sequence[KVTransferParams]) -> None:
        """Pin the leases of requests still waiting for local blocks, each every ttl / 3."""
        now = time.monotonic()
        keep: dict[tuple[str, str], float] = {}
        for params in waiting:
            key = (params.remote_engine_id or "", params.remote_request_id or "")
            last = self._pins.get(key, now)
            interval = (params.lease_seconds or self.settings.lease_seconds) / 3
            if now - last >= interval:
                self._pool.submit(self._call_quietly, params, "pin")
                last = now
            keep[key] = last
        self._pins = keep

    def _run_pull(self, pull: _Pull) -> PullResult:
        t0 = time.monotonic()
        params = pull.params
        try:
            peer = self._peer(params)
            try:
                plan, deadline = self._prepare(pull, peer, t0)
                notif = f"{params.remote_request_id}:{params.tp_size}".encode()
                self.transport.read(
                    peer, str(params.remote_request_id), plan, deadline, pull.cancelled, notif
                )
            except side_channel.SideChannelError:
                self._forget(peer)  # the prefill is gone or restarted: handshake again next time
                raise
        except (OSError, TransferError) as exc:
            where = f"{params.remote_host}:{params.remote_port} ({params.remote_engine_id})"
            message = f"KV pull of request {pull.request_id} from prefill {where} failed: {exc}"
            logger.warning(message)
            return PullResult(pull.request_id, message, seconds=time.monotonic() - t0)
        except Exception as exc:  # a bug must not strand the request's blocks
            logger.exception("KV pull crashed", extra={"request_id": pull.request_id})
            return PullResult(pull.request_id, f"KV pull crashed: {exc!r}")
        return PullResult(
            pull.request_id, None, pull.end - pull.start, plan.nbytes, time.monotonic() - t0
        )

    def _prepare(self, pull: _Pull, peer: Peer, t0: float) -> tuple[CopyPlan, float]:
        assert self.layout is not None and pull.params.remote_block_ids is not None
        plan = copy_plan(
            peer.layout,
            pull.params.remote_block_ids,
            self.layout,
            pull.block_ids,
            pull.start,
            pull.end,
        )
        deadline = t0 + self.settings.pull_timeout_s
        if self.transport.needs_pin:
            reply = self._call(pull.params, "pin")
            if not reply.get("ok"):
                raise TransferError(str(reply.get("error", "the prefill refused the pin")))
            deadline = min(deadline, t0 + 0.8 * float(reply.get("ttl", 0)))
        if pull.cancelled.is_set():
            raise TransferError("cancelled before the read started")
        return plan, deadline

    def _peer(self, params: KVTransferParams) -> Peer:
        host, port = str(params.remote_host), int(params.remote_port or 0)
        with self._handshake:
            peer = self._peers.get((host, port))
            if peer is not None and peer.engine_id == params.remote_engine_id:
                return peer
            if peer is not None:
                self._forget(peer)  # the address now answers for another engine
            meta = side_channel.call(host, port, {"op": "meta"}, self.settings.handshake_timeout_s)
            peer = self._handshake_with(meta, host, port, params)
            self._peers[(host, port)] = peer
            logger.info(
                "handshake with prefill engine",
                extra={"engine_id": peer.engine_id, "host": host, "port": port},
            )
            return peer

    def _handshake_with(
        self, meta: dict[str, Any], host: str, port: int, params: KVTransferParams
    ) -> Peer:
        assert self.layout is not None
        kind = meta.get("transport")
        if kind != self.transport.kind:
            raise TransferError(
                f"prefill {host}:{port} serves KV over {kind!r} but this worker uses "
                f"{self.transport.kind!r}; give both roles the same --kv-connector"
            )
        engine_id = str(meta.get("engine_id"))
        if engine_id != params.remote_engine_id:
            raise TransferError(
                f"prefill engine {params.remote_engine_id} is gone: {host}:{port} now serves "
                f"engine {engine_id} (restarted?); its KV lease cannot be pulled"
            )
        layout = layout_from_dict(meta.get("layout") or {})
        check_compatible(layout, self.layout)
        return Peer(engine_id, host, port, layout, self.transport.connect(meta, host, port))

    def _forget(self, peer: Peer) -> None:
        with self._handshake:
            if self._peers.get((peer.host, peer.port)) is peer:
                del self._peers[(peer.host, peer.port)]
                self.transport.forget(peer.handle)

    def _call(self, params: KVTransferParams, op: str) -> dict[str, Any]:
        return side_channel.call(
            str(params.remote_host),
            int(params.remote_port or 0),
            {"op": op, "request_id": params.remote_request_id},
            self.settings.handshake_timeout_s,
        )

    def _call_quietly(self, params: KVTransferParams, op: str) -> None:
        try:
            self._call(params, op)
        except TransferError as exc:
            logger.warning("side-channel %s failed: %s", op, exc)


def _nothing() -> None:
    return None


def build_connector(settings: ConnectorSettings) -> KVConnector:
    """The connector `settings.kind` names; TransferError when NIXL is asked for but missing."""
    transport: Transport
    if settings.kind == "nixl":
        from loom_runtime.transfer.nixl import NixlTransport

        transport = NixlTransport(settings.engine_id, settings.role)
    elif settings.kind == "tcp":
        from loom_runtime.transfer.tcp import TcpTransport

        transport = TcpTransport(settings.handshake_timeout_s)
    else:
        raise ValueError(f"unknown KV connector {settings.kind!r}; use 'nixl' or 'tcp'")
    return KVConnector(settings, transport)
