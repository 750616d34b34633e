"""`loom dashboards --out DIR [--check]`: write the Grafana dashboards (JSON) built in code.

Writes files and prints; the dashboards live in loom_operator.dashboards.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loom_operator.dashboards.files import dashboard_files

DEFAULT_OUT = Path("charts/loom/dashboards")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dashboards", help="write the Grafana dashboards as JSON")
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"directory (default: {DEFAULT_OUT})"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file is missing, differs or is not generated",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    files = {out / name: text.encode() for name, text in dashboard_files().items()}
    if args.check:
        stale = [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
        extra = sorted(set(out.glob("*.json")) - files.keys()) if out.is_dir() else []
        for path in stale:
            print(f"{path} is out of date: run `loom dashboards --out {out}`")
        for path in extra:
            print(f"{path} is not a generated dashboard: remove it")
        return 1 if stale or extra else 0
    out.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        path.write_bytes(data)
        print(f"wrote {path}")
    return 0
