"""What the engine needs of a KV connector and of its transfer parameters, as Protocols.

Declares the port only (loom_runtime.transfer implements it; the server wires the two); never
imports a transport, and holds no state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from loom_runtime.kv.cache import KVSpec
from loom_runtime.kv.fp8 import Fp8Format

Role = Literal["prefill", "decode"]
OnTransferFailure = Literal["recompute", "fail"]


@dataclass(frozen=True)
class DisaggSettings:
    """This worker's P/D role and what a decode does when a pull fails (the DeploymentCard's
    failover.onTransferFailure)."""

    role: Role
    on_transfer_failure: OnTransferFailure = "recompute"


class TransferParams(Protocol):
    """A request's kv_transfer_params (loom_runtime.transfer.params.KVTransferParams)."""

    @property
    def do_remote_decode(self) -> bool: ...

    @property
    def do_remote_prefill(self) -> bool: ...

    @property
    def remote_num_tokens(self) -> int | None: ...

    @property
    def weights_version(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


class ReleasedLease(Protocol):
    """A prefill lease whose blocks the engine may free now."""

    @property
    def request_id(self) -> str: ...

    @property
    def expired(self) -> bool: ...


class FinishedPull(Protocol):
    """A decode pull that ended: `error` None means the KV is in the request's blocks."""

    @property
    def request_id(self) -> str: ...

    @property
    def error(self) -> str | None: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class KVConnectorPort(Protocol):
    """The engine calls these on its step thread; none of them blocks on the network.

    `params` arguments are the TransferParams a request carried (typed Any so a connector may
    declare its concrete params class).
    """

    def bind(
        self,
        kv: torch.Tensor,
        wake: Callable[[], None],
        fp8: Fp8Format | None = None,
        spec: KVSpec | None = None,
    ) -> None:
        """Register the KV pool; `wake` is called (from any thread) when something finished.
        `fp8`: the pool holds packed fp8 rows of this format (moved as they are). `spec`: the
        cache's KVSpec, for pools whose rows their tensor's shape does not show (latent)."""
        ...

    def grant(
        self, request_id: str, block_ids: Sequence[int], num_tokens: int, weights_version: str
    ) -> TransferParams:
        """Prefill: lease these blocks to a remote decode; the params go back to the client."""
        ...

    def take_released(self) -> Sequence[ReleasedLease]: ...

    def start_pull(
        self, request_id: str, params: Any, block_ids: Sequence[int], start: int, end: int
    ) -> None:
        """Decode: read remote prompt tokens start..end-1 into these local blocks."""
        ...

    def take_pulled(self) -> Sequence[FinishedPull]: ...

    def cancel_pull(self, request_id: str) -> None: ...

    def release_remote(self, params: Any) -> None:
        """Decode: the prefill may free this lease; nothing will be read from it."""
        ...

    def keep_alive(self, waiting: Sequence[Any]) -> None:
        """Decode: pin the leases of requests still waiting for local blocks."""
        ...
