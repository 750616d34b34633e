"""The checked-in control stubs are what `make proto` generates from control.proto, and import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"
GENERATED = ("control_pb2.py", "control_pb2.pyi", "control_pb2_grpc.py")


def test_checked_in_stubs_match_the_proto(tmp_path: Path) -> None:
    # protoc runs in its own process: grpc_tools' bundled protobuf C++ library and NIXL's
    # bindings abort the interpreter when both are loaded into one process.
    args = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{RUNTIME}",
        f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}", str(RUNTIME / "loom_runtime/control_api/control.proto"),
    ]  # fmt: skip
    assert subprocess.run(args, check=False).returncode == 0
    for name in GENERATED:
        fresh = (tmp_path / "loom_runtime/control_api" / name).read_text()
        checked_in = (RUNTIME / "loom_runtime/control_api" / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run `make proto`"


def test_stubs_import_with_the_installed_protobuf() -> None:
    from loom_runtime.control_api import control_pb2, control_pb2_grpc

    status = control_pb2.WorkerStatus(weights_version="v3", state=control_pb2.WORKER_STATE_PAUSED)
    again = control_pb2.WorkerStatus.FromString(status.SerializeToString())
    assert again.weights_version == "v3" and again.state == control_pb2.WORKER_STATE_PAUSED
    assert hasattr(control_pb2_grpc, "ControlStub")
    service = control_pb2.DESCRIPTOR.services_by_name["Control"]
    assert service.full_name == "loom.control.v1.Control"
    assert {m.name for m in service.methods} == {
        "Status", "WatchStatus", "Pause", "Resume", "LoadWeights", "ReceiveWeights",
        "SendWeights",
    }  # fmt: skip


def test_generated_grpc_code_imports_through_the_package() -> None:
    text = (RUNTIME / "loom_runtime/control_api/control_pb2_grpc.py").read_text()
    assert "from loom_runtime.control_api import control_pb2" in text


def test_the_operator_calls_with_the_same_messages() -> None:
    from loom_operator.control import client
    from loom_runtime.control_api import control_pb2

    assert client.pb is control_pb2
