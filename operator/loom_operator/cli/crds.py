"""`loom crds --out DIR [--docs FILE] [--chart DIR] [--check]`: write the CRDs (and field
reference) generated from the card models, and the Helm chart's copy of them with the operator's
RBAC rules.

Writes files and prints; the generation lives in loom_operator.api.crd, api.reference and
k8s.rbac.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loom_operator.api.crd import crd_files
from loom_operator.api.reference import field_tables, splice
from loom_operator.k8s.rbac import rules_document


def add_parser(sub: Any) -> None:
    p = sub.add_parser("crds", help="write the CustomResourceDefinitions of the cards")
    p.add_argument("--out", type=Path, default=Path("crds"), help="directory (default: crds)")
    p.add_argument(
        "--docs",
        type=Path,
        help="also refresh the generated field tables in this markdown file (docs/cards.md)",
    )
    p.add_argument(
        "--chart",
        type=Path,
        help="also write the Helm chart's crds/ and files/operator-rules.yaml (charts/loom)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file differs from what the models generate",
    )
    p.set_defaults(run=run)


def _wanted(args: argparse.Namespace) -> dict[Path, bytes]:
    """Every file the command owns, with the bytes it should hold."""
    out: Path = args.out
    crds = crd_files()
    files = {out / name: text.encode() for name, text in crds.items()}
    if args.chart is not None:
        files |= {args.chart / "crds" / name: text.encode() for name, text in crds.items()}
        files[args.chart / "files" / "operator-rules.yaml"] = rules_document().encode()
    if args.docs is not None:
        files[args.docs] = splice(args.docs.read_text(encoding="utf-8"), field_tables()).encode()
    return files


def run(args: argparse.Namespace) -> int:
    try:
        files = _wanted(args)
    except (OSError, ValueError) as exc:
        print(f"loom crds: {exc}")
        return 1
    if args.check:
        stale = [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
        again = f"loom crds --out {args.out}" + (f" --docs {args.docs}" if args.docs else "")
        again += f" --chart {args.chart}" if args.chart else ""
        for path in stale:
            print(f"{path} is out of date: run `{again}`")
        return 1 if stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path}")
    return 0
