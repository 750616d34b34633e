"""The e2e cluster's real node: containerd, the CNI bridge, the kubelet, kube-proxy and the
NetworkPolicy enforcement (loom-netpol) on this host.

Owns starting them beside the control plane (under `<root>/node`), loading Loom's images into
containerd, and a `down` that leaves no process, mount, cgroup, link, iptables chain, nftables
table, bound NFQUEUE, changed sysctl or foreign path behind; never builds binaries (build_node.sh
and build_netpol.sh do) or images (make images).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from e2e.cluster import cluster_dns, control_plane, host_state, processes
from e2e.cluster.control_plane import ClusterError, ClusterState, free_port
from e2e.cluster.node_config import (
    BRIDGE,
    NETPOL_QUEUE,
    NETPOL_TABLE,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    NodeLayout,
    cni_conflist,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    network_policies_args,
)

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
NODE_PROCESSES = ("network-policies", "kube-proxy", "kubelet", "containerd")  # stop order
READY_TIMEOUT_S = 30.0


def _build(script: str) -> Path:
    """Runs one of the node's build scripts (cached, progress on stderr); returns its cache."""
    out = subprocess.run(["bash", str(HERE / script)], check=False, stdout=subprocess.PIPE,
                         text=True)  # fmt: skip
    if out.returncode != 0:
        raise ClusterError(f"e2e/cluster/{script} failed (exit {out.returncode})")
    return Path(out.stdout.strip().splitlines()[-1])


def build_binaries() -> tuple[Path, Path, Path]:
    """The binaries' folder, the CNI plugins' folder and loom-netpol."""
    cache = _build("build_node.sh")
    return cache / "bin", cache / "cni", _build("build_netpol.sh") / "bin" / "loom-netpol"


def images_root() -> Path:
    """containerd's root: one per machine (one node runs at a time), so Loom's images (~7 GB)
    are loaded once, not per cluster."""
    cache = Path(os.environ.get("LOOM_E2E_CACHE", Path.home() / ".cache" / "loom" / "e2e"))
    return cache / "containerd-root"


def layout_of(root: Path, kubelet_port: int = 0) -> NodeLayout:
    bin_dir, cni = (Path(p) for p in json.loads((root / "node" / "bins.json").read_text())[:2])
    state = ClusterState.load(root)
    assert state is not None
    return NodeLayout(root / "node", bin_dir, cni, Path(state.kubeconfig),
                      Path(state.root) / "pki" / "ca.crt", kubelet_port, images_root())  # fmt: skip


def _env(layout: NodeLayout) -> dict[str, str]:
    """The node's programs find the harness's binaries first (never Debian's containerd 1.6
    shim), then the system's runc, iptables and mount."""
    path = f"{layout.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"
    return dict(os.environ, PATH=f"{path}{os.pathsep}/usr/sbin:/sbin")


def _write(path: Path, text: str) -> None:
    """Writes by rename, so a watcher (containerd's CNI loader) never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _run(argv: list[str], layout: NodeLayout, check: bool = True) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, env=_env(layout), timeout=600)
    if check and out.returncode != 0:
        raise ClusterError(f"{' '.join(argv[:4])} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


def _wait(what: str, probe: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.2)
    raise ClusterError(f"{what} not up after {timeout:.0f} s; see {log}")


def prepare_host(root: Path) -> None:
    """Before the API server binds the node's address: record the host, make the pod bridge."""
    node = root / "node"
    node.mkdir(parents=True, exist_ok=True)
    if _bridge_exists() and _live_node_elsewhere():
        raise ClusterError(f"another e2e node runs on this machine (bridge {BRIDGE}); "
                           "stop it first (make e2e-down)")  # fmt: skip
    scrub_network()
    if host_state.HostBefore.load(node / "host-before.json") is None:
        host_state.record().save(node / "host-before.json")
    subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE], check=True)
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)


def up(root: Path, images: list[str]) -> NodeLayout:
    """Starts containerd, loads `images` (from the Docker engine) and the pause image, then
    CoreDNS, the kubelet, kube-proxy and loom-netpol, and waits until loom-netpol enforces (its
    nftables table in place, its queue bound); the caller waits for the node to be Ready
    (providers.wait_usable)."""
    bin_dir, cni, netpol = build_binaries()
    (root / "node" / "bins.json").write_text(json.dumps([str(bin_dir), str(cni), str(netpol)]))
    layout = layout_of(root, kubelet_port=free_port())
    state = ClusterState.load(root)
    assert state is not None
    logs = root / "logs"
    _write(layout.containerd_config, containerd_config(layout))
    argv = [str(bin_dir / "containerd"), "--config", str(layout.containerd_config)]
    state.add(processes.start("containerd", argv, logs, env=_env(layout)))
    _wait("containerd", layout.containerd_socket.exists, READY_TIMEOUT_S, logs / "containerd.log")
    load_images(layout, images)
    cluster_dns.start(layout, state, cluster_dns.build(), logs)  # before any pod asks it
    _write(layout.cni_conf_dir / "10-loom.conflist", cni_conflist(layout))
    _write(layout.kubelet_config, kubelet_config(layout))
    kubelet = [str(bin_dir / "loom-node"), "kubelet", f"--config={layout.kubelet_config}",
               f"--kubeconfig={layout.kubeconfig}", f"--root-dir={layout.kubelet_dir}",
               f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", "--v=1"]  # fmt: skip
    state.add(processes.start("kubelet", kubelet, logs, env=_env(layout)))
    _write(layout.kube_proxy_config, kube_proxy_config(layout, free_port(), free_port()))
    proxy = [str(bin_dir / "loom-node"), "kube-proxy", f"--config={layout.kube_proxy_config}"]
    state.add(processes.start("kube-proxy", proxy, logs, env=_env(layout)))
    enforce = network_policies_args(layout, netpol, free_port())
    state.add(processes.start("network-policies", enforce, logs, env=_env(layout)))
    # The table first (a kernel without the queue rule it needs refuses the whole table), then
    # the queue it sends connections' first packets to.
    _wait("NetworkPolicy enforcement (its nftables table and NFQUEUE)",
          lambda: NETPOL_TABLE in _tables() and NETPOL_QUEUE in _queues(),
          READY_TIMEOUT_S, logs / "network-policies.log")  # fmt: skip
    return layout


def load_images(layout: NodeLayout, images: list[str]) -> None:
    """Imports each Docker image into containerd's `k8s.io` namespace (no registry), skipping
    those whose image id containerd already holds; builds the pause image first."""
    _ensure_pause_image(layout)
    ctr = [str(layout.bin_dir / "ctr"), "--address", str(layout.containerd_socket), "-n", "k8s.io"]
    record = layout.images_root / "loom-imported.json"
    imported = json.loads(record.read_text()) if record.exists() else {}
    held = set(_run([*ctr, "images", "ls", "-q"], layout).split())
    keep = {PAUSE_IMAGE, *images}
    for image in [PAUSE_IMAGE, *images]:
        image_id = _run(["docker", "image", "inspect", "-f", "{{.Id}}", image], layout).strip()
        keep.add(image_id)  # the CRI refers to an image by its id too
        if imported.get(image) == image_id and image in held:
            continue
        earlier = [n for n in (image, imported.get(image)) if n is not None and n in held]
        if earlier:  # the earlier version goes first: the disk need not hold both at once
            _run([*ctr, "images", "rm", *earlier], layout, check=False)
        start = time.monotonic()
        _import_image(ctr, image, layout)
        imported[image] = image_id
        record.write_text(json.dumps(imported, indent=2))
        logger.info("loaded %s into containerd in %.0f s", image, time.monotonic() - start)
    # Earlier versions of these images (a rebuild moved the name): containerd's garbage
    # collector frees their layers once no name or id refers to them.
    stale = set(_run([*ctr, "images", "ls", "-q"], layout).split()) - keep
    if stale:
        _run([*ctr, "images", "rm", *sorted(stale)], layout, check=False)


def _import_image(ctr: list[str], image: str, layout: NodeLayout) -> None:
    """`docker save IMAGE | ctr images import -`; either side's error, as each printed it."""
    with tempfile.TemporaryFile() as save_err:
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=save_err)
        assert save.stdout is not None
        out = subprocess.run([*ctr, "images", "import", "-"], stdin=save.stdout,
                             capture_output=True, text=True, env=_env(layout))  # fmt: skip
        save.stdout.close()  # ctr stopped reading: docker save ends (SIGPIPE) rather than waits
        save.wait()
        save_err.seek(0)
        saved = save_err.read().decode(errors="replace")
    if out.returncode != 0 or save.returncode != 0:
        free = shutil.disk_usage(layout.images_root).free / 2**30
        raise ClusterError(
            f"loading {image} into containerd failed ({free:.1f} GiB free under "
            f"{layout.images_root}): ctr import: {out.stderr[-1000:].strip() or out.returncode}; "
            f"docker save: {saved[-1000:].strip() or save.returncode}"
        )


def _ensure_pause_image(layout: NodeLayout) -> None:
    """The pause image: the static program build_node.sh made, FROM scratch."""
    if subprocess.run(["docker", "image", "inspect", PAUSE_IMAGE], capture_output=True).returncode:
        context = layout.root / "pause-image"
        context.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", str(layout.bin_dir / "pause"), str(context / "pause")], check=True)
        dockerfile = 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n'
        (context / "Dockerfile").write_text(dockerfile)
        _run(["docker", "build", "-q", "-t", PAUSE_IMAGE, str(context)], layout)


def down(root: Path) -> None:
    """Stops the node (if one was started under `root`) and puts the host back as it was."""
    state = ClusterState.load(root)
    node = root / "node"
    before = host_state.HostBefore.load(node / "host-before.json")
    if state is None and before is None:
        return
    children = {c.name: c for c in state.child_handles()} if state else {}
    if "network-policies" in children:  # on SIGTERM it deletes its nftables table
        processes.stop(children["network-policies"])
    if "kube-proxy" in children:
        processes.stop(children["kube-proxy"])
    cluster_dns.stop(node, children)
    if "kubelet" in children:
        processes.stop(children["kubelet"], timeout=30.0)
    if (node / "bins.json").exists() and state is not None:
        layout = layout_of(root)
        if "containerd" in children and children["containerd"].alive():
            _remove_containers(layout)
        if "containerd" in children:
            processes.stop(children["containerd"])
        _kill_pods_and_shims(layout)
        _run([str(layout.bin_dir / "loom-node"), "kube-proxy", "--cleanup"], layout, check=False)
    _unmount_below([node, images_root(), Path("/var/lib/kubelet")])
    scrub_network()
    if before is not None:
        restored = host_state.restore_sysctls(before)
        removed = host_state.remove_made_paths(before) + host_state.remove_cgroups(before)
        logger.info("host restored: sysctls %s; removed %s", restored, removed)
        (node / "host-before.json").unlink()
    for stale in ("containerd/state", "kubelet", "pod-logs", "cni/ipam"):
        subprocess.run(["rm", "-rf", "--one-file-system", str(node / stale)], check=False)


def _remove_containers(layout: NodeLayout) -> None:
    ctr = [str(layout.bin_dir / "ctr"), "--address", str(layout.containerd_socket), "-n", "k8s.io"]
    for task in _run([*ctr, "tasks", "ls", "-q"], layout, check=False).split():
        _run([*ctr, "tasks", "kill", "-s", "SIGKILL", "--all", task], layout, check=False)
    time.sleep(0.5)
    for task in _run([*ctr, "tasks", "ls", "-q"], layout, check=False).split():
        _run([*ctr, "tasks", "delete", "-f", task], layout, check=False)
    for container in _run([*ctr, "containers", "ls", "-q"], layout, check=False).split():
        _run([*ctr, "containers", "delete", container], layout, check=False)


def _kill_pods_and_shims(layout: NodeLayout) -> None:
    """SIGKILLs whatever still runs in the node's cgroups, and the shims of its containerd."""
    socket = str(layout.containerd_socket)
    cgroups = host_state.cgroup_dirs()
    _kill_until_gone(
        lambda: host_state.pids_in(cgroups) | set(processes.pids_with_argument(socket))
    )


def _kill_until_gone(find: Callable[[], set[int]]) -> None:
    """SIGKILLs what `find` returns until it returns nothing (5 s at most)."""
    for _ in range(50):
        pids = find()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _unmount_below(roots: list[Path]) -> None:
    mounts = Path("/proc/self/mounts").read_text()
    for point in host_state.mounts_below(mounts, roots):
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True)


def scrub_network() -> None:
    """Removes the node's iptables chains (kube-proxy's, the kubelet's, the CNI plugins'), the
    NetworkPolicy enforcement's nftables table and its bridge (the pods' veths went with their
    namespaces); Docker's rules are left alone. An enforcement a killed agent left running is
    stopped first: its queue bound with no table is harmless, a table with no queue drops pods'
    traffic."""
    flag = f"--hostname-override={NODE_NAME}"
    _kill_until_gone(lambda: set(processes.pids_with_argument(flag, program="loom-netpol")))
    for tool in ("iptables", "ip6tables"):
        save = subprocess.run([f"{tool}-save"], capture_output=True, text=True)
        for args in host_state.chain_cleanup(save.stdout):
            subprocess.run([tool, "-w", *args], capture_output=True)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    for args in host_state.table_cleanup(tables.stdout, (NETPOL_TABLE,)):
        subprocess.run(["nft", *args], capture_output=True)
    if NETPOL_QUEUE in _queues():
        logger.warning("NFQUEUE %d is still bound after the node stopped", NETPOL_QUEUE)
    if _bridge_exists():
        subprocess.run(["ip", "link", "del", BRIDGE], check=False)
    results = Path("/var/lib/cni/results")
    for cached in results.glob("loom-e2e-*") if results.exists() else ():
        cached.unlink()


def _tables() -> set[tuple[str, str]]:
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    return host_state.nft_tables(out.stdout)


def _queues() -> set[int]:
    try:
        return host_state.queues_bound(Path("/proc/net/netfilter/nfnetlink_queue").read_text())
    except OSError:  # nfnetlink_queue not loaded: nothing is bound
        return set()


def _bridge_exists() -> bool:
    return subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0


def _live_node_elsewhere() -> bool:
    return bool(processes.pids_with_argument("kubelet", program="loom-node"))


def stop_node(root: Path) -> None:
    """`make e2e-down`: the node first (it uses the API server), then the control plane."""
    down(root)
    control_plane.down(root)
