"""The operator's copy of the control messages is the runtime's proto, compiled: same file, same
bytes — so both load into one process, and `make proto` keeps them in step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loom_operator.control import control_pb2 as operator_pb

ROOT = Path(__file__).resolve().parents[3]


def test_operator_stubs_match_the_runtime_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'runtime'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         str(ROOT / "runtime/loom_runtime/serve/control.proto")],
        check=True,
    )  # fmt: skip
    fresh = tmp_path / "loom_runtime/serve"
    ours = ROOT / "operator/loom_operator/control"
    for name in ("control_pb2.py", "control_pb2.pyi"):
        assert (ours / name).read_text() == (fresh / name).read_text(), f"run `make proto` ({name})"
    assert operator_pb.DESCRIPTOR.name == "loom_runtime/serve/control.proto"  # both copies' name


def test_both_copies_load_into_one_process() -> None:
    from loom_runtime.serve import control_pb2 as runtime_pb

    assert runtime_pb.WorkerStatus is operator_pb.WorkerStatus  # type: ignore[comparison-overlap]
