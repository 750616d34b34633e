"""Cross-reference rules of a ModelCard spec: loops, components, recipe and family must agree.

Pure: reads a parsed spec and lists every problem with its path; never raises or prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from loom_runtime.card import families
from loom_runtime.card.checks import Rule
from loom_runtime.card.errors import Problem

if TYPE_CHECKING:
    from loom_runtime.card.model_card import ModelCardSpec


def _duplicates(field: str, names: Sequence[str]) -> list[Problem]:
    seen: set[str] = set()
    problems: list[Problem] = []
    for i, name in enumerate(names):
        if name in seen:
            msg = f"another entry of {field} is already named {name!r}"
            problems.append(((field, i, "name"), "duplicate", msg))
        seen.add(name)
    return problems


def _declared(names: Sequence[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def component_problems(spec: ModelCardSpec) -> list[Problem]:
    """Loops named by components exist, and a component required by a loop is listed by it."""
    loops = {loop.name: loop for loop in spec.loops}
    problems: list[Problem] = []
    for i, comp in enumerate(spec.components):
        lists = (("requiredFor", comp.required_for), ("optionalFor", comp.optional_for))
        for field, names in lists:
            for j, name in enumerate(names):
                loop = loops.get(name)
                if loop is None:
                    msg = f"no loop named {name!r} (declared: {_declared(list(loops))})"
                    problems.append((("components", i, field, j), "unknown_loop", msg))
                elif field == "requiredFor" and comp.name not in loop.components:
                    msg = f"loop {name!r} does not list component {comp.name!r} it requires"
                    problems.append((("components", i, field, j), "not_in_loop", msg))
        for j, name in enumerate(comp.optional_for):
            if name in comp.required_for:
                msg = f"{comp.name!r} cannot be both required and optional for loop {name!r}"
                problems.append((("components", i, "optionalFor", j), "conflict", msg))
    return problems


def loop_problems(spec: ModelCardSpec) -> list[Problem]:
    """Loops use declared components, and their kind, steps and cache fit the family."""
    components = {c.name: c for c in spec.components}
    allowed = families.family(spec.family).loops
    problems: list[Problem] = []
    for i, loop in enumerate(spec.loops):
        for j, name in enumerate(loop.components):
            if name not in components:
                msg = f"no component named {name!r} (declared: {_declared(list(components))})"
                problems.append((("loops", i, "components", j), "unknown_component", msg))
        if loop.kind not in allowed:
            msg = f"a {spec.family} model runs {' or '.join(allowed)} loops, not {loop.kind}"
            problems.append((("loops", i, "kind"), "wrong_loop_kind", msg))
        if loop.steps is not None and loop.kind != "diffusion":
            msg = f"only diffusion loops take steps ({loop.name!r} is {loop.kind})"
            problems.append((("loops", i, "steps"), "steps_not_allowed", msg))
        if loop.cache_policy == "prefix" and loop.kind != "ar_decode":
            msg = f"prefix caching is for ar_decode loops ({loop.name!r} is {loop.kind})"
            problems.append((("loops", i, "cachePolicy"), "cache_not_allowed", msg))
    return problems


def recipe_loop_problems(spec: ModelCardSpec) -> list[Problem]:
    """The recipe's loop exists and runs the steps the recipe assumes."""
    recipe = spec.recipe
    loops = {loop.name: loop for loop in spec.loops}
    loop = loops.get(recipe.assumes_loop)
    if loop is None:
        msg = f"no loop named {recipe.assumes_loop!r} (declared: {_declared(list(loops))})"
        return [(("recipe", "assumesLoop"), "unknown_loop", msg)]
    problems: list[Problem] = []
    if recipe.steps is not None and loop.kind != "diffusion":
        msg = f"recipe steps need a diffusion loop ({loop.name!r} is {loop.kind})"
        problems.append((("recipe", "steps"), "steps_not_allowed", msg))
    elif recipe.steps is not None and loop.steps is not None and recipe.steps != loop.steps:
        msg = (
            f"the recipe needs {recipe.steps} steps but loop {loop.name!r} runs {loop.steps}: "
            f"a {recipe.method} model must be served with the steps it was made for"
        )
        problems.append((("recipe", "steps"), "step_mismatch", msg))
    return problems


def recipe_precision_problems(spec: ModelCardSpec) -> list[Problem]:
    """The transformers of the recipe's loop load the weight format the recipe assumes."""
    recipe = spec.recipe
    loop = next((lp for lp in spec.loops if lp.name == recipe.assumes_loop), None)
    if loop is None:
        return []
    problems: list[Problem] = []
    by_name = {c.name: c for c in spec.components}
    for name in loop.components:
        comp = by_name.get(name)
        if comp is None or comp.kind != "transformer":
            continue
        if comp.precision.weights != recipe.assumes_precision:
            msg = (
                f"the recipe assumes {recipe.assumes_precision} weights but component "
                f"{name!r} loads {comp.precision.weights}"
            )
            problems.append((("recipe", "assumesPrecision"), "precision_mismatch", msg))
    return problems


def family_problems(spec: ModelCardSpec) -> list[Problem]:
    """The architecture block, when given, has the attention the family needs."""
    arch = spec.architecture
    if arch is None:
        return []
    problems: list[Problem] = []
    found = families.family(spec.family)
    want = found.attention
    if want is not None and arch.attention.kind != want:
        msg = f"a {spec.family} model has {want} attention, not {arch.attention.kind}"
        problems.append((("architecture", "attention", "kind"), "wrong_attention", msg))
    if found.needs_indexer and arch.indexer is None:
        msg = f"a {spec.family} model needs an indexer (numLayers, headDim, topK)"
        problems.append((("architecture", "indexer"), "missing_indexer", msg))
    return problems


def program_problems(spec: ModelCardSpec) -> list[Problem]:
    """A think_then_draw program thinks with an ar_decode loop and draws with a diffusion loop
    that has steps, and both run one shared component (the draw reads the think's KV)."""
    loops = {loop.name: loop for loop in spec.loops}
    problems: list[Problem] = []
    for i, program in enumerate(spec.programs):
        found = []
        for field, name, kind in (("think", program.think, "ar_decode"),
                                  ("draw", program.draw, "diffusion")):  # fmt: skip
            loop = loops.get(name)
            if loop is None:
                msg = f"no loop named {name!r} (declared: {_declared(list(loops))})"
                problems.append((("programs", i, field), "unknown_loop", msg))
            elif loop.kind != kind:
                msg = f"a {program.kind} program's {field} loop is {kind}; {name!r} is {loop.kind}"
                problems.append((("programs", i, field), "wrong_loop_kind", msg))
            else:
                found.append(loop)
        if len(found) < 2:
            continue
        think, draw = found
        if draw.steps is None:
            msg = f"the draw loop {draw.name!r} must set steps (the program's denoise steps)"
            problems.append((("programs", i, "draw"), "missing_steps", msg))
        if not set(think.components) & set(draw.components):
            msg = (
                f"loops {think.name!r} and {draw.name!r} share no component: the draw attends "
                "to the think loop's KV, so both must run the same weights"
            )
            problems.append((("programs", i), "no_shared_component", msg))
    return problems


def duplicate_problems(spec: ModelCardSpec) -> list[Problem]:
    """Component, loop and program names are unique."""
    return [
        *_duplicates("components", [c.name for c in spec.components]),
        *_duplicates("loops", [loop.name for loop in spec.loops]),
        *_duplicates("programs", [p.name for p in spec.programs]),
    ]


# Run on every spec; when some fields fail, on the parts that parse (see checks.py).
SPEC_RULES: tuple[Rule, ...] = (
    duplicate_problems,
    component_problems,
    loop_problems,
    recipe_loop_problems,
    recipe_precision_problems,
    family_problems,
    program_problems,
)
