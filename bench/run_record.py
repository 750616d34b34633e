"""The JSON record a fleet bench writes: which bench, the command that ran it, the machine and
its load before and after, the wall time, then the bench's own fields.

Owns that record's common header and writing it; never measures anything.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


class RunRecord:
    """Started when the bench starts (the load average then); `write` adds the rest."""

    def __init__(self, bench: str) -> None:
        self.bench = bench
        self.started = time.time()
        self.load_before = os.getloadavg()

    def write(self, out: Path, **fields: object) -> None:
        doc = {
            "bench": self.bench,
            "command": f"python bench/{self.bench}.py " + " ".join(sys.argv[1:]),
            "machine": {
                "cpus": os.cpu_count(),
                "load_average_before": self.load_before,
                "load_average_after": os.getloadavg(),
            },
            "wall_s": round(time.time() - self.started, 1),
            **fields,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
