"""`loom runtime`: parse flags, load the card, build the engine, serve until signalled.

Owns the command line and turning a card into engine settings; never serves requests itself.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch

from loom_runtime.card import CardError, Component, ModelCard, load_model_card
from loom_runtime.card.chat_parsers import ChatParsers, ReasoningParserName, ToolCallParserName
from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.shared_step_thread import SharedStepThread
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.errors import CheckpointError, SpeculativeConfigError, TransferError
from loom_runtime.kv.event_publisher import KVEventPublisher
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.wan.loader import load_wan
from loom_runtime.parallel.layout import LayoutError, ParallelLayout
from loom_runtime.parallel.ranks import RankFailure
from loom_runtime.serve import rebuild as rebuild_flags
from loom_runtime.serve.app import ServeSettings, Worker
from loom_runtime.serve.diffusion import main as diffusion_main
from loom_runtime.serve.dual_app import DualWorker
from loom_runtime.serve.engine_args import add_engine_arguments, engine_values
from loom_runtime.serve.program_worker import draw_settings, engine_from_instance
from loom_runtime.serve.rebuild import Rebuild, plan_rebuild, rebuild
from loom_runtime.serve.sources import checkpoint_path
from loom_runtime.transfer.connector import ConnectorSettings, KVConnector, build_connector
from loom_runtime.wire.engine_settings import setting
from loom_runtime.wire.process import configure_logging, serve_until_signalled

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in setting("dtype").choices}
TOKEN_ENV = "LOOM_CONTROL_TOKEN"


class UsageError(Exception):
    """The flags ask for something this worker cannot do; the message says what to do instead."""


def add_parser(sub: Any) -> None:
    """Register `runtime` on the top-level subcommand parsers."""
    p = sub.add_parser(
        "runtime",
        help="serve one role of a model (OpenAI HTTP + gRPC control)",
        description="Serve the first component of a ModelCard: OpenAI-compatible HTTP, "
        "/health, /ready, /metrics, and (with --control-port) the gRPC control service. A "
        "diffusers-format Wan checkpoint (model_index.json) serves /v1/images/generations and "
        "/v1/videos instead.",
    )
    p.add_argument("--card", type=Path, required=True, help="ModelCard YAML file")
    p.add_argument(
        "--diffusion-card", type=Path,
        help="also serve this diffusion ModelCard (a Wan checkpoint) from this process, on one "
        "step thread shared with --card's LLM by fair compute time (aggregated role only)",
    )  # fmt: skip
    p.add_argument("--role", choices=("aggregated", "prefill", "decode"), default="aggregated")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--control-port", type=int, help="gRPC control port (default: no control)")
    p.add_argument("--control-token", help=f"shared control token (default ${TOKEN_ENV})")
    p.add_argument("--kv-events-port", type=int, help="ZMQ PUB port for KV events (default off)")
    p.add_argument("--kv-events-replay-port", type=int, help="ZMQ ROUTER port for KV replay")
    add_engine_arguments(p)  # --block-size ... --collective-timeout (wire/engine_settings.py)
    p.add_argument("--weights-version", help="reported version (default: the card's)")
    p.add_argument("--drain-timeout", type=float, default=600.0, help="Pause(WAIT) bound, s")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=ServeSettings.max_body_bytes,
        help="largest request body accepted; larger ones get 413 (default 16 MiB)",
    )
    p.add_argument(
        "--tool-call-parser", choices=get_args(ToolCallParserName),
        help="how tool calls are read from chat output, as vLLM's flag (default: the card's "
        "chat.toolCallParser, else its family's)",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-parser", choices=get_args(ReasoningParserName),
        help="how reasoning is read from chat output, as vLLM's flag (default: the card's "
        "chat.reasoningParser, else its family's)",
    )  # fmt: skip
    p.add_argument(
        "--strict-fields",
        action="store_true",
        help="refuse request fields neither OpenAI nor vLLM defines (default: ignore and name "
        "them in the x-loom-ignored-fields header, as vLLM does)",
    )
    pd = p.add_argument_group("P/D disaggregation (--role prefill | decode)")
    pd.add_argument(
        "--kv-connector",
        choices=("nixl", "tcp"),
        default="nixl",
        help="how KV moves between prefill and decode (default nixl)",
    )
    pd.add_argument(
        "--kv-side-port",
        type=int,
        default=5600,
        help="prefill: side-channel port for handshakes and leases (default 5600)",
    )
    pd.add_argument(
        "--kv-side-host", help="prefill: the address decodes reach it at (default --host)"
    )
    pd.add_argument(
        "--kv-lease-seconds",
        type=float,
        default=30.0,
        help="prefill: free unpulled KV blocks after this long (default 30)",
    )
    pd.add_argument(
        "--on-transfer-failure",
        choices=("recompute", "fail"),
        default="recompute",
        help="decode: when a KV pull fails, prefill locally or answer 500",
    )
    rebuild_flags.add_arguments(p)
    diffusion_main.add_arguments(p)
    p.set_defaults(run=run)  # fmt: skip


@dataclass(frozen=True)
class WorkerPlan:
    checkpoint: Path
    engine: EngineConfig
    serve: ServeSettings
    disagg: DisaggSettings | None = None  # P/D role, None when aggregated
    connector: ConnectorSettings | None = None
    rebuild: Rebuild | None = None  # a pushed version to rebuild from a peer before serving


def plan_disagg(args: argparse.Namespace) -> tuple[DisaggSettings, ConnectorSettings] | None:
    """The P/D settings of a prefill or decode worker; None for an aggregated one."""
    if args.role == "aggregated":
        return None
    if args.kv_lease_seconds <= 0:
        raise UsageError(f"--kv-lease-seconds must be > 0, got {args.kv_lease_seconds}")
    if not 0 <= args.kv_side_port <= 65535:
        raise UsageError(f"--kv-side-port must be a port number, got {args.kv_side_port}")
    side_host = args.kv_side_host or args.host
    if args.role == "prefill" and side_host in ("0.0.0.0", "::", ""):
        raise UsageError(
            f"--host {args.host} listens everywhere, but decodes need an address to reach this "
            "prefill at: pass --kv-side-host (e.g. the pod IP)"
        )
    disagg = DisaggSettings(args.role, args.on_transfer_failure)
    connector = ConnectorSettings(
        kind=args.kv_connector,
        role=args.role,
        side_host=side_host,
        side_port=args.kv_side_port,
        bind_host=args.host,
        lease_seconds=args.kv_lease_seconds,
    )
    return disagg, connector


def plan_worker(args: argparse.Namespace, env: dict[str, str]) -> WorkerPlan:
    """What to load and how to serve it; CardError / CheckpointError / UsageError if impossible."""
    pd = plan_disagg(args)
    token = args.control_token or env.get(TOKEN_ENV, "")
    if args.control_port is not None and not token:
        raise UsageError(
            f"--control-port needs a shared token: pass --control-token or set ${TOKEN_ENV}"
        )
    card = load_model_card(args.card)
    component = card.spec.components[0]
    path = checkpoint_path(component.source.uri, args.card)
    try:
        values = engine_values(args)  # every declared setting with a runtime flag
        parallel = ParallelLayout(**values.pop("parallel"))
        engine = EngineConfig(
            **{**values, "dtype": DTYPES[values["dtype"]], "parallel": parallel},
            kv_fp8=kv_fp8_format(card, component),
            weights_version=args.weights_version or component.weights_version,
            model_name=card.name,
        )
    except (ValueError, LayoutError) as exc:
        raise UsageError(str(exc)) from None
    serve = ServeSettings(
        host=args.host,
        port=args.port,
        role=args.role,
        control_port=args.control_port,
        control_token=token,
        drain_timeout_s=args.drain_timeout,
        max_body_bytes=args.max_body_bytes,
        strict_fields=args.strict_fields,
        chat_parsers=chat_parsers(card, args),
        draw=draw_settings(card),
    )
    if serve.draw is not None and (pd is not None or args.diffusion_card is not None):
        raise UsageError(
            f"{args.card}: program {serve.draw.program!r} hands KV from its think loop to its "
            "draw loop inside one engine: serve it aggregated (--role aggregated), alone"
        )
    if serve.max_body_bytes < 1024:
        raise UsageError(f"--max-body-bytes must be at least 1024, got {serve.max_body_bytes}")
    try:
        peer = plan_rebuild(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if peer is not None and (serve.draw is not None or args.diffusion_card is not None):
        raise UsageError("--rebuild-from is for a worker of one LLM, not a program or a pair")
    disagg, connector = pd or (None, None)
    return WorkerPlan(path, engine, serve, disagg, connector, peer)


def chat_parsers(card: ModelCard, args: argparse.Namespace) -> ChatParsers:
    """How chat output is read: the flags, else the card's chat section, else its family's."""
    own = card.chat_parsers()
    return ChatParsers(
        tool_call_parser=args.tool_call_parser or own.tool_call_parser,
        reasoning_parser=args.reasoning_parser or own.reasoning_parser,
    )


def kv_fp8_format(card: ModelCard, component: Component) -> Fp8Format | None:
    """The fp8 KV format of a component with `precision.kv: fp8` (its group size is the card
    architecture's `quantGroupSize`, 128 without one); None for any other KV precision, whose
    cache is stored in the engine's --dtype."""
    if component.precision.kv != "fp8":
        return None
    arch = card.spec.architecture
    return Fp8Format() if arch is None else Fp8Format(arch.attention.quant_group_size)


def _publisher(args: argparse.Namespace) -> KVEventPublisher | None:
    if args.kv_events_port is None:
        return None
    replay = args.kv_events_replay_port
    return KVEventPublisher(
        f"tcp://{args.host}:{args.kv_events_port}",
        None if replay is None else f"tcp://{args.host}:{replay}",
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(logging.INFO)
    try:
        plan = plan_worker(args, dict(os.environ))
        root = diffusion_main.diffusion_root(plan.checkpoint)
        if root is not None:
            return diffusion_main.run_diffusion(_plan_diffusion(args, plan, root), checkpoint_path)
        side = _diffusion_side(args, plan)
        publisher = _publisher(args)
    except (UsageError, CardError, CheckpointError, ValueError) as exc:
        print(f"loom runtime: {exc}", file=sys.stderr)
        return 2
    connector: KVConnector | None = None
    shared_thread = (
        None if side is None else SharedStepThread("loom-worker", plan.engine.idle_wait_s)
    )
    dit: DiffusionEngine | None = None
    try:
        try:
            connector = None if plan.connector is None else build_connector(plan.connector)
            if plan.serve.draw is not None:  # a program: the card's ModelInstance
                engine = engine_from_instance(
                    load_model_card(args.card), args.card, plan.engine, publisher
                )
            else:
                engine = Engine.from_checkpoint(
                    plan.checkpoint, plan.engine, publisher, plan.disagg, connector, shared_thread
                )
            if side is not None:
                wan = load_wan(side.checkpoint, dtype=side.engine.dtype)
                dit = DiffusionEngine(wan, side.engine, shared_thread)
        except (CheckpointError, SpeculativeConfigError, ValueError) as exc:
            print(f"loom runtime: cannot load {plan.checkpoint}: {exc}", file=sys.stderr)
            return 2
        except (TransferError, OSError) as exc:  # NIXL missing, side port in use
            print(f"loom runtime: cannot set up the KV connector: {exc}", file=sys.stderr)
            return 2
        except (LayoutError, RankFailure) as exc:  # a layout the model cannot split, a rank down
            print(f"loom runtime: cannot start the worker's ranks: {exc}", file=sys.stderr)
            return 2
        # The model, tokenizer and tables live as long as the process: keep them out of every
        # garbage collection (the step loop allocates small objects every step).
        gc.collect()
        gc.freeze()
        engine.start()
        if plan.rebuild is not None:
            try:
                rebuild(engine, plan.rebuild, args.host, plan.serve.control_token)
            except (TransferError, CheckpointError) as exc:
                engine.shutdown()
                print(f"loom runtime: cannot rebuild {plan.rebuild.version} from the peer at "
                      f"{plan.rebuild.peer}: {exc}", file=sys.stderr)  # fmt: skip
                return 2
        worker: Worker | DualWorker = Worker(engine, plan.serve, checkpoint_path)
        if dit is not None and shared_thread is not None and side is not None:
            worker = DualWorker(engine, dit, shared_thread, plan.serve, side.jobs, checkpoint_path)
        try:
            asyncio.run(serve_until_signalled(worker, logger))
        except OSError as exc:  # a port in use, an address that cannot be bound
            print(f"loom runtime: cannot listen: {exc}", file=sys.stderr)
            return 2
        finally:
            if dit is not None:
                dit.shutdown()
            engine.shutdown()
    finally:
        if connector is not None:
            connector.close()
        if publisher is not None:
            publisher.close()
    return 0


def _diffusion_side(
    args: argparse.Namespace, plan: WorkerPlan
) -> diffusion_main.DiffusionPlan | None:
    """The diffusion model a worker serves next to its LLM (--diffusion-card), or None."""
    if args.diffusion_card is None:
        return None
    if plan.disagg is not None:
        raise UsageError("--diffusion-card: a worker serving two models runs aggregated only")
    card = load_model_card(args.diffusion_card)
    path = checkpoint_path(card.spec.components[0].source.uri, args.diffusion_card)
    root = diffusion_main.diffusion_root(path)
    if root is None:
        raise UsageError(f"--diffusion-card {args.diffusion_card}: {path} is not a Wan checkpoint")
    return diffusion_main.plan_diffusion(args, card, root, plan.serve, plan.engine.dtype)


def _plan_diffusion(
    args: argparse.Namespace, plan: WorkerPlan, root: Path
) -> diffusion_main.DiffusionPlan:
    if plan.disagg is not None or args.kv_events_port is not None:
        raise UsageError(
            f"{root} is a diffusion checkpoint: serve it aggregated (--role aggregated), without "
            "--kv-events-port (a diffusion worker has no KV cache to publish events about)"
        )
    card = load_model_card(args.card)
    return diffusion_main.plan_diffusion(args, card, root, plan.serve, plan.engine.dtype)
