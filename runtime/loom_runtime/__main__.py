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

# The step thread needs the GIL between its torch ops, while the event loop holds it to stream
# tokens; with CPython's default 5 ms switch interval the step thread waits up to 5 ms behind
# the loop each time. 0.5 ms: bench/engine.py measured +6 % streamed tok/s at 16 concurrent and
# +25 % with mixed lengths on 2 cores (docs/benchmarks.md, 2026-12-02).
SWITCH_INTERVAL_S = 0.0005

if __name__ == "__main__":
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    sys.exit(main())
