"""The gRPC control service on a live worker: token check, drain, weight load, resume.

The weight-sync test is the contract the fleet controller relies on: requests in flight when
Pause(WAIT) arrives finish on the old weights, nothing is admitted until Resume, and everything
after Resume runs on the new weights with a cleared prefix cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import msgpack
import openai
import pytest
import zmq

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api import control_pb2_grpc as pb_grpc

NUM_BLOCKS = 96
LONG_PROMPT = list(range(400, 600))  # 200 token ids: 12 full blocks


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Path) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


@pytest.fixture
def channel(worker: Any) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(worker.control) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.ControlStub:
    return pb_grpc.ControlStub(channel)


@pytest.fixture
def auth(worker: Any) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {worker.token}")]


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    code: grpc.StatusCode = info.value.code()
    return code


def test_calls_without_the_shared_token_are_refused(worker: Any, stub: pb_grpc.ControlStub) -> None:
    wrong = [("authorization", "Bearer not-the-token")]
    assert _code(lambda: stub.Status(pb.StatusRequest())) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: stub.Status(pb.StatusRequest(), metadata=wrong)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    watch = stub.WatchStatus(pb.WatchStatusRequest(), metadata=wrong)
    assert _code(lambda: next(watch)) == grpc.StatusCode.UNAUTHENTICATED
    pause = pb.PauseRequest(mode=pb.PAUSE_MODE_ABORT)
    assert _code(lambda: stub.Pause(pause, metadata=wrong)) == grpc.StatusCode.UNAUTHENTICATED
    assert worker.get_json("/ready")[0] == 200  # the refused Pause did not run


def test_status_describes_a_serving_worker(worker: Any, stub: Any, auth: Any) -> None:
    status = stub.Status(pb.StatusRequest(), metadata=auth)
    assert status.state == pb.WORKER_STATE_SERVING
    assert status.admission_open
    assert (status.model_name, status.role, status.weights_version) == (
        worker.model,
        "aggregated",
        "v1",
    )
    assert (status.num_blocks, status.block_size) == (NUM_BLOCKS, 16)


def test_load_weights_is_refused_unless_paused_and_drained(
    stub: Any, auth: Any, tiny_v2: Path
) -> None:
    load = pb.LoadWeightsRequest(source=str(tiny_v2), version="v9")
    assert _code(lambda: stub.LoadWeights(load, metadata=auth)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    no_version = pb.LoadWeightsRequest(source=str(tiny_v2))
    assert _code(lambda: stub.LoadWeights(no_version, metadata=auth)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    status = stub.Status(pb.StatusRequest(), metadata=auth)
    assert status.weights_version == "v1" and status.state == pb.WORKER_STATE_SERVING


@dataclass
class StreamRecord:
    """What one streaming client saw."""

    started: threading.Event = field(default_factory=threading.Event)
    header_version: str = ""
    fingerprints: set[str] = field(default_factory=set)
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: BaseException | None = None


def _stream(client: openai.OpenAI, model: str, rec: StreamRecord, max_tokens: int) -> None:
    try:
        with client.completions.with_streaming_response.create(
            model=model,
            prompt="In the beginning",
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ) as resp:
            rec.header_version = resp.headers["x-loom-weights-version"]
            for chunk in resp.parse():
                rec.started.set()
                rec.fingerprints.add(chunk.system_fingerprint or "")
                if chunk.choices and chunk.choices[0].finish_reason:
                    rec.finish_reason = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    rec.completion_tokens = chunk.usage.completion_tokens
    except BaseException as exc:
        rec.error = exc
    finally:
        rec.started.set()


class Watcher:
    """Collects (state, weights_version) from WatchStatus on a thread until cancelled."""

    def __init__(self, stub: Any, auth: Any) -> None:
        self.seen: list[tuple[int, str]] = []
        self._call = stub.WatchStatus(pb.WatchStatusRequest(interval_seconds=0.1), metadata=auth)
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            for status in self._call:
                self.seen.append((status.state, status.weights_version))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.CANCELLED

    def saw(self, state: int, version: str) -> bool:
        return (state, version) in self.seen

    def stop(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=10)


class KVEvents:
    """A SUB socket on the worker's KV event stream."""

    def __init__(self, endpoint: str) -> None:
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)

    def event_types(self, timeout_s: float) -> list[str]:
        types: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.sock.poll(100):
                continue
            _topic, _seq, payload = self.sock.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload)
            types += [e["type"] if isinstance(e, dict) else e[0] for e in events]
            if "AllBlocksCleared" in types:
                break
        return types

    def close(self) -> None:
        self.sock.close(linger=0)
        self._ctx.term()


def _greedy(client: openai.OpenAI, model: str) -> tuple[str, str, str]:
    raw = client.completions.with_raw_response.create(
        model=model, prompt="The weights decide", max_tokens=12, temperature=0
    )
    done = raw.parse()
    header = raw.headers["x-loom-weights-version"]
    return done.choices[0].text, done.system_fingerprint or "", header


def _cached(client: openai.OpenAI, model: str) -> int:
    done = client.completions.create(model=model, prompt=LONG_PROMPT, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    return done.usage.prompt_tokens_details.cached_tokens or 0


def test_pause_drain_load_resume_under_load(
    worker: Any, stub: Any, auth: Any, client: openai.OpenAI, tiny_v2: Path, wait_until: Any
) -> None:
    old_text, old_fp, old_header = _greedy(client, worker.model)
    assert (old_fp, old_header) == ("v1", "v1")
    _cached(client, worker.model)
    assert _cached(client, worker.model) > 0  # the long prompt is in the prefix cache
    events = KVEvents(worker.kv_events)
    watcher = Watcher(stub, auth)
    records = [StreamRecord() for _ in range(4)]
    threads = [
        threading.Thread(target=_stream, args=(client, worker.model, r, 300)) for r in records
    ]
    try:
        for t in threads:
            t.start()
        for r in records:
            assert r.started.wait(60) and r.error is None
        paused: dict[str, Any] = {}
        pauser = threading.Thread(
            target=lambda: paused.update(
                status=stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_WAIT), metadata=auth)
            )
        )
        pauser.start()
        wait_until(
            lambda: (
                stub.Status(pb.StatusRequest(), metadata=auth).state == pb.WORKER_STATE_DRAINING
            ),
            30,
            "the worker to report DRAINING",
        )
        wait_until(lambda: watcher.saw(pb.WORKER_STATE_DRAINING, "v1"), 30, "a DRAINING watch")
        code, body, _ = worker.post(
            "/v1/completions", {"model": worker.model, "prompt": "late", "max_tokens": 2}
        )
        assert code == 503 and body["error"]["code"] == "admission_closed"
        assert worker.get_json("/ready")[0] == 503
        pauser.join(120)
        status = paused["status"]
        assert status.state == pb.WORKER_STATE_PAUSED and status.in_flight == 0
        wait_until(lambda: watcher.saw(pb.WORKER_STATE_PAUSED, "v1"), 30, "a PAUSED watch")
        for t in threads:
            t.join(60)
        for r in records:  # started before the pause: finished, whole, on the old version
            assert r.error is None
            assert (r.finish_reason, r.completion_tokens) == ("length", 300)
            assert r.header_version == "v1" and r.fingerprints == {"v1"}

        loaded = stub.LoadWeights(
            pb.LoadWeightsRequest(source=str(tiny_v2), version="v2"), metadata=auth
        )
        assert loaded.weights_version == "v2" and loaded.state == pb.WORKER_STATE_PAUSED
        assert "AllBlocksCleared" in events.event_types(timeout_s=10)
        assert worker.get_json("/ready")[0] == 503  # loaded but not resumed: still closed

        resumed = stub.Resume(pb.ResumeRequest(), metadata=auth)
        assert resumed.state == pb.WORKER_STATE_SERVING and resumed.admission_open
        wait_until(lambda: watcher.saw(pb.WORKER_STATE_SERVING, "v2"), 30, "a SERVING v2 watch")
        assert worker.get_json("/ready")[0] == 200
        new_text, new_fp, new_header = _greedy(client, worker.model)
        assert (new_fp, new_header) == ("v2", "v2")
        assert new_text != old_text  # other weights, other tokens
        assert _cached(client, worker.model) == 0  # the load cleared the prefix cache
        assert worker.metric("loom:weights_version_info", version="v2") == 1
    finally:
        watcher.stop()
        events.close()
    seen = watcher.seen
    assert seen[0] == (pb.WORKER_STATE_SERVING, "v1")
    order = [seen.index(s) for s in ((pb.WORKER_STATE_DRAINING, "v1"),
             (pb.WORKER_STATE_PAUSED, "v1"), (pb.WORKER_STATE_SERVING, "v2"))]  # fmt: skip
    assert order == sorted(order)  # the watch saw drain, pause, then serving the new version


def test_reloading_the_served_version_is_refused(stub: Any, auth: Any, tiny_v2: Path) -> None:
    stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_WAIT, timeout_seconds=30), metadata=auth)
    try:
        current = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
        same = pb.LoadWeightsRequest(source=str(tiny_v2), version=current)
        assert _code(lambda: stub.LoadWeights(same, metadata=auth)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        missing = pb.LoadWeightsRequest(source="/no/such/checkpoint", version="v-missing")
        assert _code(lambda: stub.LoadWeights(missing, metadata=auth)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        remote = pb.LoadWeightsRequest(source="s3://bucket/model", version="v-remote")
        assert _code(lambda: stub.LoadWeights(remote, metadata=auth)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert stub.Status(pb.StatusRequest(), metadata=auth).weights_version == current
    finally:
        stub.Resume(pb.ResumeRequest(), metadata=auth)


def test_pause_abort_ends_streams_with_a_retryable_error_and_frees_the_pool(
    worker: Any, stub: Any, auth: Any, client: openai.OpenAI
) -> None:
    records = [StreamRecord() for _ in range(2)]
    threads = [
        threading.Thread(target=_stream, args=(client, worker.model, r, 400)) for r in records
    ]
    for t in threads:
        t.start()
    try:
        for r in records:
            assert r.started.wait(60) and r.error is None
        status = stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_ABORT), metadata=auth)
        assert status.state == pb.WORKER_STATE_PAUSED and status.in_flight == 0
        for t in threads:
            t.join(60)
        for r in records:
            assert isinstance(r.error, openai.APIError)
            assert "aborted" in str(r.error)
            assert r.completion_tokens < 400
        status = stub.Status(pb.StatusRequest(), metadata=auth)
        assert status.num_free_blocks == status.num_blocks == NUM_BLOCKS
        assert status.kv_usage == 0.0
    finally:
        stub.Resume(pb.ResumeRequest(), metadata=auth)
    assert stub.Status(pb.StatusRequest(), metadata=auth).state == pb.WORKER_STATE_SERVING


def test_a_push_that_was_not_received_cannot_be_swapped_in(
    worker: Any, stub: pb_grpc.ControlStub, auth: Any
) -> None:
    before = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
    bad = pb.ReceiveWeightsRequest(store_host="127.0.0.1", store_port=1, rank=1, world_size=2)
    assert _code(lambda: stub.ReceiveWeights(bad, metadata=auth)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_WAIT, timeout_seconds=10), metadata=auth)
    try:
        load = pb.LoadWeightsRequest(source="push://never-received", version="v-pushed")
        with pytest.raises(grpc.RpcError) as info:
            stub.LoadWeights(load, metadata=auth)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "nothing staged" in (info.value.details() or "")
    finally:
        stub.Resume(pb.ResumeRequest(), metadata=auth)
    assert stub.Status(pb.StatusRequest(), metadata=auth).weights_version == before


def test_send_weights_is_refused_unless_the_worker_serves_the_version_asked(
    worker: Any, stub: pb_grpc.ControlStub, auth: Any
) -> None:
    serving = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
    no_version = pb.SendWeightsRequest(update_id="u1", store_host="127.0.0.1", store_port=1)
    assert _code(lambda: stub.SendWeights(no_version, metadata=auth)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    other = pb.SendWeightsRequest(
        update_id="u1", store_host="127.0.0.1", store_port=1, version=f"not-{serving}"
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SendWeights(other, metadata=auth)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"this worker serves {serving!r}" in (info.value.details() or "")
    assert stub.Status(pb.StatusRequest(), metadata=auth).state == pb.WORKER_STATE_SERVING
