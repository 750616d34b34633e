"""`python -m e2e.node_agent`: run the stand-in kubelet for N nodes until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from urllib.parse import urlparse

from e2e.node_agent import POD_MARKER
from e2e.node_agent.agent import NodeAgent, NodeSpec
from e2e.node_agent.pod_runner import Settings
from loom_operator.k8s.kube import Kube


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.node_agent", description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--state-dir", required=True, type=Path, help="per-pod folders and logs")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--name-prefix", default="loom-node")
    p.add_argument(
        "--pod-net", type=int, default=10,
        help="node i hands out pod IPs from 127.NET.i.0/24 (default 10); two clusters on one "
        "machine need different values",
    )  # fmt: skip
    # Declared for the scheduler: every pod of every node shares this one machine anyway.
    p.add_argument("--cpu", default="16", help="each node's cpu capacity (default 16)")
    p.add_argument("--memory", default="64Gi", help="each node's memory capacity (default 64Gi)")
    p.add_argument("--pods", type=int, default=110, help="each node's pod capacity")
    p.add_argument(
        "--backoff-seconds", type=float, default=10.0,
        help="the crash back-off's first delay (the kubelet's is 10 s; doubles up to 5 min)",
    )  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    kube = Kube(Path(args.kubeconfig))
    server = urlparse(kube.server)
    nodes = [
        NodeSpec(
            f"{args.name_prefix}-{i}",
            f"127.{args.pod_net}.{i}.0/24",
            args.cpu,
            args.memory,
            args.pods,
        )
        for i in range(args.nodes)
    ]
    env = dict(os.environ, **{POD_MARKER: str(args.state_dir.resolve())})
    settings = Settings(
        root=args.state_dir / "pods",
        api_server=(server.hostname or "127.0.0.1", server.port or 443),
        backoff_base_s=args.backoff_seconds,
        env=env,
    )
    agent = NodeAgent(kube, nodes, settings)

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.register()
    threading.Thread(target=agent.heartbeat_forever, name="heartbeat", daemon=True).start()
    watcher = threading.Thread(target=agent.watch_forever, name="pod-watch", daemon=True)
    watcher.start()
    while not agent.stopping.wait(1.0):
        pass
    agent.shutdown()
    logging.getLogger(__name__).info("stand-in kubelet stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
