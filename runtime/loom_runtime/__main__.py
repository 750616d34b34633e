"""`python -m loom_runtime`: the worker-side CLI (what `loom runtime` and `loom model` run)."""

from __future__ import annotations

import os
import sys

# A worker's step thread, its event loop and torch's OpenMP pool share the same cores: idle
# OpenMP threads must sleep, not spin, or they starve the event loop (bench/engine.py measured
# ~1.2x the streamed tok/s with sleeping threads on 2 cores). Read when libgomp loads, so set it
# before torch is imported; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from loom_runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
