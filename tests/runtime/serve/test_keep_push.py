"""A keep swap on a live worker (float64): a trainer's push staged by ReceiveWeights, then
LoadWeights(source="push://…", kv=…) swaps it in under a greedy stream, which fails nothing and
goes on; its record's weight_versions hold two spans split at the first token of the new
weights (a stream that ends before the swap lands is all the old version's, and the test pushes
again). kv="recompute" goes on exactly as a fresh greedy run of the new weights over prompt +
the tokens before the swap. A keep swap of a paused worker, of a checkpoint, or with an unknown
kv is refused, and the push stays staged."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api import control_pb2_grpc as pb_grpc
from loom_runtime.models.loader import load_model
from loom_runtime.testing.processes import free_ports
from loom_runtime.testing.record_stream import RecordStream
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.protocol import plan_buckets, spec_of
from loom_trainer.sender import send_push

PROMPT = list(range(300, 320))
MAX_TOKENS = 300
TRIES = 3  # a swap can land after a stream ends on a loaded machine; then another push tries
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Path) -> Iterator[Any]:
    with launch(tiny_v1, "--dtype", "float64") as w:
        yield w


@pytest.fixture(scope="module")
def stub(worker: Any) -> Iterator[pb_grpc.ControlStub]:
    with grpc.insecure_channel(worker.control) as ch:
        yield pb_grpc.ControlStub(ch)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def auth(worker: Any) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {worker.token}")]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    model = load_model(checkpoint, dtype=torch.float64).model
    tensors: dict[str, torch.Tensor] = model.targets()  # type: ignore[attr-defined]
    return tensors


def stage(stub: Any, auth: Any, tensors: Mapping[str, torch.Tensor], version: str) -> str:
    """Push `tensors` as `version` from a trainer thread; the worker stages it (rank 1 of 2)."""
    (port,) = free_ports(1)
    update_id = f"u-{version}"
    buckets = plan_buckets([spec_of(n, t) for n, t in tensors.items()], 16 << 20)
    errors: list[BaseException] = []

    def trainer() -> None:
        try:
            group = TransferGroup(Rendezvous("127.0.0.1", port, 0, 2, TIMEOUT_S, update_id))
            send_push(group, ("worker",), buckets, tensors, None)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=trainer)
    thread.start()
    request = pb.ReceiveWeightsRequest(
        update_id=update_id, store_host="127.0.0.1", store_port=port, rank=1, world_size=2,
        version=version, timeout_seconds=TIMEOUT_S,
    )  # fmt: skip
    stub.ReceiveWeights(request, metadata=auth, timeout=4 * TIMEOUT_S)
    thread.join(TIMEOUT_S)
    assert not thread.is_alive() and not errors, errors
    return f"push://{update_id}"


def body(worker: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {"model": worker.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "return_behaviour": True}  # fmt: skip


def greedy(worker: Any, prompt: list[int], max_tokens: int) -> list[int]:
    status, answer, _ = worker.post("/v1/completions", body(worker, prompt, max_tokens))
    assert status == 200, answer
    return list(answer["choices"][0]["token_ids"])


def open_stream(worker: Any) -> RecordStream:
    """A streamed greedy completion with its record, straight to the worker."""
    return RecordStream(worker.base_url + "/v1/completions", body(worker, PROMPT, MAX_TOKENS))


def serving_checkpoint(stub: Any, auth: Any) -> str:
    """Which fixture checkpoint the worker serves: it starts on tiny_v1, and each push here is
    named after the checkpoint it carries."""
    version = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
    return "tiny_v2" if version.endswith("tiny_v2") else "tiny_v1"


def swap_under_a_stream(
    worker: Any, stub: Any, auth: Any, source: str, version: str, kv: str
) -> tuple[str, list[int], list[dict[str, Any]]]:
    before = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
    stream = open_stream(worker)
    assert stream.first_token.wait(TIMEOUT_S)
    status = stub.LoadWeights(
        pb.LoadWeightsRequest(source=source, version=version, kv=kv), metadata=auth, timeout=120
    )
    assert status.weights_version == version and status.admission_open
    ids, spans, finish = stream.result()
    assert finish == "length" and len(ids) == MAX_TOKENS  # nothing failed or was cut
    return before, ids, spans


@pytest.mark.parametrize("kv", ["recompute", "keep"])
def test_a_greedy_stream_goes_on_across_a_keep_swap_each_token_with_its_version(
    worker: Any, stub: Any, auth: Any, request: pytest.FixtureRequest, kv: str
) -> None:
    for attempt in range(TRIES):  # each try pushes the weights the worker does not serve
        old = greedy(worker, PROMPT, MAX_TOKENS)  # the serving version's greedy run
        other = "tiny_v2" if serving_checkpoint(stub, auth) == "tiny_v1" else "tiny_v1"
        version = f"pushed-{kv}-{attempt}-{other}"
        source = stage(stub, auth, weights(request.getfixturevalue(other)), version)
        before, ids, spans = swap_under_a_stream(worker, stub, auth, source, version, kv)
        if len(spans) == 2:
            break
        # the stream ended before the swap landed: it was the old version's, token for token
        assert spans == [{"version": before, "start": 0, "end": MAX_TOKENS}] and ids == old
    else:
        pytest.fail(f"no swap of {TRIES} landed inside a {MAX_TOKENS}-token stream")
    k = spans[0]["end"]
    assert spans == [
        {"version": before, "start": 0, "end": k},
        {"version": version, "start": k, "end": MAX_TOKENS},
    ]
    assert 0 < k < MAX_TOKENS and ids[:k] == old[:k]
    if kv == "recompute":  # a fresh greedy run of the new weights over prompt + tokens before
        assert ids[k:] == greedy(worker, PROMPT + ids[:k], MAX_TOKENS - k)
    assert greedy(worker, PROMPT, 4) == greedy(worker, PROMPT, 8)[:4]  # it serves on


def test_a_keep_swap_is_refused_unless_a_serving_worker_takes_a_staged_push(
    worker: Any, stub: Any, auth: Any, tiny_v2: Path, tiny_v1: Path
) -> None:
    serving = stub.Status(pb.StatusRequest(), metadata=auth).weights_version
    tensors = weights(tiny_v1 if serving_checkpoint(stub, auth) == "tiny_v2" else tiny_v2)
    source = stage(stub, auth, tensors, "pushed-refusals")

    def refused(load: pb.LoadWeightsRequest) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as info:
            stub.LoadWeights(load, metadata=auth, timeout=60)
        return info.value.code(), info.value.details() or ""

    code, why = refused(pb.LoadWeightsRequest(source=source, version="pushed-refusals", kv="x"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "kv must be one of keep, recompute" in why
    code, why = refused(pb.LoadWeightsRequest(source=str(tiny_v2), version="ck", kv="keep"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "takes a staged push" in why
    stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_WAIT, timeout_seconds=10), metadata=auth)
    try:
        load = pb.LoadWeightsRequest(source=source, version="pushed-refusals", kv="keep")
        code, why = refused(load)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "needs a serving worker" in why
        assert stub.Status(pb.StatusRequest(), metadata=auth).state == pb.WORKER_STATE_PAUSED
    finally:
        stub.Resume(pb.ResumeRequest(), metadata=auth)
    assert stub.Status(pb.StatusRequest(), metadata=auth).weights_version == serving
    status = stub.LoadWeights(load, metadata=auth, timeout=60)  # still staged: it lands now
    assert status.weights_version == "pushed-refusals" and status.admission_open
