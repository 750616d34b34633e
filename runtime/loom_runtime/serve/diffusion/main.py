"""`loom runtime` for a diffusion checkpoint (a diffusers-format Wan directory): turn the card and
flags into engine settings, load the checkpoint, serve until signalled.

Owns the diffusion flags and the card -> DiffusionEngineConfig mapping; never serves requests.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loom_runtime.card.model_card import ModelCard
from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import ComponentVersions, DiffusionEngineConfig
from loom_runtime.errors import CheckpointError
from loom_runtime.models.wan.loader import load_wan
from loom_runtime.serve.app import ServeSettings
from loom_runtime.serve.diffusion.app import DiffusionWorker, JobSettings
from loom_runtime.serve.diffusion.control import DiffusionControl
from loom_runtime.wire.process import serve_until_signalled

logger = logging.getLogger(__name__)

MODEL_INDEX = "model_index.json"
# Card component kinds -> the Wan component whose weights version they carry.
_KIND_COMPONENT = {"transformer": "transformer", "encoder": "text_encoder", "vae": "vae"}


def add_arguments(p: Any) -> None:
    """The flags only a diffusion worker reads (on the `runtime` parser)."""
    g = p.add_argument_group("diffusion (a checkpoint with model_index.json)")
    g.add_argument(
        "--diffusion-memory-mib", type=int, default=8192,
        help="what running requests' estimated peaks may add up to, MiB (default 8192)",
    )  # fmt: skip
    g.add_argument("--diffusion-max-running", type=int, default=8, help="default 8")
    g.add_argument(
        "--diffusion-step-budget", type=float, default=5.0,
        help="admit a queued request only while the running requests' predicted denoise step, "
        "with it, stays within this many seconds (the online cost model; 0: no budget; "
        "default 5)",
    )  # fmt: skip
    g.add_argument("--text-len", type=int, default=512, help="prompt tokens (default 512)")
    g.add_argument("--text-cache-entries", type=int, default=256, help="default 256")
    g.add_argument("--max-video-jobs", type=int, default=256, help="default 256")
    g.add_argument("--video-job-ttl", type=float, default=3600.0, help="seconds (default 3600)")


def diffusion_root(path: Path) -> Path | None:
    """The Wan checkpoint directory `path` is (or a component folder of), or None."""
    for candidate in (path, path.parent):
        if (candidate / MODEL_INDEX).is_file():
            return candidate
    return None


@dataclass(frozen=True)
class DiffusionPlan:
    checkpoint: Path
    engine: DiffusionEngineConfig
    serve: ServeSettings
    jobs: JobSettings
    version: str
    """The checkpoint's weights version (what Status reports; LoadWeights replaces it)."""


def plan_diffusion(
    args: argparse.Namespace, card: ModelCard, root: Path, serve: ServeSettings, dtype: torch.dtype
) -> DiffusionPlan:
    """Settings from the card (steps, pinned steps, component versions) and the flags."""
    spec = card.spec
    loops = {lp.name: lp for lp in spec.loops if lp.kind == "diffusion"}
    if not loops:
        raise ValueError(f"card {card.name!r} declares no diffusion loop for {root}")
    loop = loops.get(spec.recipe.assumes_loop, next(iter(loops.values())))
    found = {_KIND_COMPONENT[c.kind]: c.weights_version for c in spec.components
             if c.kind in _KIND_COMPONENT}  # fmt: skip
    default = spec.components[0].weights_version
    versions = ComponentVersions(
        **{
            name: args.weights_version or found.get(name, default)
            for name in _KIND_COMPONENT.values()
        }
    )
    engine = DiffusionEngineConfig(
        model_name=card.name,
        dtype=dtype,
        text_len=args.text_len,
        default_steps=loop.steps or spec.recipe.steps or 50,
        pinned_steps=spec.recipe.steps,
        max_running=args.diffusion_max_running,
        step_budget_s=args.diffusion_step_budget or None,
        memory_budget_bytes=args.diffusion_memory_mib * 2**20,
        text_cache_entries=args.text_cache_entries,
        versions=versions,
    )
    jobs = JobSettings(args.max_video_jobs, args.video_job_ttl)
    return DiffusionPlan(root, engine, serve, jobs, args.weights_version or versions.transformer)


def run_diffusion(plan: DiffusionPlan, resolve_source: Callable[[str], Path]) -> int:
    """Load, serve until SIGTERM/SIGINT, drain; 2 when the checkpoint or a port is unusable.
    `resolve_source` maps a LoadWeights source to a checkpoint directory."""
    try:
        loaded = load_wan(plan.checkpoint, dtype=plan.engine.dtype)
        engine = DiffusionEngine(loaded, plan.engine)
        control = DiffusionControl(engine, plan.checkpoint, plan.version)
    except (CheckpointError, ValueError) as exc:
        print(f"loom runtime: cannot load {plan.checkpoint}: {exc}", file=sys.stderr)
        return 2
    gc.collect()
    gc.freeze()
    engine.start()
    try:
        worker = DiffusionWorker(control, plan.serve, plan.jobs, resolve_source)
        asyncio.run(serve_until_signalled(worker, logger))
    except OSError as exc:
        print(f"loom runtime: cannot listen: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()
    return 0
