"""P/D on the step thread: prefill leases on finished requests, decode pulls before the first token.

Owns the leased tables, the decode's pull queue and in-flight pulls, and the transfer-failure
policy; never waits on the network (the connector's threads do) and never schedules compute.

First-token rule: a decode pulls the KV of prompt tokens 0..P-2 and computes the last prompt
token itself, so its first token comes from its own logits, exactly as in an aggregated run
(vLLM's NixlConnector does the same). Prefix-cache hits on the decode are not pulled.

Keep swaps (push mode keep): a decode pulls KV only of its own weights version, or of a version
it swapped away from in a keep swap, which the swap's kv policy then decides: "keep" uses it (the
request's KV is partly of older weights, as a running request's is, and never enters the prefix
cache); "recompute" prefills the prompt locally under the new weights. A prefill stamps each
lease with the version its request ends on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loom_runtime.engine.ar_decode import ARDecodeLoop
from loom_runtime.engine.ar_state import ARDecodeState
from loom_runtime.engine.keep_swap import KVPolicy
from loom_runtime.engine.scheduler import pick_replica
from loom_runtime.engine.transfer_port import DisaggSettings, KVConnectorPort, TransferParams
from loom_runtime.engine.types import EngineRequest
from loom_runtime.errors import InvalidRequestError, TransferError
from loom_runtime.kv.block_table import BlockTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransferCounters:
    kv_expired: int = 0
    kv_transfer_failures: int = 0
    kv_pulled_tokens: int = 0
    kv_pulled_bytes: int = 0


SWAPS_KEPT = 8
"""Keep swaps a decode remembers (the versions it swapped from, with their kv policy): a lease
outlives a few swaps only if it is pulled within its lease time, so older ones never arrive."""


@dataclass
class RemoteProgress:
    """What one `progress` call hands back to the batcher."""

    ready: list[ARDecodeState] = field(default_factory=list)  # blocks held, resume computing
    local: list[ARDecodeState] = field(default_factory=list)  # no blocks: admit as usual
    failed: list[ARDecodeState] = field(default_factory=list)  # finish now (abort or error)
    admitted_prompt_tokens: int = 0


def check_transfer_request(req: EngineRequest, disagg: DisaggSettings | None) -> None:
    """InvalidRequestError when the request's P/D flags do not fit this worker's role."""
    params = req.kv_transfer
    if params is None or not (params.do_remote_decode or params.do_remote_prefill):
        return
    wanted = "prefill" if params.do_remote_decode else "decode"
    flag = "do_remote_decode" if params.do_remote_decode else "do_remote_prefill"
    role = "aggregated" if disagg is None else disagg.role
    if role != wanted:
        raise InvalidRequestError(
            f"request {req.request_id!r}: kv_transfer_params.{flag} needs a {wanted} worker, "
            f"but this worker runs --role {role}; send it to a {wanted} worker",
            param=f"kv_transfer_params.{flag}",
        )


class RemoteKV:
    """The P/D half of one Batcher. Single-threaded: the step thread calls every method."""

    def __init__(
        self,
        loop: ARDecodeLoop,
        connector: KVConnectorPort,
        settings: DisaggSettings,
        max_pulls: int,
        on_pulled: Callable[[list[int]], None] | None = None,
    ) -> None:
        """`on_pulled`: called with the block ids a finished pull wrote, before the request
        computes again (HiSparse copies their indexer keys to the device)."""
        self.loop = loop
        self.on_pulled = on_pulled
        self.kv = loop.kv
        self.connector = connector
        self.settings = settings
        self.max_pulls = max_pulls
        self.held: dict[str, BlockTable] = {}  # prefill: leased prompt blocks by request id
        self.waiting: deque[ARDecodeState] = deque()  # decode: waiting for local blocks
        self.pulling: dict[str, ARDecodeState] = {}  # decode: blocks held, KV on its way
        self.swapped_from: dict[str, KVPolicy] = {}  # decode: keep swaps since the last
        # drained load, oldest first
        self.counters = TransferCounters()

    @property
    def has_work(self) -> bool:
        return bool(self.held or self.waiting or self.pulling)

    @property
    def request_ids(self) -> set[str]:
        return {s.request_id for s in self.waiting} | set(self.pulling)

    def wants(self, state: ARDecodeState) -> bool:
        """True for a decode request whose prompt KV comes from a remote prefill."""
        params = state.request.kv_transfer
        return params is not None and params.do_remote_prefill

    def add(self, state: ARDecodeState) -> None:
        self.waiting.append(state)

    # --- prefill side --------------------------------------------------------------------------

    def hold(self, state: ARDecodeState) -> None:
        """Before a finished request is finalized: lease its prompt blocks to a remote decode
        (if it asked for one); the rest of its blocks are freed by finalize as usual."""
        params = state.request.kv_transfer
        if params is None or not params.do_remote_decode or state.finish_reason == "abort":
            return
        leased = self.kv.split(state.table, self.kv.blocks_for(state.num_prompt_tokens))
        try:
            state.kv_transfer_params = self.connector.grant(
                state.request_id,
                leased.block_ids,
                state.num_prompt_tokens,
                state.ctx.weights_version,
            )
        except (TransferError, ValueError) as exc:
            logger.warning("no KV lease for %s: %s", state.request_id, exc)
            self.kv.free(leased)
            return
        self.held[state.request_id] = leased

    def reap(self) -> None:
        """Free the leases the connector says are pulled or expired."""
        for released in self.connector.take_released():
            table = self.held.pop(released.request_id, None)
            if table is None:
                continue
            self.kv.free(table)
            if released.expired:
                self._count(kv_expired=1)
                logger.warning(
                    "KV lease expired unpulled; blocks freed",
                    extra={"request_id": released.request_id},
                )

    # --- decode side ---------------------------------------------------------------------------

    def new_weights(self, old: str, version: str, kv: KVPolicy) -> None:
        """A keep swap from `old` to `version` at a step boundary: each request waiting for or
        pulling its prompt KV goes on under `version`, and KV of `old` (pulled now, or leased by
        a prefill that has not swapped yet) is kept or recomputed as `kv` says."""
        self.swapped_from.pop(old, None)
        self.swapped_from[old] = kv
        while len(self.swapped_from) > SWAPS_KEPT:
            del self.swapped_from[next(iter(self.swapped_from))]
        for state in [*self.waiting, *self.pulling.values()]:
            self.loop.rebase(state, version)

    def drained_weights(self) -> None:
        """A drained load: KV of the versions keep-swapped from before it is refused again."""
        self.swapped_from.clear()

    def _swapped(self, state: ARDecodeState) -> KVPolicy | None:
        """The kv policy of the keep swap away from the weights the request's KV is of (None:
        its KV is of this worker's version, or of one it never keep-swapped from)."""
        params = state.request.kv_transfer
        version = None if params is None else params.weights_version
        if version is None or version == state.ctx.weights_version:
            return None
        return self.swapped_from.get(version)

    def progress(
        self, free_blocks: int, slots: int, replica_free: list[int] | None = None
    ) -> RemoteProgress:
        """Fold in finished pulls, then start pulls for waiting requests while `free_blocks`
        blocks and `slots` sequence slots last (and, on DP ranks, blocks on a replica:
        `replica_free`, each replica's, taken as requests are placed)."""
        out = RemoteProgress()
        for done in self.connector.take_pulled():
            state = self.pulling.pop(done.request_id, None)
            if state is None:
                continue
            if done.error is not None:
                self._release(state)
            if state.finished:  # aborted while pulling: its blocks are no longer written
                out.failed.append(state)
            elif done.error is None and self._swapped(state) == "recompute":
                self._recompute(state, "its pull landed after a keep swap")
                self.loop.preempt(state)  # the pulled blocks are freed, never cached
                out.local.append(state)
            elif done.error is None:
                self._arrived(state)
                state.num_computed = state.num_prompt_tokens - 1
                self._count(kv_pulled_tokens=done.num_tokens, kv_pulled_bytes=done.nbytes)
                out.ready.append(state)
            else:
                self._failed(state, done.error, out, holds_blocks=True)
        self._admit(free_blocks, slots - len(self.pulling) - len(out.ready), out, replica_free)
        if self.waiting:
            self.connector.keep_alive([s.request.kv_transfer for s in self.waiting])
        return out

    def abort(self, request_ids: Iterable[str]) -> list[ARDecodeState]:
        """Abort these requests: waiting ones are returned to finish now; pulling ones are
        cancelled and finish when their pull reports (their blocks may still be written)."""
        ids = set(request_ids)
        now: list[ARDecodeState] = []
        for state in [s for s in self.waiting if s.request_id in ids]:
            self.waiting.remove(state)
            self.loop.abort(state)
            self._release(state)
            now.append(state)
        for rid in ids & self.pulling.keys():
            self.loop.abort(self.pulling[rid])
            self.connector.cancel_pull(rid)
        return now

    def _admit(
        self, free_blocks: int, slots: int, out: RemoteProgress, replica_free: list[int] | None
    ) -> None:
        while self.waiting and slots > 0:
            state = self.waiting[0]
            swapped = self._swapped(state)
            if swapped == "recompute":
                self.waiting.popleft()
                self._release(state)
                self._recompute(state, "its prefill ran before a keep swap")
                out.local.append(state)
                continue
            problem = self._mismatch(state, check_version=swapped is None)
            if problem is not None:
                self.waiting.popleft()
                self._release(state)
                self._failed(state, problem, out, holds_blocks=False)
                continue
            if swapped == "keep":
                state.stale_kv = True  # KV of older weights: no prefix-cache hits, never cached
            cost = self.loop.admission_view(state).admit_blocks
            whole = self.kv.blocks_for(len(state.tokens))  # what its replica's ranks hold
            replica = pick_replica(replica_free, whole) if replica_free else 0
            if cost > free_blocks or replica is None:
                return  # FIFO: wait for blocks
            state.table.replica = replica
            if not self.loop.admit(state):
                return
            if replica_free:
                replica_free[replica] -= whole
            self.loop.reload_now(state)  # host-tier hits (CPU KV offload) are local hits too
            self.waiting.popleft()
            free_blocks, slots = free_blocks - cost, slots - 1
            out.admitted_prompt_tokens += state.num_prompt_tokens
            self._start(state, out)

    def _start(self, state: ARDecodeState, out: RemoteProgress) -> None:
        start, end = state.num_computed, state.num_prompt_tokens - 1
        if start >= end:  # the local prefix cache holds everything but the last token
            self._release(state)
            out.ready.append(state)
            return
        try:
            self.connector.start_pull(
                state.request_id, state.request.kv_transfer, state.table.block_ids, start, end
            )
        except TransferError as exc:
            self._release(state)
            self._failed(state, str(exc), out, holds_blocks=True)
            return
        self.pulling[state.request_id] = state

    def _arrived(self, state: ARDecodeState) -> None:
        """Hand `on_pulled` the blocks the pull wrote: tokens num_computed .. P-2 (a prefix hit
        covers whole blocks, so the first one starts a block)."""
        if self.on_pulled is None:
            return
        first = state.num_computed // self.kv.block_size
        last = self.kv.blocks_for(state.num_prompt_tokens - 1)
        self.on_pulled(list(state.table.block_ids[first:last]))

    def _recompute(self, state: ARDecodeState, why: str) -> None:
        params = state.request.kv_transfer
        logger.info(
            "prefilling locally: %s (KV of weights %s, kv=recompute)", why,
            None if params is None else params.weights_version,
            extra={"request_id": state.request_id},
        )  # fmt: skip

    def _mismatch(self, state: ARDecodeState, check_version: bool = True) -> str | None:
        params = state.request.kv_transfer
        assert params is not None
        if params.remote_num_tokens is not None and params.remote_num_tokens != (
            state.num_prompt_tokens
        ):
            return (
                f"the prefill computed {params.remote_num_tokens} prompt tokens but request "
                f"{state.request_id} has {state.num_prompt_tokens}; the router must send the "
                "decode the same prompt it sent the prefill"
            )
        mine = state.ctx.weights_version
        if check_version and params.weights_version is not None and params.weights_version != mine:
            return (
                f"the prefill's KV is of weights {params.weights_version} but this worker runs "
                f"{mine}; a request never mixes weight versions"
            )
        return None

    def _failed(
        self, state: ARDecodeState, message: str, out: RemoteProgress, holds_blocks: bool
    ) -> None:
        self._count(kv_transfer_failures=1)
        if self.settings.on_transfer_failure == "recompute":
            logger.warning("%s; prefilling locally (on_transfer_failure=recompute)", message)
            if holds_blocks:
                state.num_computed = state.table.num_cached_tokens
                out.ready.append(state)
            else:
                out.local.append(state)
            return
        logger.warning("%s; failing the request (on_transfer_failure=fail)", message)
        state.transfer_error = message
        self.loop.abort(state)
        out.failed.append(state)

    def _release(self, state: ARDecodeState) -> None:
        params: TransferParams | None = state.request.kv_transfer
        if params is not None:
            self.connector.release_remote(params)

    def _count(self, **deltas: int) -> None:
        c = self.counters
        self.counters = TransferCounters(
            **{k: getattr(c, k) + deltas.get(k, 0) for k in TransferCounters.__dataclass_fields__}
        )
