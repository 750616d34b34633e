"""A pushed version rebuilt from a peer, both sides in threads over a real gloo group: the
receiver hosts the store and stages exactly the peer's bytes; a peer that refuses ends the
rebuild at once (not at the group's timeout), and a model that does not fit is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from loom_runtime.errors import CheckpointError, TransferError
from loom_runtime.transfer.peer_rebuild import receive_from_peer, rendezvous, send_weights
from loom_trainer.group import Rendezvous
from loom_trainer.protocol import TensorSpec, spec_of

TIMEOUT_S = 20.0


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer.{i}.weight": torch.randn(96, 64, generator=g) for i in range(5)}


def sender_side(rv: Rendezvous) -> Rendezvous:
    """The peer's view of the receiver's rendezvous: rank 0, the receiver hosting the store."""
    return Rendezvous(rv.host, rv.port, 0, 2, rv.timeout_s, rv.update_id, rv.store_rank)


def test_the_receiver_stages_exactly_the_peers_tensors(tmp_path: Path) -> None:
    tensors = model()
    rv = rendezvous("127.0.0.1", "u7", TIMEOUT_S)
    expected = {n: spec_of(n, t) for n, t in tensors.items()}

    def send() -> None:
        send_weights(sender_side(rv), tensors, bucket_bytes=30_000)

    staged = receive_from_peer(rv, "v3", expected, send, tmp_path)
    try:
        got = {n: t.clone() for bucket in staged.tensors() for n, t in bucket.items()}
        assert staged.version == "v3" and staged.update_id == "u7" and len(staged.buckets) > 1
        assert got.keys() == tensors.keys()
        assert all(torch.equal(got[n], tensors[n]) for n in tensors)
    finally:
        staged.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_peer_that_refuses_ends_the_rebuild_at_once(tmp_path: Path) -> None:
    rv = rendezvous("127.0.0.1", "u8", TIMEOUT_S)
    expected = {n: spec_of(n, t) for n, t in model().items()}

    def refuse() -> None:
        raise TransferError("the peer serves v2, not v3")

    started = time.monotonic()
    with pytest.raises(TransferError, match="serves v2"):
        receive_from_peer(rv, "v3", expected, refuse, tmp_path)
    assert time.monotonic() - started < TIMEOUT_S / 2  # not the group's timeout


def test_weights_that_do_not_fit_the_model_are_refused_on_both_sides(tmp_path: Path) -> None:
    tensors = model()
    rv = rendezvous("127.0.0.1", "u9", TIMEOUT_S)
    expected = {n: spec_of(n, t) for n, t in tensors.items()}
    expected["layer.0.weight"] = TensorSpec("layer.0.weight", (64, 64), "float32")
    sent: list[BaseException] = []

    def ask() -> None:
        try:
            send_weights(sender_side(rv), tensors)
        except TransferError as exc:
            sent.append(exc)
            raise

    with pytest.raises((CheckpointError, TransferError)):
        receive_from_peer(rv, "v3", expected, ask, tmp_path)
    deadline = time.monotonic() + TIMEOUT_S
    while not sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sent and "layer.0.weight" in str(sent[0])
    assert list(tmp_path.iterdir()) == []
