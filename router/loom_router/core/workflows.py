"""The workflows a router serves (ROUTER.json's `workflows`: a DeploymentCard's `spec.workflows`
with each stage's router resolved) and the pure steps of running one: the request's fields, each
stage's body, the prompt a stage hands on, and the job document clients poll.

Owns these shapes and rules; never sends a request (shell/workflow_proxy.py does).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from loom_router.errors import BadRequestError
from loom_runtime.card.workflow import StageRoute as Route
from loom_runtime.wire.openai.field_contract import CONTRACTS, refused_field

ROUTES: tuple[Route, ...] = get_args(Route)
REQUEST_FIELDS = frozenset({"model", "prompt", "stage_options"})
"""The workflow's own fields; the rest of a request is its last stage's."""
SET_BY_WORKFLOW = frozenset({"model", "prompt"})
JOB_PREFIX = "video_workflow_"
StageStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


@dataclass(frozen=True)
class Stage:
    name: str
    card: str
    """The DeploymentCard that runs it (for messages)."""
    route: Route
    url: str | None
    """Its router's base URL; None: this router."""


@dataclass(frozen=True)
class WorkflowRoute:
    """One workflow, as the router runs it."""

    name: str
    stages: tuple[Stage, ...]

    @property
    def route(self) -> Route:
        return self.stages[-1].route


def workflows_from_doc(raw: Any, problems: list[str]) -> tuple[WorkflowRoute, ...]:
    """ROUTER.json's `workflows` list; every problem appended to `problems`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append("workflows: must be a list")
        return ()
    out: list[WorkflowRoute] = []
    for i, item in enumerate(raw):
        where = f"workflows[{i}]"
        name = item.get("name") if isinstance(item, Mapping) else None
        stages = item.get("stages") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name or not isinstance(stages, list) or not stages:
            problems.append(f"{where}: an object with a name and a non-empty stages list")
            continue
        parsed = [_stage(s, f"{where}.stages[{j}]", problems) for j, s in enumerate(stages)]
        if all(s is not None for s in parsed):
            out.append(WorkflowRoute(name, tuple(s for s in parsed if s is not None)))
    names = [w.name for w in out]
    problems += [f"workflows: {n!r} twice" for i, n in enumerate(names) if n in names[:i]]
    return tuple(out)


def _stage(raw: Any, where: str, problems: list[str]) -> Stage | None:
    if not isinstance(raw, Mapping) or set(raw) - {"name", "card", "route", "url"}:
        problems.append(f'{where}: an object with only "name", "card", "route" and "url"')
        return None
    name, card, route, url = (raw.get(k) for k in ("name", "card", "route", "url"))
    if not isinstance(name, str) or not name or not isinstance(card, str) or not card:
        problems.append(f"{where}: name and card are non-empty strings")
        return None
    if route not in ROUTES:
        problems.append(f"{where}.route: one of {', '.join(ROUTES)}, got {route!r}")
        return None
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        problems.append(f"{where}.url: an http(s) URL or null (this router), got {url!r}")
        return None
    return Stage(name, card, route, None if url is None else url.rstrip("/"))


@dataclass(frozen=True)
class WorkflowRequest:
    """A client's request for a workflow, checked."""

    workflow: WorkflowRoute
    prompt: str
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per stage name: the fields its own request carries (its server checks them)."""


def _check_fields(route: Route, fields: Mapping[str, Any], prefix: str) -> None:
    """A field the route's contract refuses or does not name is a 400 now, before any stage
    runs (field_contract.py: the stage's server would refuse it after the stages before it)."""
    unnamed = [key for key in fields if key not in CONTRACTS[route]]
    if unnamed:
        param = prefix + unnamed[0]
        raise BadRequestError(f"{param}: unsupported field on /v1/{route}", param)
    refused = refused_field(route, fields)
    if refused is not None:
        raise BadRequestError(f"{prefix}{refused}", prefix + str(refused.param))


def parse_request(body: Mapping[str, Any], workflow: WorkflowRoute) -> WorkflowRequest:
    """The request's own fields (beside model, prompt and stage_options) are the last stage's:
    they shape the workflow's output; `stage_options` gives each earlier stage its fields. Each
    field is checked against its stage's route contract here, and its values by the stage's
    server. BadRequestError (400) names what cannot be sent."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequestError("prompt: required, a non-empty string", "prompt")
    options = body.get("stage_options", {})
    if not isinstance(options, Mapping):
        raise BadRequestError("stage_options: an object of stage name -> fields", "stage_options")
    *earlier, last = workflow.stages
    names = [s.name for s in earlier]
    for stage, fields in options.items():
        param = f"stage_options.{stage}"
        if stage not in names:
            why = (
                "the last stage takes the request's own fields"
                if stage == last.name
                else f"{workflow.name} has no stage {stage!r}"
            )
            raise BadRequestError(f"{param}: {why} (stage_options: {', '.join(names)})", param)
        if not isinstance(fields, Mapping):
            raise BadRequestError(f"{param}: an object of the stage's request fields", param)
        taken = [f"{param}.{f}" for f in sorted(set(fields) & SET_BY_WORKFLOW)]
        if taken:
            raise BadRequestError(f"{taken[0]}: the workflow sets it", taken[0])
        _check_fields(earlier[names.index(stage)].route, fields, f"{param}.")
    own = {k: v for k, v in body.items() if k not in REQUEST_FIELDS}
    _check_fields(last.route, own, "")
    return WorkflowRequest(workflow, prompt, {**{k: dict(v) for k, v in options.items()},
                                              last.name: own})  # fmt: skip


def stage_body(request: WorkflowRequest, stage: Stage, prompt: str) -> dict[str, Any]:
    """The stage's own request: its options plus the prompt the workflow hands it."""
    return {**request.options.get(stage.name, {}), "prompt": prompt}


def handed_on(reply: Any, prompt: str) -> tuple[str, dict[str, Any]]:
    """What an images stage's answer gives the next stage (its first image's `revised_prompt`,
    else the prompt it was given) and what the workflow's job keeps of it."""
    data = reply.get("data") if isinstance(reply, Mapping) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], Mapping) else {}
    revised = first.get("revised_prompt")
    text = revised if isinstance(revised, str) and revised else prompt
    kept = {k: first[k] for k in ("revised_prompt", "b64_json") if isinstance(first.get(k), str)}
    return text, kept


@dataclass(frozen=True)
class StageRecord:
    name: str
    card: str
    status: StageStatus = "queued"
    output: Mapping[str, Any] = field(default_factory=dict)
    """An images stage's revised_prompt and b64_json; a videos stage's job id."""
    error: str | None = None

    def doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "card": self.card, "status": self.status}
        out.update(self.output)
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class WorkflowJob:
    """A workflow video job: its stages so far, and the last stage's job once it started."""

    id: str
    workflow: str
    stages: tuple[StageRecord, ...]
    created_at: int
    final_job_id: str | None = None
    """The last stage's video job on this router."""
    error: str | None = None

    @classmethod
    def new(cls, workflow: WorkflowRoute) -> WorkflowJob:
        records = tuple(StageRecord(s.name, s.card) for s in workflow.stages)
        return cls(f"{JOB_PREFIX}{uuid.uuid4().hex}", workflow.name, records, int(time.time()))

    def with_stage(self, index: int, **changes: Any) -> WorkflowJob:
        stages = list(self.stages)
        stages[index] = dataclasses.replace(stages[index], **changes)
        return dataclasses.replace(self, stages=tuple(stages))

    def failed(self, index: int, why: str) -> WorkflowJob:
        """Stage `index` failed: so did the workflow, naming it."""
        stage = self.stages[index]
        message = f"workflow {self.workflow}: stage {stage.name} (on {stage.card}) failed: {why}"
        return dataclasses.replace(self.with_stage(index, status="failed", error=why),
                                   error=message)  # fmt: skip

    @property
    def status(self) -> StageStatus:
        if self.error is not None:
            return "failed"
        if any(s.status == "cancelled" for s in self.stages):
            return "cancelled"
        if all(s.status == "queued" for s in self.stages):
            return "queued"
        return "completed" if self.stages[-1].status == "completed" else "in_progress"

    def doc(self, final: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The job as clients see it: the last stage's video job (`final`, once started) under
        the workflow's id and model, with every stage's record."""
        out: dict[str, Any] = {"object": "video", "created_at": self.created_at,
                               **(final or {}), "id": self.id, "model": self.workflow}  # fmt: skip
        out["status"] = final.get("status", self.status) if final else self.status
        out["stages"] = [s.doc() for s in self.stages]
        if self.error is not None:
            out["error"] = {"message": self.error}
        return out
