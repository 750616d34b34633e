"""A trainer pushes in mode keep into a real `loom up` fleet of the tiny model (one aggregated
worker, and a P/D fleet of a prefill and a decode worker; fp64): a greedy stream in flight goes
on across the swap and fails nothing; its record holds two version spans split at the first
token of the new weights, the tokens before equal the old weights' greedy run, and with
kv="recompute" the tokens after equal a fresh greedy run of the new weights over prompt + the
tokens before. A keep push that does not fit is refused whole, and a trainer killed mid-push
leaves the old version serving (docs/rl.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.trainer.test_push_fleet import (
    connect,
    current_version,
    kill_a_trainer_after_its_first_bucket,
    next_version,
    served_version,
    weights_of,
)

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet, wait_for
from loom_runtime.testing.processes import post
from loom_runtime.testing.record_stream import RecordStream
from loom_trainer import PushRefused
from loom_trainer.client import KV

MODEL = "tiny"
PROMPT = list(range(300, 320))
MAX_TOKENS = 1000  # long enough to be in flight when the swap comes (asserted, not assumed)
BUCKET = 16 << 20


def keep_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
    name: str,
    roles: dict[str, int] | None = None,
) -> Iterator[FleetProcess]:
    """A fleet of `roles` (default one aggregated worker) on the first checkpoint; long enough
    requests for a stream to be in flight across a swap."""
    root = tmp_path_factory.mktemp(name)
    card = root / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", roles=roles, name=name,
                              health_timeout=60.0, max_model_len=1100))  # fmt: skip
    with run_fleet(card, root / "state", child_env) as f:
        yield f


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    yield from keep_fleet(tmp_path_factory, checkpoints, child_env, "push-keep")


def greedy(fleet: FleetProcess, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    status, answer, _ = post(fleet.endpoint + "/completions", body, timeout=300)
    assert status == 200, answer
    return list(answer["choices"][0]["token_ids"])


def open_stream(fleet: FleetProcess) -> RecordStream:
    """A greedy stream with a behaviour record through the router."""
    doc = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
           "ignore_eos": True, "return_behaviour": True}  # fmt: skip
    return RecordStream(fleet.endpoint + "/completions", doc)


@pytest.fixture(scope="module")
def pd_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    """A prefill and a decode worker; every prompt is prefilled remotely (minUncachedTokens 0)."""
    roles = {"prefill": 1, "decode": 1}
    yield from keep_fleet(tmp_path_factory, checkpoints, child_env, "push-keep-pd", roles)


@pytest.mark.parametrize(("kv", "which"), [("recompute", 1), ("keep", 0)])
def test_a_greedy_stream_goes_on_across_a_keep_push(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], kv: KV, which: int
) -> None:
    stream_across_a_keep_push(fleet, checkpoints, kv, which)


@pytest.mark.parametrize(("kv", "which"), [("recompute", 1), ("keep", 0)])
def test_a_p_d_stream_goes_on_across_a_keep_push_of_both_roles(
    pd_fleet: FleetProcess, checkpoints: tuple[Path, Path], kv: KV, which: int
) -> None:
    stream = stream_across_a_keep_push(pd_fleet, checkpoints, kv, which)
    assert stream.headers.get("x-loom-pd") == "remote-prefill"  # its KV came from the prefill


def stream_across_a_keep_push(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], kv: KV, which: int
) -> RecordStream:
    """A greedy stream held open across a keep push of checkpoint `which` (the one the fleet
    does not serve), checked span by span; the stream, for what else a test checks."""
    before = current_version(fleet)
    old = greedy(fleet, PROMPT, MAX_TOKENS)
    version = next_version(fleet)
    streams: list[RecordStream] = []

    def start_stream_after_the_last_bucket(index: int, count: int) -> None:
        if index == count - 1:  # the bytes have moved: the swap comes next
            streams.append(open_stream(fleet))
            assert streams[0].first_token.wait(120)

    tensors = weights_of(checkpoints[which])
    on_bucket = start_stream_after_the_last_bucket
    connect(fleet).push(
        tensors, version, mode="keep", kv=kv, bucket_bytes=BUCKET, on_bucket=on_bucket
    )
    ids, spans, finish = streams[0].result()
    assert finish == "length" and len(ids) == MAX_TOKENS  # nothing failed or was cut
    assert len(spans) == 2, spans
    k = spans[0]["end"]
    assert spans == [
        {"version": before, "start": 0, "end": k},
        {"version": version, "start": k, "end": MAX_TOKENS},
    ]
    assert 0 < k < MAX_TOKENS and ids[:k] == old[:k]
    fleet.wait_settled(120, version)
    assert served_version(fleet) == version
    if kv == "recompute":
        assert ids[k:] == greedy(fleet, PROMPT + ids[:k], MAX_TOKENS - k)
    return streams[0]


def test_a_keep_push_that_does_not_fit_is_refused_whole(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    version = current_version(fleet)
    bad = weights_of(checkpoints[1])
    name = "model.layers.1.mlp.up_proj.weight"
    bad[name] = torch.zeros(bad[name].shape[0], bad[name].shape[1] + 1, dtype=torch.float64)
    with pytest.raises(PushRefused, match="shape") as refused:
        connect(fleet).push(bad, next_version(fleet), mode="keep", bucket_bytes=BUCKET)
    assert list(refused.value.problems) == ["push-keep-aggregated-0"]
    assert current_version(fleet) == version and served_version(fleet) == version


def test_a_trainer_killed_mid_keep_push_leaves_the_last_version(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    version = current_version(fleet)
    sync = connect(fleet)
    kill_a_trainer_after_its_first_bucket(fleet, checkpoints[1], child_env, tmp_path, "keep")

    def failed() -> bool:
        doc = sync.latest()
        return doc is not None and doc["state"] == "failed" and doc["mode"] == "keep"

    wait_for(failed, 120, "the killed trainer's keep push to fail")
    assert current_version(fleet) == version and served_version(fleet) == version
    after = next_version(fleet)
    sync.push(weights_of(checkpoints[0]), after, mode="keep", bucket_bytes=BUCKET)
    fleet.wait_settled(120, after)
    assert served_version(fleet) == after
