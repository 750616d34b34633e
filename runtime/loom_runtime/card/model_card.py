"""The ModelCard: what a model is (components, loops, recipe, parity), group loom.dev/v1alpha1.

Owns the card's shape and runs its rules when it is built; never loads weights or reads files.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.functional_validators import ModelWrapValidatorHandler
from pydantic_core import PydanticCustomError

from loom_runtime.card import families
from loom_runtime.card.architecture import Architecture
from loom_runtime.card.base import (
    API_VERSION,
    DNS_LABEL_PATTERN,
    MAX_NAME,
    CardModel,
    ObjectMeta,
    cel_rules,
    list_map,
    list_set,
)
from loom_runtime.card.chat_parsers import ChatParsers
from loom_runtime.card.checks import validate_with_rules
from loom_runtime.card.component import Component
from loom_runtime.card.conditions import Condition
from loom_runtime.card.loop import MAX_COMPONENTS, Loop, Parity, Recipe
from loom_runtime.card.model_rules import SPEC_RULES
from loom_runtime.card.program import Program


def _registered_family(name: str) -> str:
    try:
        families.family(name)
    except families.UnknownFamilyError as exc:
        raise PydanticCustomError("unknown_family", str(exc)) from None
    return name


FamilyName = Annotated[
    str,
    AfterValidator(_registered_family),
    WithJsonSchema({"type": "string", "pattern": DNS_LABEL_PATTERN, "maxLength": MAX_NAME}),
]
"""A registered model family (card/families.py): the built-ins are llama, sparse-mla, dit, mot."""


class ModelCardSpec(CardModel):
    """What the model is: its weights, the loops that drive requests, how it was made."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.loops.exists(l, l.name == self.recipe.assumesLoop)",
                "recipe.assumesLoop must name a declared loop",
            ),
            (
                "self.loops.all(l, l.components.all(c, self.components.exists(x, x.name == c)))",
                "every component a loop lists must be declared in components",
            ),
        )
    )

    family: FamilyName
    """A registered model family: llama (GQA/RoPE/SwiGLU, optional MoE), sparse-mla (MLA +
    top-k indexer), dit, mot (one llama stack for text decoding and image denoising), or a
    plugin's (LOOM_PLUGINS)."""
    components: list[Component] = Field(
        min_length=1, max_length=MAX_COMPONENTS, json_schema_extra=list_map("name")
    )
    """The sets of weights the model is made of."""
    architecture: Architecture | None = None
    """Shape numbers for the capacity planner; the runtime reads config.json instead."""
    loops: list[Loop] = Field(min_length=1, max_length=16, json_schema_extra=list_map("name"))
    """The ways a request can be driven."""
    programs: list[Program] = Field(
        default_factory=list, max_length=8, json_schema_extra=list_map("name")
    )
    """Loops run in sequence inside one request (a mot model's think_then_draw). Needs the
    aggregated role: a program's loops hand KV over inside one worker."""
    recipe: Recipe
    """How the weights were made and what they assume."""
    parity: Parity = Field(default_factory=Parity)
    """Parity level proven against the reference implementation (default C1)."""
    capabilities: list[str] = Field(
        default_factory=list, max_length=32, json_schema_extra=list_set()
    )
    """Free-form features the model offers, e.g. chat, tools, reasoning."""
    chat: ChatParsers = Field(default_factory=ChatParsers)
    """Which parsers read tool calls and reasoning out of its chat output (default: the
    family's: llama3_json for llama, glm47 and glm45 for sparse-mla)."""

    @model_validator(mode="wrap")
    @classmethod
    def _check(
        cls, data: object, handler: ModelWrapValidatorHandler[ModelCardSpec]
    ) -> ModelCardSpec:
        return validate_with_rules(cls, data, handler, SPEC_RULES)


class ModelCardStatus(CardModel):
    """What the operator last observed about the card (written by the operator only)."""

    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation the status describes."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=8, json_schema_extra=list_map("type")
    )
    """Valid: whether the operator accepted the card, with every error in the message."""


class ModelCard(CardModel):
    """A ModelCard document (kind ModelCard, apiVersion loom.dev/v1alpha1)."""

    api_version: Literal["loom.dev/v1alpha1"] = API_VERSION
    kind: Literal["ModelCard"] = "ModelCard"
    metadata: ObjectMeta
    spec: ModelCardSpec
    status: ModelCardStatus | None = None

    @property
    def name(self) -> str:
        """metadata.name."""
        return self.metadata.name

    def component(self, name: str) -> Component:
        """The component called `name` (KeyError if there is none)."""
        for comp in self.spec.components:
            if comp.name == name:
                return comp
        raise KeyError(name)

    def loop(self, name: str) -> Loop:
        """The loop called `name` (KeyError if there is none)."""
        for loop in self.spec.loops:
            if loop.name == name:
                return loop
        raise KeyError(name)

    def program(self, name: str) -> Program:
        """The program called `name` (KeyError if there is none)."""
        for program in self.spec.programs:
            if program.name == name:
                return program
        raise KeyError(name)

    def shared_components(self) -> dict[str, tuple[str, ...]]:
        """Component name -> the loops that run it, for each component two or more loops list:
        a worker instantiates it once and hands all of those loops that one instance."""
        runs: dict[str, list[str]] = {}
        for loop in self.spec.loops:
            for name in loop.components:
                runs.setdefault(name, []).append(loop.name)
        return {name: tuple(loops) for name, loops in runs.items() if len(loops) > 1}

    def chat_parsers(self) -> ChatParsers:
        """The tool-call and reasoning parsers its chat output is read with: the card's
        `chat` section, else its family's."""
        own = self.spec.chat
        fam = families.family(self.spec.family)
        return ChatParsers(
            tool_call_parser=own.tool_call_parser or fam.tool_call_parser,
            reasoning_parser=own.reasoning_parser or fam.reasoning_parser,
        )

    def weights_versions(self) -> dict[str, str]:
        """Component name -> weightsVersion: what a worker of this card must report."""
        return {c.name: c.weights_version for c in self.spec.components}
