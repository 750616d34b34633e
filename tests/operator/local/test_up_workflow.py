"""`loom up` runs a two-card workflow (examples/tiny-storyboard.yaml beside examples/tiny-mot.yaml,
each a real fleet: router + worker processes): each workflow is listed in /v1/models, runs each
stage as a full request on its own card's fleet, and every stage's output equals the same
request sent to that card directly (each stage keeps its parity). A stage's failure fails the
workflow, naming the stage."""

from __future__ import annotations

import base64
import io
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import openai
import pytest

from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_runtime.testing.processes import get_json, post

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "Draw a lighthouse at dusk."
THINK = {"size": "32x32", "seed": 3}
JOB_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def fleets(
    tmp_path_factory: pytest.TempPathFactory, child_env: dict[str, str]
) -> Iterator[tuple[FleetProcess, FleetProcess]]:
    """(the MoT fleet, the storyboard fleet): state directories side by side, as `loom up`
    keeps them under .loom/<deployment>."""
    root = tmp_path_factory.mktemp("up-workflow")
    states = root / "state"
    cards = {}
    for name in ("tiny-mot", "tiny-storyboard"):
        cards[name] = root / f"{name}.yaml"
        cards[name].write_text((ROOT / "examples" / f"{name}.yaml").read_text())
    with (
        run_fleet(cards["tiny-mot"], states / "tiny-mot", child_env) as mot,
        run_fleet(cards["tiny-storyboard"], states / "tiny-storyboard", child_env) as board,
    ):
        yield mot, board


def _client(fleet: FleetProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0)


def _finished(endpoint: str, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        status, job = get_json(f"{endpoint}/videos/{job_id}")
        assert status == 200, job
        if job["status"] in ("completed", "failed", "cancelled"):
            return dict(job)
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']}"
        time.sleep(0.3)


def _frames(endpoint: str, job_id: str) -> list[np.ndarray]:
    with urllib.request.urlopen(f"{endpoint}/videos/{job_id}/content", timeout=60) as resp:
        data = resp.read()
    with av.open(io.BytesIO(data), "r") as mp4:
        return [f.to_ndarray(format="rgb24") for f in mp4.decode(video=0)]


def test_the_workflows_are_listed_beside_the_model(
    fleets: tuple[FleetProcess, FleetProcess],
) -> None:
    with _client(fleets[1]) as client:
        ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny-video", "think-draw-animate", "think-then-paint"]


def test_an_image_workflow_equals_its_stages_sent_one_by_one(
    fleets: tuple[FleetProcess, FleetProcess],
) -> None:
    mot, board = fleets
    with _client(mot) as m, _client(board) as b:
        flow = b.images.generate(
            model="think-then-paint", prompt=PROMPT, size="32x32",
            extra_body={"seed": 5, "stage_options": {"think": THINK}},
        )  # fmt: skip
        think = m.images.generate(
            model="tiny-mot",
            prompt=PROMPT,
            size="32x32",
            extra_body=THINK,
        )
        thought = think.data[0].revised_prompt if think.data else None
        assert thought
        paint = b.images.generate(
            model="tiny-video", prompt=thought, size="32x32",
            extra_body={"seed": 5},
        )  # fmt: skip
    stages = flow.model_extra["stages"] if flow.model_extra else []
    assert [(s["name"], s["card"], s["status"]) for s in stages] == [
        ("think", "tiny-mot", "completed"),
        ("paint", "tiny-storyboard", "completed"),
    ]
    assert think.data is not None and paint.data is not None and flow.data is not None
    assert stages[0]["revised_prompt"] == thought
    assert stages[0]["b64_json"] == think.data[0].b64_json
    assert flow.data[0].b64_json == paint.data[0].b64_json
    assert base64.b64decode(flow.data[0].b64_json or "")[:4] == b"\x89PNG"


def test_a_video_workflow_equals_its_stages_sent_one_by_one(
    fleets: tuple[FleetProcess, FleetProcess],
) -> None:
    mot, board = fleets
    body = {"model": "think-draw-animate", "prompt": PROMPT, "size": "64x64", "num_frames": 5,
            "seed": 4, "stage_options": {"think": THINK}}  # fmt: skip
    status, created, _ = post(f"{board.endpoint}/videos", body)
    assert status == 202, created
    assert created["model"] == "think-draw-animate"
    job = _finished(board.endpoint, created["id"])
    assert job["status"] == "completed", job
    assert [(s["name"], s["status"]) for s in job["stages"]] == [
        ("think", "completed"), ("animate", "completed")
    ]  # fmt: skip
    thought = job["stages"][0]["revised_prompt"]
    status, think, _ = post(f"{mot.endpoint}/images/generations", {"prompt": PROMPT, **THINK})
    assert status == 200 and think["data"][0]["revised_prompt"] == thought
    plain = {"prompt": thought, "size": "64x64", "num_frames": 5, "seed": 4}
    status, direct, _ = post(f"{board.endpoint}/videos", plain)
    assert status == 202, direct
    assert _finished(board.endpoint, direct["id"])["status"] == "completed"
    ours, theirs = _frames(board.endpoint, job["id"]), _frames(board.endpoint, direct["id"])
    assert len(ours) == 5
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_stage_failure_fails_the_workflow_naming_the_stage(
    fleets: tuple[FleetProcess, FleetProcess],
) -> None:
    board = fleets[1].endpoint
    bad = {"prompt": PROMPT, "stage_options": {"think": {"size": "4000x4000"}}}
    status, created, _ = post(f"{board}/videos", {"model": "think-draw-animate", **bad})
    assert status == 202, created
    job = _finished(board, created["id"])
    assert job["status"] == "failed"
    assert "stage think (on tiny-mot) failed: 400" in job["error"]["message"]
    assert [s["status"] for s in job["stages"]] == ["failed", "queued"]
    status, reply, _ = post(f"{board}/images/generations", {"model": "think-then-paint", **bad})
    assert status == 400 and "stage think (on tiny-mot) failed" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stage_options": {"draw": {}}}, "stage_options.draw"),
        ({"stage_options": {"animate": {"size": "64x64"}}}, "stage_options.animate"),
        ({"stage_options": {"think": {"prompt": "x"}}}, "stage_options.think.prompt"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_what_a_workflow_request_cannot_carry_is_a_400(
    fleets: tuple[FleetProcess, FleetProcess], body: dict[str, Any], param: str
) -> None:
    request = {"model": "think-draw-animate", "prompt": PROMPT, **body}
    status, reply, _ = post(f"{fleets[1].endpoint}/videos", request)
    assert status == 400 and reply["error"]["param"] == param, reply
    status, reply, _ = post(f"{fleets[1].endpoint}/images/generations",
                            {**request, "model": "think-draw-animate"})  # fmt: skip
    assert status == 400 and reply["error"]["param"] == "model"  # a video workflow


def test_a_deleted_workflow_job_is_gone(fleets: tuple[FleetProcess, FleetProcess]) -> None:
    board = fleets[1].endpoint
    body = {"model": "think-draw-animate", "prompt": PROMPT, "size": "64x64", "num_frames": 5,
            "stage_options": {"think": THINK}}  # fmt: skip
    status, created, _ = post(f"{board}/videos", body)
    assert status == 202
    request = urllib.request.Request(f"{board}/videos/{created['id']}", method="DELETE")
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
    assert get_json(f"{board}/videos/{created['id']}")[0] == 404


def test_the_printed_workflow_lines_write_an_mp4_and_a_png(
    fleets: tuple[FleetProcess, FleetProcess], tmp_path: Path
) -> None:
    board = fleets[1]
    assert "Workflows (docs/composite.md): think-draw-animate, think-then-paint" in board.output()
    for flow, out in (("think-draw-animate", "mp4"), ("think-then-paint", "png")):
        line = next(ln.strip() for ln in board.output().splitlines()
                    if ln.strip().startswith("loom ") and f"--model {flow}" in ln)  # fmt: skip
        argv = [sys.executable, "-m", "loom_operator.cli", *shlex.split(line)[1:]]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env=dict(board.env))  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        written = (tmp_path / f"{flow}.{out}").read_bytes()
        assert written[4:8] == b"ftyp" if out == "mp4" else written[:4] == b"\x89PNG"


def test_a_stage_whose_card_stopped_fails_naming_it(
    fleets: tuple[FleetProcess, FleetProcess],
) -> None:
    """Last: it stops the MoT fleet."""
    mot, board = fleets
    mot.cleanup()
    status, reply, _ = post(f"{board.endpoint}/images/generations",
                            {"model": "think-then-paint", "prompt": PROMPT})  # fmt: skip
    assert status == 502
    assert "stage think (on tiny-mot) failed" in reply["error"]["message"]
    assert "did not answer" in reply["error"]["message"]
