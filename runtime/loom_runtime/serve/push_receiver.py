"""A worker's weight pushes as its control service sees them: receive one (in a thread, serving
goes on), keep it staged, swap it in on LoadWeights(source="push://<update_id>"); and send the
weights it serves to a restarted peer that rebuilds a pushed version (SendWeights).

Owns the worker's one staged push (a newer push or a swap discards it); never swaps in a push
without the checks of LoadWeights (control_service.py runs them first: drained, or for a keep
swap serving).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

import torch

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.errors import CheckpointError, InvalidRequestError
from loom_runtime.serve.errors import ControlStateError
from loom_runtime.serve.rebuild import Rebuild, receive_rebuild
from loom_runtime.transfer.peer_rebuild import send_weights
from loom_runtime.transfer.weight_push import StagedPush, receive_push
from loom_runtime.wire.push import PUSH_SCHEME
from loom_trainer.group import Rendezvous
from loom_trainer.protocol import TensorSpec

WILDCARDS = ("", "0.0.0.0", "::")
"""Addresses a worker listens on that name no host a peer could reach it at."""


class PushTarget(Protocol):
    """The engine's side of a push (the LLM Engine satisfies it)."""

    def push_specs(self) -> dict[str, TensorSpec]: ...

    def push_tensors(self) -> Mapping[str, torch.Tensor]: ...

    def load_pushed(self, staged: StagedPush) -> None: ...

    def load_pushed_keep(self, staged: StagedPush, kv: str) -> None: ...


def is_push_source(source: str) -> bool:
    return source.startswith(PUSH_SCHEME)


class PushReceiver:
    """One worker's pushes: at most one receiving and one staged at a time."""

    def __init__(self, target: PushTarget | None) -> None:
        self._target = target
        self._receiving: str | None = None
        self._staged: StagedPush | None = None

    @property
    def receiving(self) -> bool:
        return self._receiving is not None

    async def receive(self, request: pb.ReceiveWeightsRequest) -> StagedPush:
        """Join the push and stage it (CheckpointError: refused; TransferError: broken)."""
        target = self._require_target()
        if not request.update_id or not request.version:
            raise InvalidRequestError("ReceiveWeights needs an update_id and a version")
        if self._receiving is not None:
            raise ControlStateError(
                f"already receiving push {self._receiving}; one push at a time per worker"
            )
        self._receiving = request.update_id
        try:
            try:
                expected, refusal = await asyncio.to_thread(target.push_specs), ""
            except CheckpointError as exc:  # joins anyway, to tell the trainer why at once
                expected, refusal = {}, str(exc)
            self.discard()
            rv = Rendezvous(
                request.store_host, request.store_port, request.rank, request.world_size,
                request.timeout_seconds or 60.0, request.update_id,
            )  # fmt: skip
            staged = await asyncio.to_thread(
                receive_push, rv, request.version, expected, None, refusal
            )
        finally:
            self._receiving = None
        self._staged = staged
        return staged

    async def send(self, request: pb.SendWeightsRequest) -> None:
        """Send the weights this worker serves to a restarted peer (the caller holds the load
        lock: no swap runs meanwhile). TransferError when the transfer breaks."""
        target = self._require_target()
        if not request.update_id or not request.store_host or not request.store_port:
            raise InvalidRequestError("SendWeights needs an update_id and the peer's store")
        tensors = await asyncio.to_thread(target.push_tensors)
        specs = await asyncio.to_thread(target.push_specs)
        rv = Rendezvous(
            request.store_host, request.store_port, 0, 2, request.timeout_seconds or 60.0,
            request.update_id, store_rank=1,
        )  # fmt: skip
        await asyncio.to_thread(send_weights, rv, tensors, specs=specs)

    def staged(self, source: str, version: str) -> StagedPush:
        """The staged push `source` names, for `version`; ControlStateError if there is none."""
        update_id = source.removeprefix(PUSH_SCHEME)
        s = self._staged
        if s is None or s.update_id != update_id or s.version != version:
            have = f"push {s.update_id} ({s.version})" if s is not None else "nothing"
            raise ControlStateError(
                f"LoadWeights {source} as {version}: this worker has {have} staged; a push is "
                "received (ReceiveWeights) before it is swapped in"
            )
        return s

    async def obtain(
        self, source: str, version: str, rebuild_from: str, host: str, token: str
    ) -> StagedPush:
        """The push `source` names for `version`: the one this worker staged, or — when it has
        not staged it (it started after the push) and `rebuild_from` names a peer serving the
        version — received from that peer now (this worker hosting the store on `host`, the
        address it listens on).
        ControlStateError when neither; TransferError / CheckpointError when the peer's
        transfer fails."""
        s = self._staged
        update_id = source.removeprefix(PUSH_SCHEME)
        mine = s is not None and s.update_id == update_id and s.version == version
        if mine or not rebuild_from:
            return self.staged(source, version)
        target = self._require_target()
        if host in WILDCARDS:
            raise ControlStateError(
                "LoadWeights rebuild_from: this worker does not know the address its peers "
                "reach it at (its --host is a wildcard); load a staged push or a checkpoint"
            )
        plan = Rebuild(rebuild_from, update_id, version)
        return await asyncio.to_thread(receive_rebuild, plan, target.push_specs(), host, token)

    async def swap(self, staged: StagedPush) -> None:
        """Swap the staged push in (the worker is paused and drained), then drop the staging."""
        target = self._require_target()
        try:
            await asyncio.to_thread(target.load_pushed, staged)
        finally:
            if staged is not self._staged:  # received from a peer for this swap alone
                staged.discard()
        self.discard()

    async def swap_keep(self, staged: StagedPush, kv: str) -> None:
        """Swap the staged push in under the running requests (push mode keep, `kv` its KV
        policy), then drop the staging; a refused swap keeps a push this worker staged."""
        target = self._require_target()
        try:
            await asyncio.to_thread(target.load_pushed_keep, staged, kv)
        finally:
            if staged is not self._staged:
                staged.discard()
        self.discard()

    def discard(self) -> None:
        if self._staged is not None:
            self._staged.discard()
            self._staged = None

    def _require_target(self) -> PushTarget:
        if self._target is None:
            raise ControlStateError("this worker's engine cannot take pushed weights")
        return self._target
