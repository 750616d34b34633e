"""A restarted worker rebuilding a pushed version before it serves: it loads the card's
checkpoint, then asks a peer that serves the pushed version to send it (SendWeights) and
receives it as from a trainer (transfer/peer_rebuild.py), then swaps it in.

Owns the worker's rebuild at start and the receiving step that LoadWeights also runs for a push
the worker has not staged (`rebuild_from`, the operator's pods); never picks the peer (`loom
up`'s controller passes it in the --rebuild-* flags, the operator in LoadWeights) and never
serves before the swap.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.errors import TransferError
from loom_runtime.transfer.peer_rebuild import receive_from_peer, rendezvous
from loom_runtime.transfer.weight_push import StagedPush
from loom_trainer.protocol import TensorSpec

logger = logging.getLogger(__name__)

TIMEOUT_S = 120.0
SEND_WEIGHTS = "/loom.control.v1.Control/SendWeights"


@dataclass(frozen=True)
class Rebuild:
    """Which pushed version to rebuild, and from which peer."""

    peer: str
    """The peer's gRPC control address, host:port."""
    update_id: str
    version: str
    timeout_s: float = TIMEOUT_S


class RebuildTarget(Protocol):
    """The engine's side of a rebuild (the LLM Engine satisfies it)."""

    def push_specs(self) -> dict[str, TensorSpec]: ...

    def pause(
        self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None
    ) -> bool: ...

    def load_pushed(self, staged: StagedPush) -> None: ...

    def resume(self) -> None: ...


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "rebuild a pushed version from a peer (set by `loom up` when a worker restarts after a "
        "trainer's push)"
    )
    g.add_argument("--rebuild-from", metavar="HOST:PORT", help="a peer's gRPC control address")
    g.add_argument("--rebuild-update", metavar="UPDATE_ID", help="the push to rebuild")
    g.add_argument("--rebuild-version", metavar="VERSION", help="the version that push became")


def plan_rebuild(args: argparse.Namespace) -> Rebuild | None:
    """The rebuild the flags ask for (None: none); ValueError when they are incomplete."""
    given = (args.rebuild_from, args.rebuild_update, args.rebuild_version)
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--rebuild-from, --rebuild-update and --rebuild-version go together")
    return Rebuild(args.rebuild_from, args.rebuild_update, args.rebuild_version)


def receive_rebuild(
    plan: Rebuild, expected: dict[str, TensorSpec], host: str, token: str
) -> StagedPush:
    """Stage `plan.version` from the peer (this worker hosts the group's store on `host`, the
    address the peer reaches it at). TransferError / CheckpointError say why it could not;
    nothing stays staged then."""
    rv = rendezvous(host, plan.update_id, plan.timeout_s)

    def ask_peer() -> None:
        request = pb.SendWeightsRequest(
            update_id=plan.update_id, store_host=host, store_port=rv.port,
            version=plan.version, timeout_seconds=plan.timeout_s,
        )  # fmt: skip
        with grpc.insecure_channel(plan.peer) as channel:
            send = channel.unary_unary(
                SEND_WEIGHTS,
                request_serializer=pb.SendWeightsRequest.SerializeToString,
                response_deserializer=pb.WorkerStatus.FromString,
            )
            try:
                send(request, metadata=(("authorization", f"Bearer {token}"),),
                     timeout=plan.timeout_s * 2)  # fmt: skip
            except grpc.RpcError as exc:
                raise TransferError(
                    f"the peer at {plan.peer} did not send {plan.version}: "
                    f"{exc.code().name}: {exc.details()}"
                ) from None

    staged = receive_from_peer(rv, plan.version, expected, ask_peer)
    logger.info(
        "received a pushed version from a peer",
        extra={"peer": plan.peer, "update_id": plan.update_id, "version": plan.version},
    )
    return staged


def rebuild(engine: RebuildTarget, plan: Rebuild, host: str, token: str) -> None:
    """Receive `plan.version` from the peer and swap it in (the engine started, nothing
    admitted yet). TransferError / CheckpointError say why it could not; the engine then still
    holds the card's checkpoint."""
    staged = receive_rebuild(plan, engine.push_specs(), host, token)
    try:
        engine.pause()
        engine.load_pushed(staged)
        engine.resume()
    finally:
        staged.discard()
    logger.info(
        "rebuilt a pushed version from a peer",
        extra={"peer": plan.peer, "update_id": plan.update_id, "version": plan.version},
    )
