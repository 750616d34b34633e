"""KV connectors end to end in one process (NIXL and TCP, both real): a decode pulls leased blocks
of a prefill across block sizes, the lease is released by the pull, and every failure (expired
lease, dead prefill, mismatched transport, a read outside the lease) is a clear error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import torch

from loom_runtime.kv.cache import KVCacheSpec
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.transfer import side_channel
from loom_runtime.transfer.connector import (
    ConnectorSettings,
    KVConnector,
    PullResult,
    build_connector,
)
from loom_runtime.transfer.lease import LeaseTable
from loom_runtime.wire.kv_transfer import KVTransferParams

LAYERS, HEADS, DIM = 3, 2, 8
KINDS = ["nixl", "tcp"]


def kv_pool(num_blocks: int, block_size: int, fill: bool) -> torch.Tensor:
    shape = (num_blocks, LAYERS, 2, block_size, HEADS, DIM)
    return (
        torch.randn(shape, dtype=torch.float64) if fill else torch.zeros(shape, dtype=torch.float64)
    )


def tokens(kv: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """[LAYERS, 2, tokens, HEADS, DIM] of the sequence stored in `blocks`."""
    bs = kv.shape[3]
    return kv[blocks].permute(1, 2, 0, 3, 4, 5).reshape(LAYERS, 2, len(blocks) * bs, HEADS, DIM)


class Pair:
    """A prefill and a decode connector bound to their own pools."""

    def __init__(self, make: Callable[..., KVConnector], kind: str, lease_s: float = 30.0) -> None:
        self.prefill_kv = kv_pool(32, 16, fill=True)
        self.decode_kv = kv_pool(64, 8, fill=False)
        self.woken = threading.Event()
        self.prefill = make(kind, "prefill", lease_seconds=lease_s)
        self.decode = make(kind, "decode")
        self.prefill.bind(self.prefill_kv, lambda: None)
        self.decode.bind(self.decode_kv, self.woken.set)

    def pull(self, params: KVTransferParams, blocks: list[int], start: int, end: int) -> PullResult:
        self.decode.start_pull("dec-1", params, blocks, start, end)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = self.decode.take_pulled()
            if done:
                return done[0]
            self.woken.wait(1)
            self.woken.clear()
        raise AssertionError("the pull never reported")

    def released(self) -> list[object]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = self.prefill.take_released()
            if got:
                return list(got)
            time.sleep(0.01)
        return []


@pytest.fixture
def make() -> Iterator[Callable[..., KVConnector]]:
    made: list[KVConnector] = []

    def build(kind: str, role: str, **more: object) -> KVConnector:
        conn = build_connector(ConnectorSettings(kind, role, side_port=0, **more))  # type: ignore[arg-type]
        made.append(conn)
        return conn

    yield build
    for conn in reversed(made):
        conn.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_pull_converts_block_sizes_and_releases_the_lease(
    make: Callable[..., KVConnector], kind: str
) -> None:
    pair = Pair(make, kind)
    p_blocks = [7, 2, 30, 11]  # 64 tokens in blocks of 16
    params = pair.prefill.grant("req-1", p_blocks, 60, "v1")
    assert params.remote_port == pair.prefill.side_port and params.remote_num_tokens == 60
    d_blocks = [40, 3, 9, 50, 12, 5, 60, 1]  # the same 64 tokens in blocks of 8
    result = pair.pull(params, d_blocks, 8, 59)  # the decode already has 0..7, computes 59
    assert result.error is None and result.num_tokens == 51
    assert result.nbytes == 51 * LAYERS * 2 * HEADS * DIM * 8
    src, dst = tokens(pair.prefill_kv, p_blocks), tokens(pair.decode_kv, d_blocks)
    assert torch.equal(dst[:, :, 8:59], src[:, :, 8:59])
    assert not dst[:, :, :8].any() and not dst[:, :, 59:].any()  # nothing outside the range
    released = pair.released()
    assert [(r.request_id, r.expired) for r in released] == [("req-1", False)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
def test_a_pull_of_an_expired_lease_fails_and_writes_nothing(
    make: Callable[..., KVConnector], kind: str
) -> None:
    pair = Pair(make, kind, lease_s=0.05)
    params = pair.prefill.grant("req-1", [1, 2], 30, "v1")
    released = pair.released()
    assert [r.expired for r in released] == [True]  # type: ignore[attr-defined]
    result = pair.pull(params, [0, 1, 2, 3], 0, 29)
    assert result.error is not None and "no live KV lease for request req-1" in result.error
    assert not pair.decode_kv.any()


@pytest.mark.parametrize("kind", KINDS)
def test_a_pull_from_a_prefill_that_is_gone_fails_fast(
    make: Callable[..., KVConnector], kind: str
) -> None:
    pair = Pair(make, kind)
    params = pair.prefill.grant("req-1", [1], 10, "v1")
    pair.prefill.close()
    result = pair.pull(params, [0, 1], 0, 9)
    assert result.error is not None and "cannot reach the KV side channel" in result.error
    assert str(params.remote_port) in result.error


def fp8_pool(num_blocks: int, block_size: int, fill: bool) -> torch.Tensor:
    """A PagedKVCache's packed fp8 pool: [blocks, layers, 2, block_size, heads, DIM + 4] uint8."""
    spec = KVCacheSpec(LAYERS, HEADS, DIM, block_size, num_blocks, fp8=Fp8Format(DIM))
    cache = spec.allocate()
    if fill:
        slots = torch.arange(num_blocks * block_size)
        for layer in range(LAYERS):
            k, v = torch.randn(2, len(slots), HEADS, DIM)
            cache.write(layer, slots, k, v)
    return cache.data


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_blocks_move_as_they_are_scales_included(
    make: Callable[..., KVConnector], kind: str
) -> None:
    fp8 = Fp8Format(DIM)
    prefill_kv, decode_kv = fp8_pool(32, 16, fill=True), fp8_pool(64, 8, fill=False)
    prefill, decode = make(kind, "prefill"), make(kind, "decode")
    prefill.bind(prefill_kv, lambda: None, fp8)
    woken = threading.Event()
    decode.bind(decode_kv, woken.set, fp8)
    assert decode.layout is not None and decode.layout.head_dim == DIM
    assert decode.layout.dtype == "float8_e4m3fn" and decode.layout.scale_group == DIM
    params = prefill.grant("req-1", [7, 2, 30], 40, "v1")
    decode.start_pull("dec-1", params, [40, 3, 9, 50, 12], 0, 39)
    deadline = time.monotonic() + 60
    while not (done := decode.take_pulled()) and time.monotonic() < deadline:
        woken.wait(1)
        woken.clear()
    assert done and done[0].error is None
    assert done[0].nbytes == 39 * LAYERS * 2 * HEADS * (DIM + 4)  # e4m3 values + one scale
    src = prefill_kv[[7, 2, 30]].permute(1, 2, 0, 3, 4, 5).reshape(LAYERS, 2, 48, HEADS, -1)
    dst = decode_kv[[40, 3, 9, 50, 12]].permute(1, 2, 0, 3, 4, 5).reshape(LAYERS, 2, 40, HEADS, -1)
    assert torch.equal(dst[:, :, :39], src[:, :, :39])  # the packed bytes, bit for bit
    assert not dst[:, :, 39:].any()


def test_an_fp8_prefill_and_a_float_decode_are_refused(make: Callable[..., KVConnector]) -> None:
    prefill, decode = make("tcp", "prefill"), make("tcp", "decode")
    prefill.bind(fp8_pool(8, 16, fill=True), lambda: None, Fp8Format(DIM))
    decode.bind(kv_pool(8, 16, fill=False), lambda: None)
    decode.start_pull("d", prefill.grant("req-1", [1], 10, "v1"), [0], 0, 9)
    deadline = time.monotonic() + 30
    while not (done := decode.take_pulled()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done and done[0].error is not None
    assert "dtype float8_e4m3fn != float64" in done[0].error
    assert "same KV dtype" in done[0].error


def test_mismatched_transports_are_named(make: Callable[..., KVConnector]) -> None:
    prefill = make("tcp", "prefill")
    decode = make("nixl", "decode")
    prefill.bind(kv_pool(8, 16, fill=True), lambda: None)
    decode.bind(kv_pool(8, 16, fill=False), lambda: None)
    params = prefill.grant("req-1", [1], 10, "v1")
    decode.start_pull("d", params, [0], 0, 9)
    deadline = time.monotonic() + 30
    while not (done := decode.take_pulled()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done and done[0].error is not None
    assert "serves KV over 'tcp'" in done[0].error and "--kv-connector" in done[0].error


def test_a_tcp_read_outside_the_lease_is_refused(make: Callable[..., KVConnector]) -> None:
    pair = Pair(make, "tcp")
    pair.prefill.grant("req-1", [4], 16, "v1")
    block = pair.prefill_kv[0].numel() * 8
    port = pair.prefill.side_port
    assert port is not None
    inside = {
        "op": "read",
        "request_id": "req-1",
        "src": (4 * block).to_bytes(8, "little"),
        "len": (5 * block).to_bytes(8, "little"),
    }  # blocks 4 and 5
    reply = side_channel.call("127.0.0.1", port, inside, timeout=10)
    assert not reply["ok"] and "outside the blocks leased to request req-1" in reply["error"]
    unknown = {**inside, "request_id": "nope"}
    reply = side_channel.call("127.0.0.1", port, unknown, timeout=10)
    assert not reply["ok"] and "no live KV lease" in reply["error"]


@pytest.mark.parametrize("kind", KINDS)
def test_release_remote_frees_the_lease_without_a_read(
    make: Callable[..., KVConnector], kind: str
) -> None:
    pair = Pair(make, kind)
    params = pair.prefill.grant("req-1", [1, 2], 30, "v1")
    pair.decode.release_remote(params)
    assert [r.expired for r in pair.released()] == [False]  # type: ignore[attr-defined]


def test_keep_alive_pins_a_waiting_lease(make: Callable[..., KVConnector]) -> None:
    clock_now = [1000.0]
    pair = Pair(make, "tcp", lease_s=10)
    pair.prefill.leases = LeaseTable(10, lambda: clock_now[0])
    params = replace(pair.prefill.grant("req-1", [1], 10, "v1"), lease_seconds=0.03)
    lease = pair.prefill.leases.pin("req-1")
    assert lease is not None
    first = lease.deadline
    clock_now[0] += 9  # one second left
    deadline = time.monotonic() + 30
    while lease.deadline == first and time.monotonic() < deadline:
        pair.decode.keep_alive([params])  # pins at most every lease_seconds / 3
        time.sleep(0.02)
    assert lease.deadline == clock_now[0] + 10
    clock_now[0] += 5  # past the original deadline, inside the pinned one
    assert pair.prefill.take_released() == []
