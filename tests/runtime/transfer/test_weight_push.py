"""A worker's side of a push against a real trainer side, in threads over a real gloo group:
every worker stages the same bytes one bucket at a time, a manifest that does not fit is
refused before any byte moves, and a trainer that stops mid-push leaves nothing staged."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import torch

from loom_operator.local.ports import free_ports
from loom_runtime.errors import CheckpointError, TransferError
from loom_runtime.transfer.weight_push import StagedPush, receive_push
from loom_trainer.errors import PushRefused
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.protocol import PIECE_BYTES, Bucket, TensorSpec, plan_buckets, spec_of
from loom_trainer.sender import send_push

WORKERS = ("w-a", "w-b")
TIMEOUT_S = 20.0


def model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"layer.{i}.weight": torch.randn(64, 64, generator=g) for i in range(6)}


def run_push(
    tensors: Mapping[str, torch.Tensor],
    expected: list[Mapping[str, TensorSpec]],
    staging: Path,
    bucket_bytes: int,
    on_bucket: Callable[[int, int], None] | None = None,
    refusals: tuple[str, ...] = (),
) -> tuple[BaseException | None, list[StagedPush | BaseException]]:
    """The trainer (rank 0) and one worker per `expected` entry, each in a thread."""
    port = free_ports(1)[0]
    world = len(expected) + 1
    results: list[StagedPush | BaseException] = [RuntimeError("not run")] * len(expected)
    trainer_error: list[BaseException | None] = [None]

    def worker(i: int) -> None:
        rv = Rendezvous("127.0.0.1", port, i + 1, world, TIMEOUT_S, "u1")
        try:
            refusal = refusals[i] if i < len(refusals) else ""
            results[i] = receive_push(rv, "v2", expected[i], staging, refusal)
        except BaseException as exc:
            results[i] = exc

    def trainer() -> None:
        try:
            group = TransferGroup(Rendezvous("127.0.0.1", port, 0, world, TIMEOUT_S, "u1"))
            specs = [spec_of(n, t) for n, t in tensors.items()]
            send_push(group, WORKERS[: len(expected)], plan_buckets(specs, bucket_bytes),
                      tensors, on_bucket)  # fmt: skip
        except BaseException as exc:
            trainer_error[0] = exc

    threads = [threading.Thread(target=trainer)]
    threads += [threading.Thread(target=worker, args=(i,)) for i in range(len(expected))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * TIMEOUT_S)
    return trainer_error[0], results


def test_every_worker_stages_the_same_bytes_one_bucket_at_a_time(tmp_path: Path) -> None:
    tensors = model()
    expected = {n: spec_of(n, t) for n, t in tensors.items()}
    bucket = 3 * 64 * 64 * 4  # three tensors a bucket: two buckets
    err, results = run_push(tensors, [expected, expected], tmp_path, bucket)
    assert err is None
    for staged in results:
        assert isinstance(staged, StagedPush), staged
        assert len(staged.buckets) == 2 and staged.largest_bucket == bucket
        got = {n: t.clone() for part in staged.tensors() for n, t in part.items()}
        assert got.keys() == tensors.keys()
        assert all(torch.equal(got[n], tensors[n]) for n in tensors)
        staged.discard()
    assert list(tmp_path.iterdir()) == []


def test_tensors_larger_than_a_piece_odd_sizes_and_empty_ones_arrive_whole(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {
        "big": torch.randn(PIECE_BYTES // 4 + 1000, generator=g),  # two pieces
        "odd": torch.randn(3, generator=g, dtype=torch.float64),  # padding after it
        "empty": torch.zeros(0),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "last_empty": torch.zeros(0, 4),
    }
    expected = {n: spec_of(n, t) for n, t in tensors.items()}
    err, results = run_push(tensors, [expected, expected], tmp_path, 2 * PIECE_BYTES)
    assert err is None
    for staged in results:
        assert isinstance(staged, StagedPush), staged
        got = {n: t.clone() for part in staged.tensors() for n, t in part.items()}
        assert got.keys() == tensors.keys()
        assert all(torch.equal(got[n], t) and got[n].dtype == t.dtype for n, t in tensors.items())
        staged.discard()


def test_a_manifest_that_does_not_fit_one_worker_is_refused_everywhere_before_bytes_move(
    tmp_path: Path,
) -> None:
    tensors = model()
    good = {n: spec_of(n, t) for n, t in tensors.items()}
    bad = dict(good, **{"layer.0.weight": TensorSpec("layer.0.weight", (64, 32), "float32")})
    sent: list[int] = []
    err, results = run_push(tensors, [good, bad], tmp_path, 1 << 20, lambda i, n: sent.append(i))
    assert isinstance(err, PushRefused)
    assert err.problems == {"w-b": ["shape: layer.0.weight (64, 64) != (64, 32)"]}
    assert all(isinstance(r, CheckpointError) for r in results), results
    assert sent == [] and list(tmp_path.iterdir()) == []


def test_a_worker_that_takes_no_push_tells_the_trainer_why_before_bytes_move(
    tmp_path: Path,
) -> None:
    tensors = model()
    good = {n: spec_of(n, t) for n, t in tensors.items()}
    why = "WanTransformer does not list its tensors (targets()): pushing weights into this model "
    why += "family is not built"
    err, results = run_push(tensors, [good, {}], tmp_path, 1 << 20, refusals=("", why))
    assert isinstance(err, PushRefused) and err.problems == {"w-b": [why]}
    assert all(isinstance(r, CheckpointError) for r in results), results
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_of_another_format_is_refused_before_bytes_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer of another Loom version (its manifest a bare list of buckets, as before the
    data path): every worker refuses, naming why, instead of failing on the bytes."""

    def older(buckets: Sequence[Bucket], path: object) -> bytes:
        return json.dumps(
            [[[s.name, list(s.shape), s.dtype] for s in b.specs] for b in buckets]
        ).encode()

    monkeypatch.setattr("loom_trainer.sender.encode_manifest", older)
    tensors = model()
    good = {n: spec_of(n, t) for n, t in tensors.items()}
    err, results = run_push(tensors, [good, good], tmp_path, 1 << 20)
    assert isinstance(err, PushRefused)
    assert set(err.problems) == set(WORKERS)
    assert all("not this worker's format" in p[0] for p in err.problems.values())
    assert all(isinstance(r, CheckpointError) for r in results), results
    assert list(tmp_path.iterdir()) == []


def test_a_trainer_that_stops_after_the_first_bucket_leaves_nothing_staged(
    tmp_path: Path,
) -> None:
    tensors = model()
    expected = {n: spec_of(n, t) for n, t in tensors.items()}

    def die(index: int, count: int) -> None:
        raise KeyboardInterrupt("the trainer stops")

    err, results = run_push(tensors, [expected, expected], tmp_path, 64 * 64 * 4, die)
    assert isinstance(err, KeyboardInterrupt)
    assert all(isinstance(r, TransferError) for r in results), results
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bucket_bytes", [64 * 64 * 4, 1 << 20])
def test_the_extra_memory_of_a_push_is_one_bucket(tmp_path: Path, bucket_bytes: int) -> None:
    tensors = model()
    expected = {n: spec_of(n, t) for n, t in tensors.items()}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    err, results = run_push(tensors, [expected], tmp_path, bucket_bytes)
    (staged,) = results
    assert err is None and isinstance(staged, StagedPush)
    assert staged.largest_bucket == min(bucket_bytes, total)
    staged.discard()


def test_a_staged_push_no_one_swaps_in_is_removed_when_the_worker_exits(tmp_path: Path) -> None:
    """A push staged and never loaded (the worker stops first) leaves no folder behind."""
    script = f"""
import sys
from pathlib import Path
sys.path[:0] = {sys.path!r}
from tests.runtime.transfer.test_weight_push import model, run_push
from loom_trainer.protocol import spec_of
tensors = model()
expected = {{n: spec_of(n, t) for n, t in tensors.items()}}
_, results = run_push(tensors, [expected], Path({str(tmp_path)!r}), 8192)
KEPT = results[0]  # held until the interpreter exits, as a worker's PushReceiver holds it
print(KEPT.directory, KEPT.bucket_file(0).exists())
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    directory, existed = out.stdout.split()
    assert existed == "True"
    assert not Path(directory).exists()
    assert list(tmp_path.iterdir()) == []
