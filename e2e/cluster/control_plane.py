"""The e2e control plane: etcd, kube-apiserver, controller-manager and scheduler on 127.0.0.1.

Owns starting them in order (with generated certificates and a kubeconfig), waiting for
`/readyz`, recording what runs in a state file, and stopping it all; never builds binaries
(build.sh does) and never runs pods (the node agent does).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from e2e.cluster import processes
from e2e.cluster.certs import Pki, make_pki
from e2e.node_agent import POD_MARKER

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SERVICE_CIDR = "10.96.0.0/16"
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 90.0


class ClusterError(RuntimeError):
    """The control plane could not be built, started or reached; the message says which log."""


@dataclass
class ClusterState:
    """What `up` started, persisted as state.json so `down` (another process) can stop it."""

    root: str
    bin_dir: str
    kubeconfig: str
    apiserver_port: int
    etcd_port: int
    children: list[dict[str, object]] = field(default_factory=list)
    address: str = LOOPBACK
    """Where the API server listens: loopback, or a real node's address that pods reach."""

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    def save(self) -> None:
        path = Path(self.root) / "state.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, root: Path) -> ClusterState | None:
        path = root / "state.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def child_handles(self) -> list[processes.Child]:
        return [
            processes.Child(str(c["name"]), int(str(c["pid"])), str(c["argv0"]))
            for c in self.children
        ]

    def add(self, child: processes.Child) -> None:
        self.children.append(asdict(child))
        self.save()


def build_binaries() -> Path:
    """Runs build.sh (cached, progress on stderr) and returns the folder holding the binaries."""
    start = time.monotonic()
    out = subprocess.run(
        ["bash", str(HERE / "build.sh")], check=False, stdout=subprocess.PIPE, text=True
    )
    if out.returncode != 0:
        raise ClusterError(f"e2e/cluster/build.sh failed (exit {out.returncode}); see its output")
    cache = Path(out.stdout.strip().splitlines()[-1])
    logger.info("control-plane binaries ready in %.1f s: %s", time.monotonic() - start, cache)
    return cache / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: loom-e2e
  cluster:
    server: {server}
    certificate-authority: {pki.ca}
users:
- name: loom-e2e-admin
  user:
    client-certificate: {pki.path("admin.crt")}
    client-key: {pki.path("admin.key")}
contexts:
- name: loom-e2e
  context: {{cluster: loom-e2e, user: loom-e2e-admin, namespace: default}}
current-context: loom-e2e
"""
    path.write_text(text)


def apiserver_args(state: ClusterState, pki: Pki) -> list[str]:
    p = pki.path
    return [
        f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
        f"--bind-address={state.address}",
        f"--advertise-address={state.address}",
        f"--secure-port={state.apiserver_port}",
        f"--tls-cert-file={p('apiserver.crt')}",
        f"--tls-private-key-file={p('apiserver.key')}",
        f"--client-ca-file={pki.ca}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={p('sa.pub')}",
        f"--service-account-signing-key-file={p('sa.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        *_endpoint_args(state, pki),
        f"--requestheader-client-ca-file={pki.front_proxy_ca}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={p('front-proxy-client.crt')}",
        f"--proxy-client-key-file={p('front-proxy-client.key')}",
        "--allow-privileged=true",
        # Pods that request an extended resource (nvidia.com/gpu) tolerate its node taint.
        "--enable-admission-plugins=ExtendedResourceToleration",
        "--profiling=false",
    ]


def _endpoint_args(state: ClusterState, pki: Pki) -> list[str]:
    """On loopback, no `kubernetes` Service endpoints (a 127.0.0.1 advertise address is rejected
    by the reconciler, forever). On a real node's address, the default reconciler, so pods reach
    the API server through the Service, and its client certificate to the kubelet, which it
    dials by the node's InternalIP (its name does not resolve here) for logs and exec."""
    if state.address == LOOPBACK:
        return ["--endpoint-reconciler-type=none"]
    return [
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki.path('admin.crt')}",
        f"--kubelet-client-key={pki.path('admin.key')}",
    ]


def _component_args(state: ClusterState) -> list[str]:
    """What the controller-manager and the scheduler share: the admin kubeconfig for all three
    of their clients, no serving port, one instance (no leader election)."""
    kc = state.kubeconfig
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--profiling=false",
    ]


def controller_manager_args(state: ClusterState, pki: Pki) -> list[str]:
    return [
        *_component_args(state),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.path('sa.key')}",
        f"--root-ca-file={pki.ca}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
    ]


def scheduler_args(state: ClusterState) -> list[str]:
    return _component_args(state)


def admin_ssl_context(pki: Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))
    return ctx


def wait_ready(state: ClusterState, pki: Pki, timeout: float = READY_TIMEOUT_S) -> None:
    """Polls `/readyz` until it answers ok; raises with the log to read when it never does."""
    ctx = admin_ssl_context(pki)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{state.server}/readyz", context=ctx, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ClusterError(
        f"kube-apiserver not ready after {timeout:.0f} s ({last}); "
        f"see {Path(state.root) / 'logs' / 'kube-apiserver.log'}"
    )


def up(root: Path, bin_dir: Path | None = None, address: str = LOOPBACK) -> ClusterState:
    """Starts a fresh control plane under `root` (any previous one there is stopped first),
    its API server on `address` (loopback, or a real node's address: e2e/cluster/node.py)."""
    down(root)
    bin_dir = bin_dir or build_binaries()
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("etcd", "pki", "logs"):
        subprocess.run(["rm", "-rf", str(root / stale)], check=True)
    pki = make_pki(root / "pki", extra_ips=() if address == LOOPBACK else (address,))
    state = ClusterState(
        root=str(root),
        bin_dir=str(bin_dir),
        kubeconfig=str(root / "kubeconfig"),
        apiserver_port=free_port(),
        etcd_port=free_port(),
        address=address,
    )
    write_kubeconfig(Path(state.kubeconfig), state.server, pki)
    state.save()
    k8s, logs = str(bin_dir / "loom-k8s"), root / "logs"
    etcd_args = ["etcd", f"--data-dir={root / 'etcd'}"]
    etcd_args += [f"--listen-client-url=http://127.0.0.1:{state.etcd_port}"]
    etcd_args += [f"--listen-peer-url=http://127.0.0.1:{free_port()}"]
    state.add(processes.start("etcd", [k8s, *etcd_args], logs))
    api = [k8s, "kube-apiserver", *apiserver_args(state, pki)]
    state.add(processes.start("kube-apiserver", api, logs))
    try:
        wait_ready(state, pki)
    except ClusterError:
        down(root)
        raise
    cm = [k8s, "kube-controller-manager", *controller_manager_args(state, pki)]
    state.add(processes.start("kube-controller-manager", cm, logs))
    state.add(
        processes.start("kube-scheduler", [k8s, "kube-scheduler", *scheduler_args(state)], logs)
    )
    return state


# Stop order: what uses the API first, then the API server, then etcd (the reverse is ~13 s).
_STOP_ORDER = (
    "node-agent",
    "kwok",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)


def down(root: Path) -> None:
    """Stops everything `up` (and `attach`) recorded under `root`; a no-op when nothing runs."""
    state = ClusterState.load(root)
    if state is None:
        return
    children = state.child_handles()
    rank = {name: i for i, name in enumerate(_STOP_ORDER)}
    for child in sorted(children, key=lambda c: rank.get(c.name.split(":")[0], -1)):
        processes.stop(child, timeout=30.0 if child.name.startswith("node-agent") else 15.0)
    processes.stop_marked(POD_MARKER, str((root / "node-agent").resolve()))
    (root / "state.json").unlink(missing_ok=True)


def attach(
    root: Path, name: str, argv: list[str], env: dict[str, str] | None = None
) -> processes.Child:
    """Starts another process that belongs to the cluster (node agent, kwok) and records it."""
    state = ClusterState.load(root)
    if state is None:
        raise ClusterError(f"no cluster is running under {root}; run `make e2e-cluster` first")
    child = processes.start(name, argv, root / "logs", env=env)
    state.add(child)
    return child
