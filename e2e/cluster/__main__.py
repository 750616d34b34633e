"""`python -m e2e.cluster up|down|status`: the e2e control plane and stand-in kubelet."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from e2e.cluster import control_plane, node
from e2e.providers import DEFAULT_ROOT, LocalProvider, NodeProvider, Provider


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    p.add_argument("command", choices=["up", "down", "status"])
    p.add_argument(
        "--root", type=Path, default=DEFAULT_ROOT, help="state folder (certs, logs, etcd)"
    )
    p.add_argument("--nodes", type=int, default=1, help="stand-in kubelet nodes")
    p.add_argument(
        "--provider",
        choices=["local", "node"],
        default="local",
        help="local: the stand-in kubelet; node: a real kubelet, containerd and CNI",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[e2e] %(message)s")
    if args.command == "down":
        node.stop_node(args.root)  # a real node first, if one runs; then the control plane
        print("e2e cluster stopped")
        return 0
    state = control_plane.ClusterState.load(args.root)
    if args.command == "status":
        if state is None:
            print("no e2e cluster running")
            return 1
        for child in state.child_handles():
            print(f"{child.name:28} pid {child.pid:<8} {'running' if child.alive() else 'EXITED'}")
        print(f"export KUBECONFIG={state.kubeconfig}")
        return 0
    start = time.monotonic()
    provider: Provider = (
        NodeProvider(args.root) if args.provider == "node" else LocalProvider(args.root, args.nodes)
    )
    provider.up()
    state = control_plane.ClusterState.load(args.root)
    assert state is not None
    print(f"e2e cluster ready in {time.monotonic() - start:.1f} s at {state.server}")
    print(f"  export KUBECONFIG={state.kubeconfig}")
    print(f"  kubectl: {Path('.cache/bin/kubectl').resolve()}  (make e2e-down stops it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
