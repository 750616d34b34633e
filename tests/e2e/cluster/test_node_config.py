"""The real node's configuration: the settings a kubelet, kube-proxy and containerd need on these
machines (cgroup v1, no negative OOM scores, Docker's FORWARD policy) and the NetworkPolicy
enforcement's command line, rendered from one layout."""

from __future__ import annotations

import json
import re
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
    corefile,
    corefile_path,
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


def server_blocks(text: str) -> dict[str, list[str]]:
    """A Corefile's server blocks: each key's directives, one stripped line each (nested blocks'
    lines included), the closing braces left out."""
    blocks: dict[str, list[str]] = {}
    key, depth = "", 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if depth == 0:
            assert line.endswith("{"), f"a server block opens with its keys: {line!r}"
            key = line.removesuffix("{").strip()
            blocks[key] = []
        elif line != "}":
            blocks[key].append(line)
        depth += line.count("{") - line.count("}")
    assert depth == 0, "unbalanced braces"
    return blocks


def test_coredns_serves_the_cluster_domain_from_the_api_server_on_the_node_address() -> None:
    blocks = server_blocks(corefile(LAYOUT, 41005))
    cluster = blocks["cluster.local:53"]
    assert f"bind {NODE_IP}" in cluster  # the bridge's gateway: every pod reaches it
    assert "kubernetes cluster.local {" in cluster
    assert "kubeconfig /r/kubeconfig" in cluster  # a host process has no ServiceAccount files
    assert "ready 127.0.0.1:41005" in cluster  # up() waits on it: synced with the API server


def test_coredns_answers_nxdomain_for_any_other_name_and_forwards_nothing() -> None:
    text = corefile(LAYOUT, 41005)
    other = server_blocks(text)[".:53"]
    assert f"bind {NODE_IP}" in other
    assert other[other.index("template ANY ANY {") + 1] == "rcode NXDOMAIN"
    assert "forward" not in text  # nothing outside this machine is reachable from a pod


def test_the_corefile_uses_only_plugins_the_node_s_coredns_is_built_with() -> None:
    """build_coredns.sh builds e2e/cluster/coredns, which registers a few plugins: a directive
    the Corefile adds without one there stops CoreDNS at start ("Unknown directive")."""
    main_go = (Path(__file__).parents[3] / "e2e/cluster/coredns/main.go").read_text()
    listed = re.search(r"dnsserver\.Directives = \[\]string\{([^}]*)\}", main_go)
    assert listed is not None
    built = set(re.findall(r'"([a-z_0-9]+)"', listed.group(1)))
    for plugin in built:
        assert f'"github.com/coredns/coredns/plugin/{plugin}"' in main_go
    used = {
        line.split()[0]
        for line in corefile(LAYOUT, 41005).splitlines()
        if line.startswith("    ") and not line.startswith("        ") and line.strip() != "}"
    }
    assert used == built


def test_the_kubelet_gives_pods_coredns_and_the_cluster_domain() -> None:
    config = json.loads(kubelet_config(LAYOUT))
    assert config["clusterDNS"] == [NODE_IP]
    assert config["clusterDomain"] == "cluster.local"
    assert config["resolvConf"] == ""  # no host nameserver that pods could not reach


def test_the_corefile_lives_under_the_node_root_where_down_finds_its_coredns() -> None:
    assert LAYOUT.corefile == corefile_path(LAYOUT.root) == Path("/r/node/coredns/Corefile")


def test_network_policy_enforcement_runs_as_this_node_with_the_admin_kubeconfig() -> None:
    argv = network_policies_args(LAYOUT, Path("/c/netpol/loom-netpol"), 41003)
    assert argv[0] == "/c/netpol/loom-netpol"
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["kubeconfig"] == "/r/kubeconfig"  # no in-cluster ServiceAccount on the host
    assert flags["hostname-override"] == NODE_NAME  # only this node's pods are enforced
    assert flags["nfqueue-id"] == str(NETPOL_QUEUE)
    assert flags["metrics-bind-address"] == "127.0.0.1:41003"
    assert flags["netfilter-bug-1766-fix"] == "false"
