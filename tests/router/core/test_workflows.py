"""The router's workflows, pure: ROUTER.json's `workflows`, what a request may carry (each wrong
field a 400 naming it, a field its stage's route contract refuses or does not name included,
before any stage runs), each stage's body, what an images stage hands on, and the job's states."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.workflows import (
    JOB_PREFIX,
    Stage,
    WorkflowJob,
    WorkflowRoute,
    handed_on,
    parse_request,
    stage_body,
    workflows_from_doc,
)
from loom_router.errors import BadRequestError

DOC = [{"name": "story", "stages": [
    {"name": "think", "card": "mot", "route": "images", "url": "http://mot:8000/"},
    {"name": "animate", "card": "wan", "route": "videos", "url": None},
]}]  # fmt: skip
FLOW = WorkflowRoute("story", (Stage("think", "mot", "images", "http://mot:8000"),
                               Stage("animate", "wan", "videos", None)))  # fmt: skip


def test_the_config_document_becomes_workflows() -> None:
    problems: list[str] = []
    assert workflows_from_doc(DOC, problems) == (FLOW,)
    assert problems == [] and FLOW.route == "videos"
    assert workflows_from_doc(None, problems) == ()


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({}, "workflows: must be a list"),
        ([{"name": "x"}], "a name and a non-empty stages list"),
        ([{"name": "x", "stages": [{"name": "a", "card": "c", "route": "audio", "url": None}]}],
         "route: one of images, videos"),
        ([{"name": "x", "stages": [{"name": "a", "card": "c", "route": "images", "url": "ftp:"}]}],
         "an http(s) URL or null"),
        ([{"name": "x", "stages": [{"name": "a", "card": "c", "route": "images", "extra": 1}]}],
         "only"),
        ([*DOC, *DOC], "'story' twice"),
    ],
)  # fmt: skip
def test_a_wrong_config_says_what(doc: Any, says: str) -> None:
    problems: list[str] = []
    workflows_from_doc(doc, problems)
    assert any(says in p for p in problems), problems


def test_the_requests_own_fields_are_the_last_stages() -> None:
    body = {"model": "story", "prompt": "a fox", "size": "64x64", "seed": 4,
            "stage_options": {"think": {"size": "32x32"}}}  # fmt: skip
    wanted = parse_request(body, FLOW)
    assert stage_body(wanted, FLOW.stages[0], "a fox") == {"size": "32x32", "prompt": "a fox"}
    assert stage_body(wanted, FLOW.stages[1], "thought") == {
        "size": "64x64", "seed": 4, "prompt": "thought"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "stage_options": []}, "stage_options"),
        ({"prompt": "x", "stage_options": {"draw": {}}}, "stage_options.draw"),
        ({"prompt": "x", "stage_options": {"animate": {}}}, "stage_options.animate"),
        ({"prompt": "x", "stage_options": {"think": 3}}, "stage_options.think"),
        ({"prompt": "x", "stage_options": {"think": {"model": "m"}}}, "stage_options.think.model"),
        ({"prompt": "x", "stage_options": {"think": {"style": "vivid"}}},
         "stage_options.think.style"),
        ({"prompt": "x", "stage_options": {"think": {"seconds": 2}}},
         "stage_options.think.seconds"),
        ({"prompt": "x", "input_reference": "img"}, "input_reference"),
        ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ],
)  # fmt: skip
def test_what_a_request_cannot_carry_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_request(body, FLOW)
    assert info.value.param == param


def test_an_images_stage_hands_on_its_thought_or_the_prompt() -> None:
    reply = {"data": [{"b64_json": "PNG", "revised_prompt": "a thought"}]}
    kept = {"revised_prompt": "a thought", "b64_json": "PNG"}
    assert handed_on(reply, "p") == ("a thought", kept)
    assert handed_on({"data": [{"b64_json": "PNG"}]}, "p") == ("p", {"b64_json": "PNG"})
    assert handed_on(None, "p") == ("p", {})


def test_a_job_shows_its_stages_and_names_the_one_that_failed() -> None:
    job = WorkflowJob.new(FLOW)
    assert job.id.startswith(JOB_PREFIX) and job.status == "queued"
    job = job.with_stage(0, status="in_progress")
    assert job.status == "in_progress"
    failed = job.failed(0, "400: too big")
    assert failed.status == "failed"
    doc = failed.doc()
    assert doc["error"]["message"] == "workflow story: stage think (on mot) failed: 400: too big"
    assert [s["status"] for s in doc["stages"]] == ["failed", "queued"]


def test_a_started_last_stage_speaks_for_the_job_under_the_workflows_id() -> None:
    job = WorkflowJob.new(FLOW).with_stage(0, status="completed", output={"revised_prompt": "t"})
    final = {"id": "video_x", "model": "tiny-video", "status": "in_progress", "steps_done": 3}
    doc = job.doc(final)
    assert (doc["id"], doc["model"], doc["status"], doc["steps_done"]) == (
        job.id, "story", "in_progress", 3
    )  # fmt: skip
    assert doc["stages"][0] == {"name": "think", "card": "mot", "status": "completed",
                                "revised_prompt": "t"}  # fmt: skip
