"""The workflows of a DeploymentCard: named servables composed of several cards' requests, each
stage a full request on its own card's fleet, the text one stage returns prompting the next.

Owns these declarations and their rules; never runs a stage (the router's
shell/workflow_proxy.py does) and never resolves where a card is served (the substrates do).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from loom_runtime.card.base import CardModel, DnsName, cel_rules, list_map
from loom_runtime.card.checks import raise_for

StageRoute = Literal["images", "videos"]
MAX_STAGES = 8
MAX_WORKFLOWS = 8


class WorkflowStage(CardModel):
    """One stage: a request to one card's router."""

    name: DnsName
    """Unique within the workflow; errors and the job's `stages` name it."""
    deployment_card: DnsName | None = None
    """The DeploymentCard (same namespace) whose fleet runs the stage; unset: this card. The
    last stage runs on this card, whose router serves the workflow."""
    route: StageRoute
    """images: /v1/images/generations (a diffusion model, or a card's think-then-draw program,
    whose thought comes back as `revised_prompt`) | videos: the /v1/videos job API."""


class Workflow(CardModel):
    """A servable listed in /v1/models beside the card's model. A request names it as its
    `model`; stage 1 gets the request's prompt, each later stage the text the stage before it
    returned (a program's `revised_prompt`, else the prompt it was given). It is served on the
    last stage's route: a video job, or an image answer."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.stages[size(self.stages) - 1].deploymentCard)",
                "the last stage runs on this card (no deploymentCard)",
            ),
            (
                "self.stages.all(s, s.name == self.stages[size(self.stages) - 1].name"
                " || s.route == 'images')",
                "every stage before the last is an images stage",
            ),
        )
    )

    name: DnsName
    """The model id clients send; unique within the card and unlike the card's model."""
    stages: list[WorkflowStage] = Field(
        min_length=2, max_length=MAX_STAGES, json_schema_extra=list_map("name")
    )
    """Run in order; a stage's failure fails the workflow, naming the stage."""

    @model_validator(mode="after")
    def _check(self) -> Workflow:
        problems = []
        *before, last = self.stages
        if last.deployment_card is not None:
            msg = "the last stage runs on this card, whose router serves the workflow: drop it"
            problems.append((("stages", len(before), "deploymentCard"), "last_stage_here", msg))
        for i, stage in enumerate(before):
            if stage.route != "images":
                msg = "a stage before the last is an images stage: its text prompts the next"
                problems.append((("stages", i, "route"), "feeds_text", msg))
        names = [s.name for s in self.stages]
        for i, name in enumerate(names):
            if name in names[:i]:
                problems.append((("stages", i, "name"), "duplicate", f"stage {name!r} twice"))
        raise_for("Workflow", problems)
        return self

    @property
    def route(self) -> StageRoute:
        """The route the workflow is served on: its last stage's."""
        return self.stages[-1].route

    def cards(self) -> tuple[str, ...]:
        """The other DeploymentCards its stages run on, in order, each once."""
        return tuple(dict.fromkeys(s.deployment_card for s in self.stages if s.deployment_card))
