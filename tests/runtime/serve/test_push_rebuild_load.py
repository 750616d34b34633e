"""LoadWeights of a push this worker never staged (it started after the push: a restarted pod, a
scale-up), with `rebuild_from` a peer that serves the pushed version: the worker receives the
version from that peer (SendWeights) and swaps it in, then answers exactly as the peer does
(float64, greedy). Without a peer, or from a peer that does not serve the version, it is refused
and the worker keeps its weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.runtime.serve import test_keep_push as keep_push
from tests.runtime.serve.test_keep_push import stage, weights

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api import control_pb2_grpc as pb_grpc

PROMPT = list(range(300, 316))


def greedy(worker: Any) -> list[int]:
    return keep_push.greedy(worker, PROMPT, 12)


@pytest.fixture(scope="module")
def pair(launch: Any, tiny_v1: Path) -> Iterator[tuple[Any, Any]]:
    with launch(tiny_v1, "--dtype", "float64") as a, launch(tiny_v1, "--dtype", "float64") as b:
        yield a, b


def control(worker: Any) -> Any:
    return pb_grpc.ControlStub(grpc.insecure_channel(worker.control))  # type: ignore[no-untyped-call]


def paused(stub: Any, auth: Any) -> None:
    stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_WAIT, timeout_seconds=10), metadata=auth)


def load(stub: Any, auth: Any, source: str, version: str, peer: str = "") -> str:
    """Pause, load `source` as `version` (a push not staged here: from `peer`), resume; the
    version the worker then reports."""
    paused(stub, auth)
    request = pb.LoadWeightsRequest(source=source, version=version, rebuild_from=peer)
    status = stub.LoadWeights(request, metadata=auth, timeout=120)
    stub.Resume(pb.ResumeRequest(), metadata=auth)
    return str(status.weights_version)


def test_a_worker_that_never_staged_a_push_receives_it_from_a_peer(
    pair: tuple[Any, Any], tiny_v2: Path
) -> None:
    a, b = pair
    auth = [("authorization", f"Bearer {a.token}")]
    sa, sb = control(a), control(b)
    before = greedy(b)
    source = stage(sa, auth, weights(tiny_v2), "p2")
    assert load(sa, auth, source, "p2") == "p2"

    paused(sb, auth)
    with pytest.raises(grpc.RpcError) as refused:  # no staging and no peer
        sb.LoadWeights(pb.LoadWeightsRequest(source=source, version="p2"), metadata=auth)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has nothing staged" in str(refused.value.details())
    with pytest.raises(grpc.RpcError) as wrong:  # a peer that does not serve the version
        sb.LoadWeights(
            pb.LoadWeightsRequest(source=source, version="p3", rebuild_from=a.control),
            metadata=auth, timeout=120,
        )  # fmt: skip
    assert "did not send p3" in str(wrong.value.details())
    sb.Resume(pb.ResumeRequest(), metadata=auth)
    assert greedy(b) == before  # nothing changed

    assert load(sb, auth, source, "p2", a.control) == "p2"
    assert greedy(b) == greedy(a) != before
    assert "received a pushed version from a peer" in b.log.read_text()


@pytest.fixture(scope="module")
def tp2(launch: Any, tiny_v1: Path) -> Iterator[Any]:
    with launch(tiny_v1, "--dtype", "float64", "--tp", "2") as w:
        yield w


def test_a_worker_with_ranks_sends_the_push_it_serves_from_the_checkpoint_it_keeps(
    tp2: Any, pair: tuple[Any, Any], tiny_v2: Path, tiny_v1: Path
) -> None:
    """Its weights live in its ranks' shards: it sends the pushed version from the checkpoint
    its ranks loaded it from, kept while it serves it; a later checkpoint load takes its place."""
    _, b = pair
    auth = [("authorization", f"Bearer {tp2.token}")]
    st, sb = control(tp2), control(b)
    source = stage(st, auth, weights(tiny_v2), "t2")
    assert load(st, auth, source, "t2") == "t2"
    assert load(sb, auth, source, "t2", tp2.control) == "t2"
    assert greedy(b) == greedy(tp2)
    # back to a checkpoint: that directory is what it sends now
    assert load(st, auth, str(tiny_v1), "t3") == "t3"
    assert load(sb, auth, "push://t3", "t3", tp2.control) == "t3"
    assert greedy(b) == greedy(tp2)
