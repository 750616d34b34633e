"""`loom plan CARD.yaml`: KV bytes per token and per GPU, longest context, sparse-MLA intensity.

Loads the cards and prints the capacity planner's report; never computes a figure itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loom_operator.api.documents import load_documents
from loom_operator.fleet.capacity import (
    GIB,
    CapacityReport,
    RoleCapacity,
    SparseIntensity,
    plan_capacity,
    role_plans,
)
from loom_operator.fleet.kv_layout import CapacityError, MLAAttention, ModelShape, model_shape
from loom_runtime.card import CardError

DEFAULT_CONTEXT = 1_048_576
DEFAULT_BUDGET_GIB = 15.0  # what an H200 has left for KV after a GLM-5-class model's weights


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="size the KV cache and sparse attention of a deployment",
        description="KV bytes per token and per GPU, the longest context a per-GPU KV budget "
        "holds, and sparse-MLA FLOPs per byte, from a ModelCard + DeploymentCard file.",
    )
    p.add_argument(
        "card", metavar="CARD", type=Path, help="YAML with a ModelCard and a DeploymentCard"
    )
    p.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        metavar="TOKENS",
        help=f"sequence length to size (default {DEFAULT_CONTEXT:,})",
    )
    p.add_argument(
        "--kv-budget-gib",
        type=float,
        default=DEFAULT_BUDGET_GIB,
        metavar="GIB",
        help=f"KV memory per GPU (default {DEFAULT_BUDGET_GIB:g})",
    )
    p.add_argument("--role", metavar="NAME", help="only this role (prefill, decode, aggregated)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        shape, report = _plan(args)
    except (CardError, CapacityError, OSError) as exc:
        print(f"loom plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        render(report, shape, Console())
    return 0


def _plan(args: argparse.Namespace) -> tuple[ModelShape, CapacityReport]:
    cards = load_documents(args.card)
    if not cards.deployment_cards or not cards.model_cards:
        raise CapacityError(f"{args.card}: needs a ModelCard and a DeploymentCard")
    deployment = cards.deployment_cards[0]
    model = cards.model_card(deployment.spec.model_card, deployment.metadata.namespace)
    shape = model_shape(model or cards.model_cards[0])
    roles = role_plans(deployment)
    if args.role is not None:
        roles = tuple(r for r in roles if r.name == args.role)
        if not roles:
            names = ", ".join(deployment.spec.roles.present())
            raise CapacityError(f"--role {args.role}: {deployment.name} has roles {names}")
    if args.context < 0 or args.kv_budget_gib < 0:
        raise CapacityError("--context and --kv-budget-gib must be non-negative")
    budget = int(args.kv_budget_gib * GIB)
    return shape, plan_capacity(shape, roles, args.context, budget)


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def _intensity(x: SparseIntensity | None) -> str:
    return "-" if x is None else f"{x.flops_per_byte:.0f}"


def _tokens(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _kv_table(report: CapacityReport, shape: ModelShape) -> Table:
    b = report.breakdown
    kind = "MLA" if isinstance(shape.attention, MLAAttention) else "GQA"
    table = Table(title=f"KV bytes per token ({shape.kv_dtype} KV)")
    for col in ("layers", "count", "bytes each", "bytes"):
        table.add_column(col, justify="left" if col == "layers" else "right")
    rows = [
        (f"{kind} attention", b.attention_layers, b.attention_layer_bytes),
        ("indexer", b.indexer_layers, b.indexer_layer_bytes),
        ("MTP", b.mtp_layers, b.mtp_layer_bytes),
    ]
    for name, count, each in rows:
        if count:
            table.add_row(name, f"{count}", f"{each:,}", f"{count * each:,}")
    table.add_row("total", "", "", f"{report.kv_bytes_per_token:,} B/token", style="bold")
    return table


def _role_table(report: CapacityReport) -> Table:
    table = Table(
        title=f"Per GPU at {report.context:,} tokens, {_gib(report.budget_bytes)} KV budget"
    )
    table.add_column("")
    for rc in report.roles:
        table.add_column(rc.role.name, justify="right")

    def row(label: str, cell: Callable[[RoleCapacity], str]) -> None:
        table.add_row(label, *(cell(rc) for rc in report.roles))

    def par(rc: RoleCapacity) -> str:
        r = rc.role
        return f"dp{r.dp} tp{r.tp} pcp{r.pcp} dcp{r.dcp} ep{r.ep}"

    row("parallelism", par)
    row("KV per GPU", lambda rc: _gib(rc.kv_bytes_per_rank))
    row("fits budget", lambda rc: "yes" if rc.fits else "no")
    row("max context", lambda rc: f"{rc.max_context:,}")
    row("heads per GPU", lambda rc: f"{rc.heads_per_rank}")
    row("sparse MLA FLOP/B", lambda rc: _intensity(rc.intensity))
    if any(rc.indexer_crossover is not None for rc in report.roles):
        row("indexer > MLA at", lambda rc: _tokens(rc.indexer_crossover))
    return table


def _comparison_table(report: CapacityReport) -> Table | None:
    cmp = report.comparison
    if cmp is None:
        return None
    table = Table(title=f"Sparse MLA per query and layer, {cmp.ranks} GPUs")
    crossover = cmp.tp_crossover is not None
    columns = ("split", "heads/GPU", "MFLOP", "MB moved", "FLOP/B", "indexer > MLA at")
    for col in columns[: 6 if crossover else 5]:
        table.add_column(col, justify="left" if col == "split" else "right")
    for name, x, cross in (
        (f"TP{cmp.ranks}", cmp.tp, cmp.tp_crossover),
        (f"PCP{cmp.ranks}", cmp.pcp, cmp.pcp_crossover),
    ):
        cells = [name, f"{x.heads}", f"{x.flops / 1e6:.1f}", f"{x.bytes / 1e6:.2f}"]
        table.add_row(*cells, _intensity(x), *([_tokens(cross)] if crossover else []))
    return table


def render(report: CapacityReport, shape: ModelShape, console: Console) -> None:
    """The report as tables: KV per token, per-role per-GPU figures, TP versus PCP."""
    console.print(_kv_table(report, shape))
    console.print(
        f"{report.context:,} tokens × {report.kv_bytes_per_token:,} B = "
        f"{report.kv_bytes / (1 << 20):,.0f} MiB = [bold]{_gib(report.kv_bytes)}[/bold]\n"
        "(one full copy: TP and PCP replicate it on every GPU, DCP shards it)",
        highlight=False,
    )
    console.print(_role_table(report))
    comparison = _comparison_table(report)
    if comparison is not None:
        console.print(comparison)
        acc = report.accelerator
        console.print(
            f"{acc.name} ridge point: {acc.peak_flops / 1e12:,.0f} TFLOP/s / "
            f"{acc.hbm_bytes_per_s / 1e12:.1f} TB/s = {acc.ridge:.0f} FLOP/B "
            "(below it, memory-bound)",
            highlight=False,
        )


def report_json(report: CapacityReport) -> dict[str, Any]:
    """The report as plain JSON data, with the derived GiB and FLOP/B figures added."""
    data = asdict(report)
    data["kv_bytes_per_token"] = report.kv_bytes_per_token
    data["kv_gib"] = report.kv_bytes / GIB
    data["accelerator"]["ridge"] = report.accelerator.ridge
    for rc, out in zip(report.roles, data["roles"], strict=True):
        out["kv_gib_per_rank"] = rc.kv_bytes_per_rank / GIB
        if rc.intensity is not None:
            out["intensity"]["flops_per_byte"] = rc.intensity.flops_per_byte
    if report.comparison is not None:
        for key in ("tp", "pcp"):
            data["comparison"][key]["flops_per_byte"] = getattr(
                report.comparison, key
            ).flops_per_byte
    return data
