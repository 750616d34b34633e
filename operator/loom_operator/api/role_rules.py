"""Rules that make a deployment's roles runnable: parallel layouts, role sets, shared settings.

Pure: reads parsed role models and lists every problem with its path; never raises or prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loom_runtime.card.checks import Rule
from loom_runtime.card.errors import Problem

if TYPE_CHECKING:
    from loom_operator.api.roles import EngineSection, Parallelism, Role, Roles


def pcp_problems(par: Parallelism) -> list[Problem]:
    """PCP splits one engine's prompt; it does not combine with DP."""
    if par.pcp == 1 or par.dp == 1:
        return []
    msg = (
        f"pcp ({par.pcp}) cannot be combined with dp ({par.dp}): a context-parallel "
        "prefill engine is one engine; add replicas instead of dp"
    )
    return [(("pcp",), "pcp_with_dp", msg)]


def dcp_problems(par: Parallelism) -> list[Problem]:
    """DCP shards the KV over ranks of tp × pcp (vLLM: tp * pcp divisible by dcp)."""
    if (par.tp * par.pcp) % par.dcp == 0:
        return []
    msg = f"dcp ({par.dcp}) must divide tp × pcp ({par.tp} × {par.pcp} = {par.tp * par.pcp})"
    return [(("dcp",), "dcp_not_divisor", msg)]


def ep_problems(par: Parallelism) -> list[Problem]:
    """EP shards experts over all ranks of the replica."""
    if par.ranks % par.ep == 0:
        return []
    msg = f"ep ({par.ep}) must divide the rank count dp × tp × pcp ({par.ranks})"
    return [(("ep",), "ep_not_divisor", msg)]


def interleave_cp_problems(par: Parallelism) -> list[Problem]:
    """The KV interleave only means something under context parallelism."""
    if par.cp_kv_interleave == 1 or par.pcp > 1 or par.dcp > 1:
        return []
    msg = "cpKvInterleave only applies with pcp > 1 or dcp > 1; leave it at 1"
    return [(("cpKvInterleave",), "interleave_without_cp", msg)]


def engine_problems(engine: EngineSection) -> list[Problem]:
    """Every running sequence needs a token of the step budget."""
    if engine.max_num_batched_tokens >= engine.max_num_seqs:
        return []
    msg = (
        f"maxNumBatchedTokens ({engine.max_num_batched_tokens}) must be at least "
        f"maxNumSeqs ({engine.max_num_seqs}): every running request needs a token per step"
    )
    return [(("maxNumBatchedTokens",), "budget_too_small", msg)]


def interleave_problems(role: Role) -> list[Problem]:
    """A KV block holds whole interleave runs."""
    block, run = role.engine.block_size, role.parallelism.cp_kv_interleave
    if block % run == 0:
        return []
    msg = f"cpKvInterleave ({run}) must divide the engine's blockSize ({block})"
    return [(("parallelism", "cpKvInterleave"), "interleave_not_divisor", msg)]


def gpu_problems(role: Role) -> list[Problem]:
    """A replica asks for no GPUs (CPU) or one per rank."""
    gpus = role.resources.gpus if role.resources else None
    ranks = role.parallelism.ranks
    if gpus is None or gpus in (0, ranks):
        return []
    msg = f"gpus ({gpus}) must be 0 (CPU) or the replica's rank count dp × tp × pcp ({ranks})"
    return [(("resources", "gpus"), "gpus_not_ranks", msg)]


def offload_problems(role: Role) -> list[Problem]:
    """One CPU KV offload tier per role: `kvOffload.hostGiB`, or beside HiSparse its
    `offloadGiB`; both would size the same tier twice."""
    if role.kv_offload is None or role.hi_sparse is None or role.hi_sparse.offload_gib == 0:
        return []
    msg = (
        f"hiSparse.offloadGiB ({role.hi_sparse.offload_gib:g}) and kvOffload.hostGiB "
        f"({role.kv_offload.host_gib:g}) both size the role's one CPU KV offload tier; "
        "set one of them (offloadGiB 0, or drop kvOffload)"
    )
    return [(("hiSparse", "offloadGiB"), "two_offload_tiers", msg)]


def prefix_caching_problems(role: Role) -> list[Problem]:
    """A CPU KV offload tier finds its blocks again by their prefix hash: it needs prefix
    caching (the runtime's EngineConfig refuses kv_offload_gib without it)."""
    if role.engine.prefix_caching:
        return []
    tiers: list[str] = []
    if role.kv_offload is not None:
        tiers.append(f"kvOffload.hostGiB ({role.kv_offload.host_gib:g})")
    if role.hi_sparse is not None and role.hi_sparse.offload_gib > 0:
        tiers.append(f"hiSparse.offloadGiB ({role.hi_sparse.offload_gib:g})")
    if not tiers:
        return []
    msg = (
        f"engine.prefixCaching is false, but {' and '.join(tiers)} asks for a CPU KV offload "
        "tier, whose blocks are found again by their prefix hash; set prefixCaching true or "
        "drop the offload"
    )
    return [(("engine", "prefixCaching"), "offload_without_prefix_caching", msg)]


def role_set_problems(roles: Roles) -> list[Problem]:
    """At least one role; prefill comes with decode; aggregated stands alone."""
    have = roles.present()
    if not have:
        return [((), "no_roles", "declare a role: prefill + decode, or aggregated")]
    problems: list[Problem] = []
    if "prefill" in have and "decode" not in have:
        msg = "a prefill role requires a decode role to hand its KV to"
        problems.append((("decode",), "missing_decode", msg))
    if "aggregated" in have and ("prefill" in have or "decode" in have):
        msg = "aggregated excludes prefill and decode: declare either aggregated or prefill/decode"
        problems.append((("aggregated",), "aggregated_with_pd", msg))
    return problems


def hisparse_problems(roles: Roles) -> list[Problem]:
    """Hybrid HiSparse is a decode technique."""
    problems: list[Problem] = []
    for name, role in roles.present().items():
        if name != "decode" and role.hi_sparse is not None:
            msg = f"hiSparse is for the decode role only, not {name}"
            problems.append(((name, "hiSparse"), "hisparse_not_decode", msg))
    return problems


def block_size_problems(roles: Roles) -> list[Problem]:
    """All roles use one block size: KV moves in blocks and the router hashes one size."""
    present = roles.present()
    sizes = {name: role.engine.block_size for name, role in present.items()}
    if len(set(sizes.values())) <= 1:
        return []
    first = next(iter(sizes))
    return [
        (
            (name, "engine", "blockSize"),
            "block_size_mismatch",
            f"blockSize ({size}) must equal the {first} role's ({sizes[first]}): KV blocks "
            "move between roles and the router's prefix index hashes one block size",
        )
        for name, size in sizes.items()
        if size != sizes[first]
    ]


PARALLELISM_RULES: tuple[Rule, ...] = (
    pcp_problems,
    dcp_problems,
    ep_problems,
    interleave_cp_problems,
)
ENGINE_RULES: tuple[Rule, ...] = (engine_problems,)
ROLE_RULES: tuple[Rule, ...] = (
    interleave_problems,
    gpu_problems,
    offload_problems,
    prefix_caching_problems,
)
ROLES_RULES: tuple[Rule, ...] = (
    role_set_problems,
    hisparse_problems,
    block_size_problems,
)
