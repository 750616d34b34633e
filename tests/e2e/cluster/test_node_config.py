"""The real node's configuration: the settings a kubelet, kube-proxy and containerd need on these
machines (cgroup v1, no negative OOM scores, Docker's FORWARD policy) and the NetworkPolicy
enforcement's command line, rendered from one layout."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from e2e.cluster.node_config import (
    BRIDGE,
    NETPOL_QUEUE,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    NodeLayout,
    cni_conflist,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    network_policies_args,
)

LAYOUT = NodeLayout(Path("/r/node"), Path("/c/bin"), Path("/c/cni"), Path("/r/kubeconfig"),
                    Path("/r/pki/ca.crt"), 41000, Path("/c/containerd-root"))  # fmt: skip


def test_containerd_keeps_its_own_socket_and_clamps_oom_scores() -> None:
    config = tomllib.loads(containerd_config(LAYOUT))
    assert config["version"] == 3 and config["imports"] == []
    assert config["root"] == "/c/containerd-root"  # images kept across clusters
    assert config["grpc"]["address"] == str(LAYOUT.containerd_socket)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    assert runtime["cni"] == {"bin_dirs": ["/c/cni"], "conf_dir": str(LAYOUT.cni_conf_dir)}
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == PAUSE_IMAGE
    assert config["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True


def test_the_pod_network_is_the_harness_bridge_with_the_firewall_plugin() -> None:
    conflist = json.loads(cni_conflist(LAYOUT))
    bridge, portmap, firewall = conflist["plugins"]
    assert bridge["bridge"] == BRIDGE and bridge["isGateway"] and bridge["hairpinMode"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR, "gateway": NODE_IP}]]
    assert bridge["ipam"]["dataDir"].startswith("/r/node/")  # not /var/lib/cni
    assert portmap["type"] == "portmap" and firewall["type"] == "firewall"


def test_the_kubelet_runs_on_cgroup_v1_without_touching_its_oom_score() -> None:
    config = json.loads(kubelet_config(LAYOUT))
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["oomScoreAdj"] == 0 and config["failSwapOn"] is False
    assert config["address"] == NODE_IP and config["port"] == 41000
    assert config["readOnlyPort"] == 0 and config["authentication"]["anonymous"]["enabled"] is False
    assert config["containerRuntimeEndpoint"] == f"unix://{LAYOUT.containerd_socket}"
    assert config["podLogsDir"].startswith("/r/node/")


def test_kube_proxy_leaves_conntrack_alone() -> None:
    config = json.loads(kube_proxy_config(LAYOUT, 41001, 41002))
    assert config["mode"] == "iptables" and config["clusterCIDR"] == POD_CIDR
    assert config["oomScoreAdj"] == 0 and config["conntrack"]["maxPerCore"] == 0
    timeouts = {k: v for k, v in config["conntrack"].items() if k.endswith("Timeout")}
    assert set(timeouts.values()) == {"0s"}


def test_network_policy_enforcement_runs_as_this_node_with_the_admin_kubeconfig() -> None:
    argv = network_policies_args(LAYOUT, Path("/c/netpol/loom-netpol"), 41003)
    assert argv[0] == "/c/netpol/loom-netpol"
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["kubeconfig"] == "/r/kubeconfig"  # no in-cluster ServiceAccount on the host
    assert flags["hostname-override"] == NODE_NAME  # only this node's pods are enforced
    assert flags["nfqueue-id"] == str(NETPOL_QUEUE)
    assert flags["metrics-bind-address"] == "127.0.0.1:41003"
    assert flags["netfilter-bug-1766-fix"] == "false"
