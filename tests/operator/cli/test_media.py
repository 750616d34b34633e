"""`loom image` / `loom video`: the request body from the flags, where n images are written, the
lines `loom up` prints for a diffusion fleet, and a clear error when nothing answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_operator.cli import build_parser
from loom_operator.cli.media import image_paths, request_body, run_video
from loom_operator.cli.up import try_lines


def test_flags_become_the_api_body() -> None:
    args = build_parser().parse_args(
        ["video", "a fox", "--size", "32x16", "--frames", "9", "--steps", "4", "--seed", "7"]
    )
    assert request_body(args, True) == {
        "prompt": "a fox", "size": "32x16", "num_inference_steps": 4, "seed": 7,
        "num_frames": 9, "fps": 16,
    }  # fmt: skip
    image = build_parser().parse_args(["image", "a fox", "-n", "2"])
    assert request_body(image, False) == {"prompt": "a fox", "size": "64x64", "n": 2}


def test_stage_flags_become_a_workflows_stage_options() -> None:
    args = build_parser().parse_args(
        ["video", "a fox", "--model", "flow", "--stage", "think.size=32x32",
         "--stage", "think.seed=3", "--stage", 'think.negative_prompt="fog"']
    )  # fmt: skip
    body = request_body(args, True)
    assert body["model"] == "flow"
    think = {"size": "32x32", "seed": 3, "negative_prompt": "fog"}
    assert body["stage_options"] == {"think": think}
    for bad in ("think=3", "think.size", ".size=3"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["video", "a fox", "--stage", bad])


def test_several_images_get_numbered_names() -> None:
    assert image_paths(Path("out/a.png"), 1) == [Path("out/a.png")]
    assert image_paths(Path("out/a.png"), 2) == [Path("out/a-1.png"), Path("out/a-2.png")]


def test_up_prints_media_commands_for_a_diffusion_fleet_and_curl_for_text() -> None:
    media = try_lines("http://h:1/v1", "m", True)
    assert [line.split()[:2] for line in media] == [["loom", "video"], ["loom", "image"]]
    assert all("--url http://h:1/v1" in line for line in media)
    assert try_lines("http://h:1/v1", "m", False)[0].startswith("  curl http://h:1/v1/completions")


def test_an_endpoint_that_does_not_answer_is_a_clear_error(capsys: object) -> None:
    args = build_parser().parse_args(["video", "x", "--url", "http://127.0.0.1:9/v1"])
    assert run_video(args) == 1
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "does not answer" in err and "loom up" in err
