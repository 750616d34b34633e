"""The real node's cluster DNS: CoreDNS (build_coredns.sh) as a host process on the node's address.

Owns building it, writing its Corefile, starting it beside kube-proxy and stopping it, with any
copy a killed agent left serving the same Corefile; never decides what it serves (node_config's
`corefile` does) and never touches a resolver it did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from e2e.cluster import processes
from e2e.cluster.control_plane import ClusterError, ClusterState, free_port
from e2e.cluster.node_config import NodeLayout, corefile, corefile_path

HERE = Path(__file__).resolve().parent
NAME = "coredns"
READY_TIMEOUT_S = 30.0


def build() -> Path:
    """Runs build_coredns.sh (cached, progress on stderr); returns the coredns binary."""
    out = subprocess.run(["bash", str(HERE / "build_coredns.sh")], check=False,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    if out.returncode != 0:
        raise ClusterError(f"e2e/cluster/build_coredns.sh failed (exit {out.returncode})")
    return Path(out.stdout.strip().splitlines()[-1]) / "bin" / "coredns"


def start(layout: NodeLayout, state: ClusterState, binary: Path, logs: Path) -> None:
    """Writes the Corefile, starts CoreDNS and waits until it has synced with the API server."""
    ready_port = free_port()
    layout.corefile.parent.mkdir(parents=True, exist_ok=True)
    layout.corefile.write_text(corefile(layout, ready_port))
    child = processes.start(NAME, [str(binary), "-conf", str(layout.corefile)], logs)
    state.add(child)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not child.alive():
            raise ClusterError(f"CoreDNS exited at start; see {logs / 'coredns.log'}")
        if _ready(ready_port):
            return
        time.sleep(0.2)
    raise ClusterError(f"CoreDNS not ready after {READY_TIMEOUT_S:.0f} s (not synced with the API "
                       f"server?); see {logs / 'coredns.log'}")  # fmt: skip


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(node_root: Path, children: dict[str, processes.Child]) -> None:
    """Stops the CoreDNS this node started, then SIGKILLs any other serving its Corefile (a killed
    agent's), which would hold the node's port 53."""
    if NAME in children:
        processes.stop(children[NAME])
    for pid in processes.pids_with_argument(str(corefile_path(node_root)), program="coredns"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
