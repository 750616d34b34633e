"""`python -m loom_runtime`: the worker-side CLI (what `loom runtime` and `loom model` run)."""

from __future__ import annotations

import sys

from loom_runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
