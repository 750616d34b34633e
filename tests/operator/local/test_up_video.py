"""`loom up examples/tiny-video.yaml` end to end (router + two diffusion workers as real
processes): it prints `loom video` and `loom image` lines that work (an MP4 that decodes, a PNG),
and a weightsVersion edit of the card is a drain-correct weight sync of the diffusion workers
over their gRPC control service, after which they serve again."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
from PIL import Image

from loom_operator.testing.fleet import FleetProcess, run_fleet

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-video.yaml"
SETTLE_S = 180.0


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("up-video")
    card = root / "tiny-video.yaml"
    card.write_text(EXAMPLE.read_text())
    with run_fleet(card, root / "state", child_env) as f:
        yield f


def printed(fleet: FleetProcess, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `loom <command> …` line `loom up` printed (with this interpreter's loom)."""
    line = next(
        ln.strip() for ln in fleet.output().splitlines() if ln.strip().startswith(f"loom {command}")
    )
    argv = [sys.executable, "-m", "loom_operator.cli", *shlex.split(line)[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=dict(fleet.env))  # fmt: skip


def test_the_printed_video_line_writes_an_mp4_that_decodes(
    fleet: FleetProcess, tmp_path: Path
) -> None:
    ran = printed(fleet, "video", tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "wrote fox.mp4" in ran.stderr
    with av.open(str(tmp_path / "fox.mp4")) as mp4:
        frames = list(mp4.decode(video=0))
    assert len(frames) == 5 and (frames[0].width, frames[0].height) == (64, 64)


def test_the_printed_image_line_writes_a_png(fleet: FleetProcess, tmp_path: Path) -> None:
    ran = printed(fleet, "image", tmp_path)
    assert ran.returncode == 0, ran.stderr
    with Image.open(tmp_path / "lighthouse.png") as image:
        assert (image.format, image.size) == ("PNG", (64, 64))


def test_a_weights_version_edit_syncs_the_diffusion_workers(
    fleet: FleetProcess, tmp_path: Path
) -> None:
    assert {w.version for w in fleet.wait_settled(SETTLE_S).workers} == {"v1"}
    fleet.edit_card(EXAMPLE.read_text().replace("weightsVersion: v1", "weightsVersion: v2", 1))
    settled = fleet.wait_settled(SETTLE_S, version="v2")
    assert len(settled.workers) == 2
    assert {w.restarts for w in settled.workers} == {0}  # synced in place, not restarted
    ran = printed(fleet, "image", tmp_path)
    assert ran.returncode == 0, ran.stderr
