"""Rules between a DeploymentCard and the ModelCard it serves.

Pure: lists every problem with its path in the DeploymentCard; never loads or prints.
"""

from __future__ import annotations

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import Role
from loom_runtime.card import families
from loom_runtime.card.errors import Problem
from loom_runtime.card.model_card import ModelCard


def compatibility_problems(deploy: DeploymentCard, model: ModelCard) -> list[Problem]:
    """What in `deploy` the model cannot do: HiSparse (and where the native runtime runs it),
    batch-invariant mode on the native runtime, MTP, the vllm backend's loop kinds, P/D roles
    for a card with programs."""
    problems: list[Problem] = []
    spec = model.spec
    arch = spec.architecture
    has_draft = any(c.kind == "draft" for c in spec.components)
    family = families.family(spec.family)
    for name, role in deploy.spec.roles.present().items():
        at = ("spec", "roles", name)
        if role.hi_sparse is not None and not family.hisparse:
            runs = ", ".join(f.name for f in families.families() if f.hisparse)
            msg = f"hiSparse needs a {runs} model; {model.name!r} is {spec.family}"
            problems.append(((*at, "hiSparse"), "hisparse_needs_sparse_mla", msg))
        par = role.parallelism
        native = deploy.spec.backend == "native"
        if native and role.hi_sparse is not None and par.ranks != par.dp:
            msg = (
                f"the native runtime runs hiSparse on dp × ep ranks only (each an attention "
                f"replica holding its requests' tiers), not with pcp {par.pcp}, dcp {par.dcp}, "
                f"tp {par.tp}"
            )
            problems.append(((*at, "hiSparse"), "hisparse_on_split_ranks", msg))
        if native and role.engine.batch_invariant:
            problems += _batch_invariant_problems(at, family, role)
        if role.mtp is not None and arch is not None and arch.mtp is None and not has_draft:
            msg = f"mtp needs MTP layers (architecture.mtp) or a draft component in {model.name!r}"
            problems.append(((*at, "mtp"), "mtp_without_layers", msg))
    split = sorted(set(deploy.spec.roles.present()) & {"prefill", "decode"})
    if spec.programs and split:
        msg = (
            f"{model.name!r} declares program {spec.programs[0].name!r}, whose loops hand KV "
            f"over inside one worker; P/D ({' + '.join(split)}) is not built for it: serve it "
            "with an aggregated role"
        )
        problems.append((("spec", "roles", split[0]), "program_needs_aggregated", msg))
    if deploy.spec.backend == "vllm":
        kinds = sorted({loop.kind for loop in spec.loops} - {"ar_decode"})
        if kinds:
            msg = f"the vllm backend runs ar_decode loops only; {model.name!r} has {kinds[0]}"
            problems.append((("spec", "backend"), "backend_loop_kind", msg))
    return problems + _workflow_problems(deploy, model)


def _batch_invariant_problems(
    at: tuple[str, ...], family: families.Family, role: Role
) -> list[Problem]:
    """The native runtime's batch-invariant mode: the families that declare it, in one
    process or on TP ranks, without HiSparse or MTP (vLLM has its own mode,
    VLLM_BATCH_INVARIANT, for every model and layout)."""
    field = (*at, "engine", "batchInvariant")
    if not family.batch_invariant:
        built = ", ".join(f.name for f in families.families() if f.batch_invariant)
        msg = (
            f"the native runtime has batch-invariant mode for the {built} families, not "
            f"{family.name}: drop engine.batchInvariant"
        )
        return [(field, "batch_invariant_family", msg)]
    par = role.parallelism
    if par.ranks > 1 and not (family.ranks == "tp" and par.tp == par.ranks):
        msg = (
            f"the native runtime has batch-invariant mode in one process or on TP ranks, not "
            f"on {par.ranks} PCP/DCP/EP/DP ranks: drop engine.batchInvariant or those splits"
        )
        return [(field, "batch_invariant_on_ranks", msg)]
    features = (("hiSparse", role.hi_sparse is not None), ("mtp", role.mtp is not None))
    beside = [name for name, on in features if on]
    if beside:
        msg = (
            f"the native runtime's batch-invariant mode is not built with {' or '.join(beside)}"
            ": drop one of them"
        )
        return [(field, "batch_invariant_with", msg)]
    return []


def served_routes(model: ModelCard) -> frozenset[str]:
    """The media routes a fleet of `model` serves: a diffusion model's images and videos, a
    program's images; none for a plain text model."""
    if model.loop(model.spec.recipe.assumes_loop).kind == "diffusion":
        return frozenset({"images", "videos"})
    return frozenset({"images"}) if model.spec.programs else frozenset()


def _workflow_problems(deploy: DeploymentCard, model: ModelCard) -> list[Problem]:
    """A workflow's last stage runs on this card: the model must serve its route."""
    routes = served_routes(model)
    problems: list[Problem] = []
    for i, flow in enumerate(deploy.spec.workflows):
        at = ("spec", "workflows", i)
        if flow.name == model.name:
            msg = f"workflow {flow.name!r} is named like the model it is served beside"
            problems.append(((*at, "name"), "workflow_named_like_model", msg))
        if flow.route not in routes:
            serves = " and ".join(sorted(routes)) or "no images or videos"
            msg = (
                f"workflow {flow.name!r} ends with a {flow.route} stage on this card, but "
                f"{model.name!r} serves {serves}"
            )
            problems.append(((*at, "stages", len(flow.stages) - 1, "route"),
                             "workflow_route_not_served", msg))  # fmt: skip
    return problems
