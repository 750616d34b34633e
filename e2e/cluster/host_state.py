"""What a real kubelet, kube-proxy, containerd and CNI change on the host, and how to put it back.

Owns the record of the host before a node starts (sysctls, paths outside the node's root,
cgroups) and the pure plans that undo the rest (iptables chains, nftables tables, mounts, queue
bindings); never touches what the node did not make: Docker's chains and tables, mounts outside
the roots it is given, paths that existed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

# Sysctls the kubelet (protectKernelDefaults off), kube-proxy and the CNI bridge may set.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
)
# Paths a kubelet, containerd's CRI or a CNI plugin writes whatever their configuration says.
FOREIGN_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/var/run/netns",
    "/etc/kubernetes",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
NODE_CGROUP = "kubepods"
# Chains of kube-proxy, the kubelet and the CNI plugins; nothing else on this machine uses them.
OUR_CHAINS = ("KUBE-", "CNI-")


@dataclass
class HostBefore:
    """The host as it was before the node started, saved beside the node's state."""

    sysctls: dict[str, str]
    existing_paths: list[str]
    existing_cgroups: list[str]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> HostBefore | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def cgroup_dirs() -> list[Path]:
    """The node's cgroup in every mounted v1 hierarchy (a v2 host has one)."""
    hierarchies = [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        hierarchies = [CGROUP_ROOT]
    return [h / NODE_CGROUP for h in hierarchies]


def record() -> HostBefore:
    sysctls = {}
    for name in SYSCTLS:
        try:
            sysctls[name] = _sysctl_path(name).read_text().strip()
        except OSError:
            continue
    existing = [p for p in FOREIGN_PATHS if os.path.lexists(p)]
    cgroups = [str(p) for p in cgroup_dirs() if p.exists()]
    return HostBefore(sysctls, existing, cgroups)


def restore_sysctls(before: HostBefore) -> list[str]:
    """Writes back every recorded sysctl that changed; returns what was restored."""
    restored = []
    for name, value in before.sysctls.items():
        path = _sysctl_path(name)
        try:
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
                restored.append(f"{name}={value}")
        except OSError:
            continue
    return restored


def remove_made_paths(before: HostBefore) -> list[str]:
    """Removes the foreign paths the node created (after its mounts are gone)."""
    removed = []
    for path in FOREIGN_PATHS:
        if path not in before.existing_paths and os.path.lexists(path):
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)
            removed.append(path)
    return removed


def remove_cgroups(before: HostBefore) -> list[str]:
    """rmdir's the node's cgroups bottom-up (after every process in them is gone)."""
    removed = []
    for top in cgroup_dirs():
        if str(top) in before.existing_cgroups or not top.exists():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                continue
        removed.append(str(top))
    return removed


def pids_in(cgroups: list[Path]) -> set[int]:
    """Every process in these cgroups and below."""
    pids: set[int] = set()
    for top in cgroups:
        for procs in top.rglob("cgroup.procs") if top.exists() else ():
            try:
                pids |= {int(p) for p in procs.read_text().split()}
            except OSError:
                continue
    return pids


def mounts_below(mounts_text: str, roots: list[Path]) -> list[str]:
    """Mount points under `roots` (or a root itself) from /proc/self/mounts text, deepest first:
    the order to unmount them in. Octal escapes (a space is \\040) are decoded."""
    prefixes = [str(r).rstrip("/") for r in roots]
    found = []
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        point = fields[1].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def chain_cleanup(save_text: str, prefixes: tuple[str, ...] = OUR_CHAINS) -> list[list[str]]:
    """From `iptables-save` text, the `iptables` arguments that remove our chains: first every rule
    elsewhere that jumps to one, then each chain flushed, then each deleted."""
    table, steps, flushes, deletes = "", [], [], []
    for line in save_text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            chain = line[1:].split()[0]
            if chain.startswith(prefixes):
                flushes.append(["-t", table, "-F", chain])
                deletes.append(["-t", table, "-X", chain])
        elif line.startswith("-A "):
            parts = shlex.split(line)
            chain = parts[1]
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if not chain.startswith(prefixes) and target.startswith(prefixes):
                steps.append(["-t", table, "-D", *parts[1:]])
    return steps + flushes + deletes


def nft_tables(list_tables_text: str) -> set[tuple[str, str]]:
    """(family, name) of each table in `nft list tables` text."""
    rows = [line.split() for line in list_tables_text.splitlines()]
    return {(row[1], row[2]) for row in rows if len(row) == 3 and row[0] == "table"}


def table_cleanup(list_tables_text: str, ours: tuple[tuple[str, str], ...]) -> list[list[str]]:
    """From `nft list tables` text, the `nft` arguments that delete each of `ours` (family, name)
    that exists; every other table (iptables-nft's, Docker's) is left alone."""
    present = nft_tables(list_tables_text)
    return [["delete", "table", family, name] for family, name in ours if (family, name) in present]


def queues_bound(nfnetlink_queue_text: str) -> set[int]:
    """The NFQUEUE numbers a process listens on, from /proc/net/netfilter/nfnetlink_queue (one
    line per bound queue, its number first). The kernel drops a binding when its socket closes."""
    return {int(line.split()[0]) for line in nfnetlink_queue_text.splitlines() if line.strip()}
