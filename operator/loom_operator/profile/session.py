"""One profile from start to end: a worker per engine the phases need, the prefill rounds and
the decode sweep against it, in order, each step reported as a line.

Owns the sequence; never decides what a figure means (`profile.decide`) and never prints (the
CLI renders the progress lines it is handed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loom_operator.api.roles import RoleName
from loom_operator.fleet.commands import role_settings
from loom_operator.local.cards import FleetCards
from loom_operator.profile.decide import (
    DecodeLevel,
    Plan,
    PrefillRound,
    Profile,
    decode_output_tokens,
    phase_roles,
    prefill_concurrency,
    prefill_prompt_tokens,
    sweep_levels,
)
from loom_operator.profile.load import REQUEST_TIMEOUT_S, Driver, decode_level, prefill_round
from loom_operator.profile.worker import profiled_worker

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Request:
    """What to profile: the cards, how long, against which ITL target, and where the worker's
    log and environment come from."""

    cards: FleetCards
    plan: Plan
    itl_target_ms: float
    logs: Path
    env: Mapping[str, str]
    start_timeout_s: float


async def measure(req: Request, progress: Progress) -> Profile:
    """Prefill on the prefill engine's worker, decode on the decode engine's (one worker when
    they are the same role); the measurements as a Profile."""
    prefill_role, decode_role = phase_roles(tuple(req.cards.deployment.spec.roles.present()))
    prefill: tuple[PrefillRound, ...] = ()
    decode: tuple[DecodeLevel, ...] = ()
    for role in dict.fromkeys((prefill_role, decode_role)):
        progress(f"starting one worker with the {role} role's engine (log in {req.logs})")
        async with (
            profiled_worker(req.cards, role, req.logs, req.env, req.start_timeout_s) as target,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as s,
        ):
            driver = Driver(s, target)
            max_model_len = await driver.prepare()
            progress(f"worker ready at {target.url} (context {max_model_len:,} tokens)")
            if role == prefill_role:
                prefill = await _prefill(driver, req, role, max_model_len, progress)
            if role == decode_role:
                decode = await _decode(driver, req, role, max_model_len, progress)
    deployment = req.cards.deployment
    scaling = deployment.spec.autoscaling
    return Profile(
        card=deployment.name,
        prefill_role=prefill_role,
        decode_role=decode_role,
        itl_target_ms=req.itl_target_ms,
        utilization=0.5 if scaling is None else scaling.capacity.utilization,
        prefill=prefill,
        decode=decode,
    )


async def _prefill(
    driver: Driver, req: Request, role: RoleName, max_model_len: int, progress: Progress
) -> tuple[PrefillRound, ...]:
    engine = role_settings(req.cards.deployment, role).engine
    tokens = prefill_prompt_tokens(max_model_len, engine.max_num_batched_tokens)
    depth = prefill_concurrency(tokens, engine.max_num_batched_tokens, engine.max_num_seqs)
    await driver.complete(tokens, 1)  # warm-up, not counted
    rounds = []
    for i in range(req.plan.prefill_rounds):
        r = await prefill_round(driver, depth, tokens, req.plan.prefill_seconds)
        progress(
            f"prefill round {i + 1}/{req.plan.prefill_rounds}: {r.tokens_per_second:,.0f} "
            f"prompt tokens/s ({r.requests} prompts of {tokens} tokens, {depth} at once)"
        )
        rounds.append(r)
    return tuple(rounds)


async def _decode(
    driver: Driver, req: Request, role: RoleName, max_model_len: int, progress: Progress
) -> tuple[DecodeLevel, ...]:
    plan = req.plan
    engine = role_settings(req.cards.deployment, role).engine
    prompt = plan.decode_prompt_tokens
    output = decode_output_tokens(max_model_len, prompt, plan.decode_output_tokens)
    await driver.stream(prompt, output)  # warm-up, not counted
    levels = []
    for depth in sweep_levels(engine.max_num_seqs):
        lvl = await decode_level(driver, depth, prompt, output, plan.decode_seconds)
        levels.append(lvl)
        progress(
            f"decode, {depth} at once: ITL p90 {lvl.itl_p90_ms:.1f} ms, "
            f"{lvl.tokens_per_second:,.0f} tokens/s ({lvl.requests} streams of {output} tokens)"
        )
        if lvl.itl_p90_ms > req.itl_target_ms:
            progress(f"ITL p90 is over the {req.itl_target_ms:g} ms target: the sweep stops")
            break
    return tuple(levels)
