"""The diffusion worker under the control service: its status numbers, drain, and a whole-checkpoint
LoadWeights that swaps only the components whose files changed — so a DiT-only sync keeps the
text-feature cache (hits counted) and an encoder sync drops it — and the gRPC service itself on a
served worker (Status, Pause, LoadWeights, Resume)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.control_api import control_pb2_grpc
from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import ComponentVersions, DiffusionEngineConfig
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.errors import AdmissionError, CheckpointError
from loom_runtime.models.wan.loader import load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.serve.diffusion.control import (
    DiffusionControl,
    changed_components,
    checkpoint_digests,
)
from loom_runtime.testing.processes import WAN_CARD, free_ports, spawn

PROMPT = (5, 17, 33, 2)
TOKEN = "diffusion-control-token"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base; dit: base with another DiT; enc: base with another text encoder."""
    tmp = tmp_path_factory.mktemp("wan-ckpts")
    base = init_tiny_wan(tmp / "base")
    other = init_tiny_wan(tmp / "other", seed=1)
    made = {"base": base}
    for name, component in (("dit", "transformer"), ("enc", "text_encoder")):
        made[name] = tmp / name
        shutil.copytree(base, made[name])
        shutil.rmtree(made[name] / component)
        shutil.copytree(other / component, made[name] / component)
    return made


def test_digests_see_exactly_the_component_that_changed(checkpoints: dict[str, Path]) -> None:
    base = checkpoint_digests(checkpoints["base"])
    assert changed_components(base, checkpoint_digests(checkpoints["base"])) == []
    assert changed_components(base, checkpoint_digests(checkpoints["dit"])) == ["transformer"]
    assert changed_components(base, checkpoint_digests(checkpoints["enc"])) == ["text_encoder"]


def test_a_folder_that_is_not_a_wan_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "transformer").mkdir()
    with pytest.raises(CheckpointError, match="no text_encoder, vae folder"):
        checkpoint_digests(tmp_path)


def _control(root: Path) -> DiffusionControl:
    config = DiffusionEngineConfig(text_len=16, default_steps=2, versions=ComponentVersions())
    return DiffusionControl(DiffusionEngine(load_wan(root), config), root, "v1")


def _generate(engine: DiffusionEngine, rid: str) -> DiffusionOutput:
    outs: list[DiffusionOutput] = []
    engine.add_request(DiffusionRequest(rid, PROMPT, 32, 32, 1, seed=1), outs.append)
    for _ in range(50):
        if outs:
            return outs[0]
        engine.step()
    raise AssertionError("the request did not finish")


def _sync(control: DiffusionControl, root: Path, version: str) -> None:
    assert control.pause("wait", 10)
    control.load_weights(str(root), version)
    control.resume()


def test_a_dit_sync_keeps_encoder_hits_and_an_encoder_sync_drops_them(
    checkpoints: dict[str, Path],
) -> None:
    control = _control(checkpoints["base"])
    engine = control.engine
    before = _generate(engine, "a")
    assert (engine.features.hits, engine.features.misses) == (0, 1)

    _sync(control, checkpoints["dit"], "v2")
    assert engine.versions == ComponentVersions("v2", "v1", "v1")
    assert control.weights_version == control.stats().weights_version == "v2"
    after_dit = _generate(engine, "b")
    assert (engine.features.hits, engine.features.misses) == (1, 1)  # the prompt's rows kept
    assert not (after_dit.frames == before.frames).all()  # and the new DiT really runs

    _sync(control, checkpoints["enc"], "v3")  # DiT back to base, encoder new: both change
    assert engine.versions == ComponentVersions("v3", "v3", "v1")
    _generate(engine, "c")
    assert (engine.features.hits, engine.features.misses) == (1, 2)  # encoded again


def test_load_weights_needs_a_drained_engine(checkpoints: dict[str, Path]) -> None:
    control = _control(checkpoints["base"])
    with pytest.raises(AdmissionError, match="pause"):
        control.load_weights(str(checkpoints["dit"]), "v2")
    assert control.weights_version == "v1" and control.engine.versions.transformer == "v1"


def test_status_numbers_stand_for_the_memory_budget(checkpoints: dict[str, Path]) -> None:
    control = _control(checkpoints["base"])
    engine = control.engine
    req = DiffusionRequest("m", PROMPT, 32, 32, 5, seed=1)
    engine.add_request(req, lambda _: None)
    engine.step()  # admitted: its peak is reserved
    s = control.stats()
    assert (s.num_running, s.num_waiting, s.num_blocks, s.block_size) == (1, 0, 0, 0)
    assert s.kv_usage == pytest.approx(engine.peak_bytes(req) / engine.config.memory_budget_bytes)
    assert control.in_flight() == 1
    assert control.pause("abort", 10) and control.stats().num_requests_aborted == 1


@pytest.fixture(scope="module")
def served(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[control_pb2_grpc.ControlStub]:
    tmp = tmp_path_factory.mktemp("ctl")
    card = tmp / "card.yaml"
    card.write_text(WAN_CARD.format(name="wan-ctl", path=checkpoints["base"], steps=2))
    http, control = free_ports(2)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card), "--port", str(http),
        "--control-port", str(control), "--control-token", TOKEN, "--text-len", "16",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    with (
        spawn("diffusion-ctl", cmd, tmp / "worker.log", url, "/ready"),
        grpc.insecure_channel(f"127.0.0.1:{control}") as channel,
    ):
        yield control_pb2_grpc.ControlStub(channel)


def _call(stub: control_pb2_grpc.ControlStub, method: str, request: object) -> pb.WorkerStatus:
    reply: pb.WorkerStatus = getattr(stub, method)(
        request, metadata=[("authorization", f"Bearer {TOKEN}")], timeout=60
    )
    return reply


def test_the_served_worker_answers_the_control_calls_of_a_weight_sync(
    served: control_pb2_grpc.ControlStub, checkpoints: dict[str, Path]
) -> None:
    status = _call(served, "Status", pb.StatusRequest())
    shown = (status.model_name, status.role, status.weights_version)
    assert shown == ("wan-ctl", "aggregated", "v1")
    assert status.state == pb.WORKER_STATE_SERVING and status.admission_open
    load = pb.LoadWeightsRequest(source=str(checkpoints["dit"]), version="v2")
    with pytest.raises(grpc.RpcError) as refused:
        _call(served, "LoadWeights", load)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _call(served, "Pause", pb.PauseRequest()).state == pb.WORKER_STATE_PAUSED
    loaded = _call(served, "LoadWeights", load)
    assert loaded.weights_version == "v2" and loaded.state == pb.WORKER_STATE_PAUSED
    resumed = _call(served, "Resume", pb.ResumeRequest())
    assert resumed.state == pb.WORKER_STATE_SERVING and resumed.weights_version == "v2"


def test_a_call_without_the_token_is_refused(served: control_pb2_grpc.ControlStub) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.Status(pb.StatusRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
