"""Loom's e2e cluster: a real control plane built from the official Go modules, on 127.0.0.1.

`python -m e2e.cluster up|down|status` (or `make e2e-cluster` / `make e2e-down`); see
docs/e2e.md.
"""
